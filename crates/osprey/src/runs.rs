//! `osprey runs`: agent runs through a server's admin API (`--url`, `--admin-key`): list them,
//! show one with its steps, and approve or reject a call waiting for approval, which the
//! server then runs on. The tool-call audit is `osprey runs audit`.

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};

/// `osprey runs`.
#[derive(Args, Debug)]
pub struct RunsArgs {
    /// The server.
    #[arg(
        long,
        env = "OSPREY_URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub url: String,
    /// Its admin key (`osprey serve --admin-key`).
    #[arg(long, env = "OSPREY_ADMIN_KEY", global = true, hide_env_values = true)]
    pub admin_key: Option<String>,
    #[command(subcommand)]
    pub command: RunsCommand,
}

/// The run commands.
#[derive(Subcommand, Debug)]
pub enum RunsCommand {
    /// List runs, newest first.
    List {
        /// Only this tenant's.
        #[arg(long)]
        tenant: Option<String>,
        /// Only in this status (`requires_approval`, `completed`…).
        #[arg(long)]
        status: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// Show a run: its status, output and steps.
    Show {
        /// `resp_…`.
        id: String,
    },
    /// Approve the call a run waits on; the server runs it and goes on.
    Approve {
        /// `resp_…`.
        id: String,
        /// Which request (default: the run's only pending one).
        #[arg(long)]
        request: Option<String>,
        /// Why.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Reject the call a run waits on; the model is told and goes on.
    Reject {
        /// `resp_…`.
        id: String,
        /// Which request (default: the run's only pending one).
        #[arg(long)]
        request: Option<String>,
        /// Why (the model is told).
        #[arg(long)]
        reason: Option<String>,
    },
    /// The tool-call audit, newest first.
    Audit {
        /// Only this tenant's.
        #[arg(long)]
        tenant: Option<String>,
        /// Only this run's.
        #[arg(long)]
        run: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
}

pub fn run(args: RunsArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let client = Admin {
            http: reqwest::Client::new(),
            url: args.url.trim_end_matches('/').to_owned(),
            key: args
                .admin_key
                .context("--admin-key (or OSPREY_ADMIN_KEY) is needed")?,
        };
        match args.command {
            RunsCommand::List {
                tenant,
                status,
                limit,
            } => {
                let mut query = vec![("limit", limit.to_string())];
                query.extend(tenant.map(|t| ("tenant", t)));
                query.extend(status.map(|s| ("status", s)));
                let page = client
                    .send(reqwest::Method::GET, "/admin/runs", &query, None)
                    .await?;
                println!(
                    "{:<34} {:<18} {:<14} {:<12} {:<22} created",
                    "id", "status", "tenant", "user", "model"
                );
                for r in page["data"].as_array().into_iter().flatten() {
                    println!(
                        "{:<34} {:<18} {:<14} {:<12} {:<22} {}",
                        r["id"].as_str().unwrap_or_default(),
                        r["status"].as_str().unwrap_or_default(),
                        r["tenant"].as_str().unwrap_or_default(),
                        r["user"].as_str().unwrap_or_default(),
                        r["model"].as_str().unwrap_or_default(),
                        r["created_at"]
                    );
                }
            }
            RunsCommand::Show { id } => {
                let run = client
                    .send(
                        reqwest::Method::GET,
                        &format!("/admin/runs/{id}"),
                        &[],
                        None,
                    )
                    .await?;
                println!("{}", serde_json::to_string_pretty(&run)?);
            }
            RunsCommand::Approve {
                id,
                request,
                reason,
            } => {
                client.answer(&id, "approve", request, reason).await?;
            }
            RunsCommand::Reject {
                id,
                request,
                reason,
            } => {
                client.answer(&id, "reject", request, reason).await?;
            }
            RunsCommand::Audit { tenant, run, limit } => {
                let mut query = vec![("limit", limit.to_string())];
                query.extend(tenant.map(|t| ("tenant", t)));
                query.extend(run.map(|r| ("run", r)));
                let page = client
                    .send(reqwest::Method::GET, "/admin/tool-audit", &query, None)
                    .await?;
                for a in page["data"].as_array().into_iter().flatten() {
                    println!(
                        "{} {:<12} {:<30} {:<20} {:>6} ms {:>7} B  {}  {}",
                        a["at"],
                        a["tenant"].as_str().unwrap_or_default(),
                        a["run_id"].as_str().unwrap_or_default(),
                        a["tool"].as_str().unwrap_or_default(),
                        a["duration_ms"],
                        a["result_bytes"],
                        a["verdict"].as_str().unwrap_or_default(),
                        a["detail"].as_str().unwrap_or_default()
                    );
                }
            }
        }
        Ok(())
    })
}

struct Admin {
    http: reqwest::Client,
    url: String,
    key: String,
}

impl Admin {
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let q: Vec<String> = query
            .iter()
            .map(|(k, v)| format!("{k}={}", urlencode(v)))
            .collect();
        let url = match q.is_empty() {
            true => format!("{}{path}", self.url),
            false => format!("{}{path}?{}", self.url, q.join("&")),
        };
        let mut req = self.http.request(method, url).bearer_auth(&self.key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("reaching {}", self.url))?;
        let status = resp.status();
        let value: Value = resp.json().await.unwrap_or_default();
        if !status.is_success() {
            bail!(
                "{status}: {}",
                value["error"]["message"].as_str().unwrap_or("failed")
            );
        }
        Ok(value)
    }

    async fn answer(
        &self,
        id: &str,
        verb: &str,
        request: Option<String>,
        reason: Option<String>,
    ) -> anyhow::Result<()> {
        let body = json!({"approval_request_id": request, "reason": reason});
        let path = format!("/admin/runs/{id}/{verb}");
        let run = self
            .send(reqwest::Method::POST, &path, &[], Some(body))
            .await?;
        println!("{id}: {}", run["status"].as_str().unwrap_or_default());
        if let Some(text) = run["output_text"].as_str().filter(|t| !t.is_empty()) {
            println!("{text}");
        }
        Ok(())
    }
}

/// Percent-encodes a query value.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}
