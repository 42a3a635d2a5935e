//! `osprey serve`: load the model in the background, answer HTTP at once.

use std::path::PathBuf;

use anyhow::Context;
use osprey_engine::{Engine, EngineConfig, SchedulerConfig, SchedulingPolicy};
use osprey_gateway::{AppState, HttpConfig};
use osprey_models::DEFAULT_MODEL;

use crate::cli::ServeArgs;

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let (path, default_name) = match &args.model {
        Some(p) => (p.clone(), model_name_from_path(p)),
        None => (
            crate::models::fetch_default()?,
            DEFAULT_MODEL.served_name.to_owned(),
        ),
    };
    let name = args.served_model_name.clone().unwrap_or(default_name);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(serve(args, path, name))
}

/// The engine's configuration from the command line.
pub fn engine_config(args: &ServeArgs) -> EngineConfig {
    EngineConfig {
        scheduler: SchedulerConfig {
            max_num_batched_tokens: args.max_num_batched_tokens,
            max_num_seqs: args.max_num_seqs,
            policy: match args.scheduling_policy.as_str() {
                "fcfs" => SchedulingPolicy::Fcfs,
                _ => SchedulingPolicy::Priority,
            },
            starvation_timeout: std::time::Duration::from_secs_f64(
                args.starvation_timeout.max(0.0),
            ),
            batch_prefill_chunk: args.batch_prefill_chunk,
        },
        kv_cache_bytes: args
            .kv_cache_memory
            .unwrap_or_else(osprey_engine::default_kv_cache_bytes),
        prefix_caching: !args.no_prefix_caching,
        max_waiting: args.max_waiting,
        threads: args.threads,
        max_model_len: args.max_model_len,
    }
}

fn model_name_from_path(path: &std::path::Path) -> String {
    path.file_stem()
        .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
}

async fn serve(args: ServeArgs, path: PathBuf, name: String) -> anyhow::Result<()> {
    let addr = format!("{}:{}", args.host, args.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let state = AppState::new(&name);
    let config = engine_config(&args);
    let loading = state.clone();
    let load_path = path.clone();
    tokio::task::spawn_blocking(move || match Engine::load(&load_path, config) {
        Ok(engine) => {
            tracing::info!(model = %loading.model_name(), max_model_len = engine.info().max_model_len, "ready");
            loading.set_engine(engine);
        }
        Err(e) => {
            tracing::error!(error = %e, path = %load_path.display(), "the model failed to load");
            loading.set_load_error(e.to_string());
        }
    });
    tracing::info!(%addr, model = %name, path = %path.display(), "listening (no API keys configured: serving openly)");
    let http = HttpConfig {
        max_body_bytes: args.max_body_bytes,
    };
    osprey_gateway::serve(listener, state, &http, shutdown_signal()).await?;
    Ok(())
}

async fn shutdown_signal() {
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
