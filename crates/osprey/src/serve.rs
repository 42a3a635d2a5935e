//! `osprey serve`: load the model in the background, answer HTTP at once.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use osprey_engine::speculative::SpeculationConfig;
use osprey_engine::{
    Codec, Engine, EngineConfig, KdaConfig, Prompter, SchedulerConfig, SchedulingPolicy,
    SharedConfig, TierConfig,
};
use osprey_gateway::{HttpConfig, Services, Wiring};
use osprey_limits::RateLimiter;

use crate::models::{LocalModel, local_models};
use osprey_router::select::Policy;
use osprey_router::tiers::{Tier, Tiers};
use osprey_router::upstream::Upstream;
use osprey_router::workers::WorkerPool;
use osprey_services::auth::Authenticator;
use osprey_services::config::{
    AdmissionConfig, DefaultLimits, EdgeConfig, LocalModelConfig, Size, UpstreamConfig,
};
use osprey_services::edge::Edge;
use osprey_store::SharedRedis;
use osprey_store::Store;

use crate::cli::{EngineArgs, ServeArgs};
use crate::config::ConfigFile;

pub fn run(args: ServeArgs, file: ConfigFile) -> anyhow::Result<()> {
    if args.no_metrics {
        osprey_services::metrics::disable();
    }
    // Fetched before anything listens, with progress on the terminal.
    let local: Vec<(LocalModel, PathBuf)> = match args.no_engine {
        true => Vec::new(),
        false => (local_models(&args.engine)?.into_iter())
            .map(|m| m.path().map(|p| (m, p)))
            .collect::<anyhow::Result<_>>()?,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(serve(args, file, local))
}

/// The edge's configuration from the flags and the file's tenants.
pub fn edge_config(args: &ServeArgs, file: &ConfigFile) -> EdgeConfig {
    EdgeConfig {
        tenants: file.tenants.clone(),
        limits: DefaultLimits {
            rpm: args.default_rpm.max(1),
            tpm: args.default_tpm.max(1),
            max_concurrent: args.default_max_concurrent.max(1),
        },
        admission: AdmissionConfig {
            max_in_flight: args.max_in_flight.max(1),
            max_queued_tokens: args.max_queued_tokens.max(1),
            batch_share: args.batch_share,
        },
        admin_key: args.admin_key.clone().filter(|k| !k.is_empty()),
        no_request_log: args.no_request_log,
    }
}

/// `--upstream NAME=URL` flags as upstream configs.
pub fn upstreams_from_flags(flags: &[String]) -> anyhow::Result<Vec<(String, UpstreamConfig)>> {
    flags
        .iter()
        .map(|f| {
            let (name, url) = f
                .split_once('=')
                .filter(|(n, u)| !n.is_empty() && !u.is_empty())
                .with_context(|| format!("--upstream `{f}`: expected NAME=URL"))?;
            let config = UpstreamConfig {
                url: url.to_owned(),
                api_key_env: None,
                model: None,
                timeout_secs: None,
                max_retries: None,
                fallbacks: None,
            };
            Ok((name.to_owned(), config))
        })
        .collect()
}

/// The tiers of `"model": "auto"` from the file's `[[tiers]]`, each naming a model served here
/// (an upstream, or `local`: the engine's or the workers' model); `None` without tiers.
pub fn tiers(
    file: &ConfigFile,
    threshold: f64,
    answer_floor: Option<f64>,
    upstreams: &[Upstream],
    local: &[String],
) -> anyhow::Result<Option<Tiers>> {
    if file.tiers.is_empty() {
        return Ok(None);
    }
    let mut tiers = Vec::new();
    for t in &file.tiers {
        let served = local.contains(&t.model) || upstreams.iter().any(|u| u.name == t.model);
        anyhow::ensure!(
            served,
            "tier `{}`: model `{}` is not served here",
            t.name,
            t.model
        );
        tiers.push(Tier {
            name: t.name.clone(),
            model: t.model.clone(),
        });
    }
    let tiers = Tiers::new(tiers, threshold).map_err(|e| anyhow::anyhow!("[[tiers]]: {e}"))?;
    match answer_floor {
        Some(floor) => tiers
            .with_answer_floor(floor)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("--auto-min-logprob: {e}")),
        None => Ok(Some(tiers)),
    }
}

