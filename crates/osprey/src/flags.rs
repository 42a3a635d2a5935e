//! `osprey flags set|unset|list`: per-tenant feature flags in the store; servers follow a
//! change within about a second, without a restart (see `osprey_store::tenant_flags`).

use clap::{Args, Subcommand};

use crate::keys::iso;

/// `osprey flags`.
#[derive(Args, Debug)]
pub struct FlagsArgs {
    /// The store (default: sqlite://$OSPREY_HOME/osprey.db).
    #[arg(long, env = "OSPREY_STORE", global = true)]
    pub store: Option<String>,
    #[command(subcommand)]
    pub command: FlagsCommand,
}

/// The flag commands.
#[derive(Subcommand, Debug)]
pub enum FlagsCommand {
    /// Set FLAG of TENANT to VALUE (JSON: `false`, `"strict"`; anything else is a string):
    /// `policy`, `tier.NAME`, `prompt.NAME.label`.
    Set {
        /// The tenant.
        tenant: String,
        /// The flag.
        flag: String,
        /// Its value.
        value: String,
    },
    /// Remove FLAG of TENANT.
    Unset {
        /// The tenant.
        tenant: String,
        /// The flag.
        flag: String,
    },
    /// List flags.
    List {
        /// Only this tenant's.
        #[arg(long)]
        tenant: Option<String>,
    },
}

pub fn run(args: FlagsArgs) -> anyhow::Result<()> {
    crate::serve::with_store(&args.store.clone(), async move |store| {
        match args.command {
            FlagsCommand::Set {
                tenant,
                flag,
                value,
            } => {
                let json = serde_json::from_str::<serde_json::Value>(&value)
                    .unwrap_or_else(|_| serde_json::Value::String(value.clone()));
                store.set_flag(&tenant, &flag, &json.to_string()).await?;
                println!("{tenant} {flag} = {json}");
            }
            FlagsCommand::Unset { tenant, flag } => {
                store.unset_flag(&tenant, &flag).await?;
                println!("{tenant} {flag} removed");
            }
            FlagsCommand::List { tenant } => {
                println!("{:<16} {:<32} {:<24} updated", "tenant", "flag", "value");
                for f in store.flags().await? {
                    if tenant.as_deref().is_none_or(|t| t == f.tenant) {
                        println!(
                            "{:<16} {:<32} {:<24} {}",
                            f.tenant,
                            f.flag,
                            f.value,
                            iso(f.updated_at)
                        );
                    }
                }
            }
        }
        Ok(())
    })
}
