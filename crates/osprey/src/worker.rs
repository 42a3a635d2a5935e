//! `osprey worker`: only an engine, for a gateway's pool (`osprey serve --worker URL`). It
//! serves the OpenAI generation routes without keys or limits (the gateway applies them) and
//! the worker protocol: its load, and its prefix cache as KV events.

use anyhow::Context;
use osprey_gateway::{HttpConfig, Services, Wiring};

use crate::cli::WorkerArgs;
use crate::models::local_models;
use crate::serve::{engine_configs, load_in_background, shutdown_signal};

pub fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let models = local_models(&args.engine)?;
    let [model] = &models[..] else {
        anyhow::bail!("a worker serves one model: give one --model");
    };
    let path = model.path()?;
    let config = engine_configs(&args.engine, &models, &Default::default())?.remove(0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        // The gateway in front screened each request under its tenant's policy.
        let state = Services::new(Wiring {
            policies: None,
            response_cache: None,
            ..Wiring::serving(model.name.clone())
        });
        let http = HttpConfig {
            max_body_bytes: args.max_body_bytes,
            fault_injection: false,
            tls: None,
        };
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        load_in_background(&state, &model.name, path, config);
        tracing::info!(%addr, model = state.model_name(), "worker listening");
        osprey_gateway::serve_worker(listener, state, &http, shutdown_signal()).await?;
        Ok(())
    })
}