/// Checks that every tenant's `default_model` is served here (an upstream, `local`, or `auto`
/// when there are tiers).
pub fn check_default_models(
    file: &ConfigFile,
    upstreams: &[Upstream],
    local: &[String],
) -> anyhow::Result<()> {
    for (tenant, t) in &file.tenants {
        let Some(model) = &t.default_model else {
            continue;
        };
        let served = local.contains(model)
            || upstreams.iter().any(|u| &u.name == model)
            || (model == osprey_router::auto::AUTO && !file.tiers.is_empty());
        anyhow::ensure!(
            served,
            "tenant `{tenant}`: default_model `{model}` is not served here{}",
            if model == osprey_router::auto::AUTO {
                " (auto needs [[tiers]])"
            } else {
                ""
            }
        );
    }
    Ok(())
}

/// The safety policies of the file's `[policies.NAME]`; every tenant's `policy` must name one
/// (or `standard`).
pub fn policies(file: &ConfigFile) -> anyhow::Result<osprey_services::safety::Policies> {
    for (name, p) in &file.policies {
        p.validate()
            .map_err(|e| anyhow::anyhow!("[policies.{name}]: {e}"))?;
    }
    let policies = osprey_services::safety::Policies::new(file.policies.clone());
    for (tenant, t) in &file.tenants {
        if let Some(p) = &t.policy {
            anyhow::ensure!(
                policies.has(p),
                "tenant `{tenant}`: policy `{p}` is not defined ([policies.{p}])"
            );
        }
    }
    Ok(policies)
}

/// The store URL: `--store`, or the default SQLite file under `$OSPREY_HOME`.
/// `url` with any password in it replaced by `***`, for logs and messages.
pub fn without_password(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        _ => url.to_owned(),
    }
}

pub fn store_url(flag: &Option<String>) -> anyhow::Result<String> {
    Ok(match flag {
        Some(url) => url.clone(),
        None => {
            let home = osprey_models::fetch::osprey_home();
            std::fs::create_dir_all(&home)
                .with_context(|| format!("creating {}", home.display()))?;
            Store::default_url(&home)
        }
    })
}

/// Runs `command` on the store named by `flag` (the default one without it), on a runtime of
/// its own: the body of every CLI command that manages state.
pub fn with_store(
    flag: &Option<String>,
    command: impl AsyncFnOnce(Store) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let url = store_url(flag)?;
        let store = Store::open(&url)
            .await
            .with_context(|| format!("opening the store {url}"))?;
        command(store).await
    })
}

/// The engine's configuration from the command line.
pub fn engine_config(args: &EngineArgs) -> EngineConfig {
    EngineConfig {
        scheduler: SchedulerConfig {
            max_num_batched_tokens: args.max_num_batched_tokens,
            max_num_seqs: args.max_num_seqs,
            policy: SchedulingPolicy::parse(&args.scheduling_policy).unwrap_or_default(),
            starvation_timeout: std::time::Duration::from_secs_f64(
                args.starvation_timeout.max(0.0),
            ),
            batch_prefill_chunk: args.batch_prefill_chunk,
            kda: KdaConfig {
                expert_capacity: args.expert_capacity,
                max_deferrals: args.max_deferrals,
                heat_interval: args.heat_interval,
                ..KdaConfig::default()
            },
            speculation: match args.speculative.0 {
                None => SpeculationConfig::OFF,
                Some(drafter) => SpeculationConfig {
                    drafter,
                    max_draft: args.speculative_max_draft,
                    max_step_rows: args.speculative_step_rows,
                },
            },
        },
        kv_cache_bytes: args
            .kv_cache_memory
            .unwrap_or_else(osprey_engine::default_kv_cache_bytes),
        prefix_caching: !args.no_prefix_caching,
        max_waiting: args.max_waiting,
        threads: args.threads,
        max_model_len: args.max_model_len,
        tiers: TierConfig {
            warm_bytes: args.kv_warm_memory,
            cold: (args.kv_cold_disk > 0).then(|| {
                let dir = (args.kv_cold_dir.clone())
                    .unwrap_or_else(|| osprey_models::osprey_home().join("kv-cold"));
                (dir, args.kv_cold_disk as u64)
            }),
            shared: args.kv_redis.clone().map(|url| SharedConfig {
                url,
                ttl: std::time::Duration::from_secs(args.kv_redis_ttl),
                max_bytes: args.kv_redis_memory,
            }),
            codec: Codec::parse(&args.kv_codec).unwrap_or_default(),
        },
        name: None,
    }
}

