//! `osprey prompts push|list|show|diff|label|rollback`: the prompt registry in the store, from
//! the command line (the admin API under `/admin/prompts` does the same over HTTP).

use anyhow::Context;
use clap::{Args, Subcommand};
use osprey_context::prompt::{PromptDef, diff, parse_split};

use crate::keys::iso;

/// `osprey prompts`.
#[derive(Args, Debug)]
pub struct PromptsArgs {
    /// The store (default: sqlite://$OSPREY_HOME/osprey.db).
    #[arg(long, env = "OSPREY_STORE", global = true)]
    pub store: Option<String>,
    #[command(subcommand)]
    pub command: PromptsCommand,
}

/// The prompt commands.
#[derive(Subcommand, Debug)]
pub enum PromptsCommand {
    /// Store a prompt file (TOML or JSON: `[[messages]]` with `role` and a `content` template,
    /// and optional `[settings]`) as the next version of NAME.
    Push {
        /// The prompt's name.
        name: String,
        /// The prompt file.
        #[arg(long)]
        file: std::path::PathBuf,
    },
    /// List prompts, their newest version and their labels.
    List,
    /// Print a version of NAME (default: the newest), as TOML.
    Show {
        /// The prompt's name.
        name: String,
        /// The version.
        #[arg(long, conflicts_with = "label")]
        version: Option<i64>,
        /// The version a label points at (its first, for a split).
        #[arg(long)]
        label: Option<String>,
    },
    /// What changed from version V1 to V2 of NAME (a unified diff).
    Diff {
        /// The prompt's name.
        name: String,
        /// From this version.
        v1: i64,
        /// To this one.
        v2: i64,
    },
    /// Point LABEL of NAME at VERSION: `3`, or a split by weight, `3:90,4:10` (each user keeps
    /// the version they were given).
    Label {
        /// The prompt's name.
        name: String,
        /// A version, or `V:WEIGHT,...`.
        version: String,
        /// The label (`production`, `staging`, ...).
        label: String,
    },
    /// Return LABEL of NAME to what it pointed at before its last change.
    Rollback {
        /// The prompt's name.
        name: String,
        /// The label.
        label: String,
    },
}

fn split_text(split: &osprey_store::Split) -> String {
    match split.as_slice() {
        [(v, _)] => v.to_string(),
        _ => (split.iter())
            .map(|(v, w)| format!("{v}:{w}"))
            .collect::<Vec<_>>()
            .join(","),
    }
}

pub fn run(args: PromptsArgs) -> anyhow::Result<()> {
    crate::serve::with_store(&args.store.clone(), async move |store| {
        let def = |body: &str| PromptDef::parse(body).context("a stored prompt");
        match args.command {
            PromptsCommand::Push { name, file } => {
                osprey_gateway::routes::valid_prompt_name(&name)?;
                let text = std::fs::read_to_string(&file)
                    .with_context(|| format!("reading {}", file.display()))?;
                let parsed = PromptDef::parse(&text)
                    .with_context(|| format!("{} is not a valid prompt", file.display()))?;
                let v = store.push_prompt(&name, &parsed.to_json()).await?;
                let vars: Vec<String> = parsed.variables().into_iter().collect();
                println!("{}@{} (variables: {})", v.name, v.version, vars.join(", "));
            }
            PromptsCommand::List => {
                println!("{:<32} {:>7}  labels", "name", "latest");
                for p in store.list_prompts().await? {
                    let labels: Vec<String> = (p.labels.iter())
                        .map(|(l, s)| format!("{l}={}", split_text(s)))
                        .collect();
                    println!("{:<32} {:>7}  {}", p.name, p.latest, labels.join(" "));
                }
            }
            PromptsCommand::Show {
                name,
                version,
                label,
            } => {
                let version = match (version, label) {
                    (Some(v), _) => v,
                    (None, Some(label)) => store.label(&name, &label).await?[0].0,
                    (None, None) => (store.prompt_versions(&name).await?.last())
                        .map(|v| v.version)
                        .with_context(|| format!("no prompt {name}"))?,
                };
                let v = store.prompt_version(&name, version).await?;
                println!("# {}@{} pushed {}", v.name, v.version, iso(v.created_at));
                print!("{}", def(&v.body)?.to_toml());
            }
            PromptsCommand::Diff { name, v1, v2 } => {
                let a = store.prompt_version(&name, v1).await?;
                let b = store.prompt_version(&name, v2).await?;
                let (from, to) = (format!("{name}@{v1}"), format!("{name}@{v2}"));
                print!("{}", diff(&def(&a.body)?, &def(&b.body)?, &from, &to));
            }
            PromptsCommand::Label {
                name,
                version,
                label,
            } => {
                osprey_gateway::routes::valid_prompt_name(&label)?;
                let split = parse_split(&version)?;
                store.set_label(&name, &label, &split).await?;
                println!("{name} {label} -> {}", split_text(&split));
            }
            PromptsCommand::Rollback { name, label } => {
                let split = store.rollback_label(&name, &label).await?;
                println!("{name} {label} -> {} (rolled back)", split_text(&split));
            }
        }
        Ok(())
    })
}