/// The names of the models this process's engines serve (none with `--no-engine`).
pub fn local_names(args: &ServeArgs) -> anyhow::Result<Vec<String>> {
    match args.no_engine {
        true => Ok(Vec::new()),
        false => Ok(local_models(&args.engine)?
            .into_iter()
            .map(|m| m.name)
            .collect()),
    }
}

/// One engine's configuration per model of `models`: the flags', with `--kv-cache-memory`
/// shared out. A model whose `[models.NAME]` sets `kv_cache_memory` gets that; the others
/// share the rest evenly, as they share the warm tier's memory and the cold tier's disk.
pub fn engine_configs(
    args: &EngineArgs,
    models: &[LocalModel],
    tables: &BTreeMap<String, LocalModelConfig>,
) -> anyhow::Result<Vec<EngineConfig>> {
    for name in tables.keys() {
        anyhow::ensure!(
            models.iter().any(|m| &m.name == name),
            "[models.{name}] has no `url` and names no model served here (served: {})",
            models
                .iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let set = |m: &LocalModel| -> anyhow::Result<Option<usize>> {
        let size = tables.get(&m.name).and_then(|t| t.kv_cache_memory.clone());
        match size {
            None => Ok(None),
            Some(Size::Bytes(n)) => Ok(Some(n as usize)),
            Some(Size::Text(t)) => crate::cli::parse_bytes(&t)
                .map(Some)
                .map_err(|e| anyhow::anyhow!("[models.{}] kv_cache_memory: {e}", m.name)),
        }
    };
    let sizes: Vec<Option<usize>> = models.iter().map(set).collect::<anyhow::Result<_>>()?;
    let total = (args.kv_cache_memory).unwrap_or_else(osprey_engine::default_kv_cache_bytes);
    let unset = sizes.iter().filter(|s| s.is_none()).count();
    let left = total.saturating_sub(sizes.iter().flatten().sum());
    anyhow::ensure!(
        unset == 0 || left / unset >= 1 << 20,
        "--kv-cache-memory {total} B leaves {left} B for {unset} model(s) once the [models.*] \
         kv_cache_memory are taken: raise it, or set each model's"
    );
    let n = models.len().max(1);
    Ok((models.iter().zip(sizes))
        .map(|(m, size)| {
            let mut config = engine_config(args);
            config.kv_cache_bytes = size.unwrap_or(left / unset.max(1));
            config.tiers.warm_bytes /= n;
            if let Some((_, disk)) = &mut config.tiers.cold {
                *disk /= n as u64;
            }
            config.name = Some(m.name.clone());
            config
        })
        .collect())
}

async fn serve(
    args: ServeArgs,
    file: ConfigFile,
    local: Vec<(LocalModel, PathBuf)>,
) -> anyhow::Result<()> {
    let client = osprey_router::upstream::http_client();
    let mut upstreams = Vec::new();
    let flagged = upstreams_from_flags(&args.upstream)?;
    for (name, config) in file
        .models
        .iter()
        .map(|(n, c)| (n.clone(), c.clone()))
        .chain(flagged)
    {
        upstreams.push(Upstream::new(&name, &config, client.clone()).map_err(anyhow::Error::msg)?);
    }
    let models: Vec<LocalModel> = local.iter().map(|(m, _)| m.clone()).collect();
    let local_names: Vec<String> = models.iter().map(|m| m.name.clone()).collect();
    osprey_router::upstream::check_fallbacks(&upstreams, &local_names)
        .map_err(|(_, why)| anyhow::anyhow!(why))?;
    let tiers = tiers(
        &file,
        args.auto_confidence,
        args.auto_min_logprob,
        &upstreams,
        &local_names,
    )?;
    check_default_models(&file, &upstreams, &local_names)?;
    let configs = engine_configs(&args.engine, &models, &file.local_models)?;
    let policies = policies(&file)?;
    let store_url = store_url(&args.store)?;
    let store = Store::open(&store_url)
        .await
        .with_context(|| format!("opening the store {}", without_password(&store_url)))?;
    let auth = Authenticator::new(store.clone()).await?;
    auth.spawn_refresh_task();
    // One connection to `--redis` serves the rate limits and the response cache.
    let redis = (args.redis.as_deref())
        .map(|url| {
            SharedRedis::open(url).with_context(|| format!("--redis {}", without_password(url)))
        })
        .transpose()?;
    let limiter = match &redis {
        Some(redis) => RateLimiter::with_redis(redis.clone(), args.replicas),
        None => RateLimiter::local(),
    };
    let edge = Edge::new(edge_config(&args, &file), auth.clone(), limiter);
    let (pool, local) = match (args.worker.is_empty(), &local[..]) {
        (true, _) => (None, local),
        (false, []) => anyhow::bail!("--worker serves the model from workers: drop --no-engine"),
        (false, [(model, path)]) => {
            let name = &model.name;
            let policy = Policy::parse(&args.routing_policy).context("--routing-policy")?;
            let prompter = Prompter::load(path)
                .with_context(|| format!("loading the tokenizer of {}", path.display()))?;
            let pool = WorkerPool::new(name, &args.worker, policy, prompter, client.clone())
                .map_err(anyhow::Error::msg)?;
            let pool = Arc::new(pool);
            pool.follow(client.clone());
            tracing::info!(workers = ?args.worker, policy = policy.as_str(), "serving {name} from workers");
            (Some(pool), Vec::new())
        }
        (false, _) => anyhow::bail!("--worker serves one model from workers: give one --model"),
    };
    let state = Services::new(Wiring {
        local: local.iter().map(|(m, _)| m.name.clone()).collect(),
        upstreams,
        pool,
        tiers,
        ttft_slo: (args.ttft_slo)
            .and_then(|s| std::time::Duration::try_from_secs_f64(s).ok())
            .filter(|s| !s.is_zero()),
        policies: Some(policies),
        response_cache: match (redis, args.no_response_cache) {
            (_, true) => None,
            (Some(redis), false) => Some(osprey_services::cache::ResponseCache::redis(redis)),
            (None, false) => Some(osprey_services::cache::ResponseCache::memory()),
        },
        store: Some(store),
        library: osprey_rag::Library::at_home(),
        agents: file.agent.clone(),
        edge,
    });

    let addr = format!("{}:{}", args.host, args.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    for ((model, path), config) in local.into_iter().zip(configs) {
        load_in_background(&state, &model.name, path, config);
    }
    let models: Vec<String> = (state.local_models().map(|m| m.name))
        .chain(state.pool().map(|p| p.name()))
        .map(str::to_owned)
        .chain(state.upstreams().map(|u| format!("{} → {}", u.name, u.url)))
        .collect();
    let access = if auth.is_open() {
        "no API keys exist: serving openly (create one with `osprey keys create`)"
    } else {
        "API keys required"
    };
    let http = HttpConfig {
        max_body_bytes: args.max_body_bytes,
        fault_injection: args.fault_injection,
        tls: args.tls.server_config()?,
    };
    let scheme = if http.tls.is_some() { "https" } else { "http" };
    tracing::info!(%addr, scheme, models = ?models, store = %without_password(&store_url), limits = if args.redis.is_some() { "shared (Redis)" } else { "local" }, "listening; {access}");
    osprey_gateway::serve(listener, state, &http, shutdown_signal()).await?;
    Ok(())
}

/// Loads the model at `path` on a blocking thread; `state` serves it as `name` once loaded
/// (or says why it failed).
pub fn load_in_background(state: &Services, name: &str, path: PathBuf, config: EngineConfig) {
    let (loading, name) = (state.clone(), name.to_owned());
    tokio::task::spawn_blocking(move || match Engine::load(&path, config) {
        Ok(engine) => {
            let info = engine.info();
            tracing::info!(model = %name, max_model_len = info.max_model_len, kv_tokens = info.kv_capacity_tokens, "ready");
            loading.set_loaded(&name, Ok(engine));
        }
        Err(e) => {
            tracing::error!(model = %name, error = %e, path = %path.display(), "the model failed to load");
            loading.set_loaded(&name, Err(e.to_string()));
        }
    });
}

/// Completes on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutting down: finishing in-flight requests");
}

#[cfg(test)]
mod tests {
    use super::without_password;

    #[test]
    fn a_password_in_a_url_never_reaches_a_log() {
        let logged = without_password("postgres://osprey:s3cret@db:5432/osprey");
        assert_eq!(logged, "postgres://osprey:***@db:5432/osprey");
        assert_eq!(without_password("sqlite:///tmp/o.db"), "sqlite:///tmp/o.db");
        assert_eq!(
            without_password("redis://10.0.0.1:6379"),
            "redis://10.0.0.1:6379"
        );
    }
}
