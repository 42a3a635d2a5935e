//! `osprey users delete TENANT USER`: forgets a tenant's user, as
//! `DELETE /admin/tenants/{tenant}/users/{user}` does: their conversations, memory and
//! request-log rows in the store, and (with `--redis`) the answers kept for them in the shared
//! response cache. A server's in-process cache is only reached through the admin API.

use clap::{Args, Subcommand};
use osprey_store::Owner;

/// `osprey users`.
#[derive(Args, Debug)]
pub struct UsersArgs {
    /// The store (default: sqlite://$OSPREY_HOME/osprey.db).
    #[arg(long, env = "OSPREY_STORE", global = true)]
    pub store: Option<String>,
    #[command(subcommand)]
    pub command: UsersCommand,
}

/// The user commands.
#[derive(Subcommand, Debug)]
pub enum UsersCommand {
    /// Delete everything kept of USER of TENANT.
    Delete {
        /// The tenant.
        tenant: String,
        /// The user (as in `x-osprey-user`).
        user: String,
        /// The Redis of the shared response cache, to drop the user's answers there too.
        #[arg(long, env = "OSPREY_REDIS")]
        redis: Option<String>,
    },
}

pub fn run(args: UsersArgs) -> anyhow::Result<()> {
    crate::serve::with_store(&args.store.clone(), async move |store| {
        let UsersCommand::Delete {
            tenant,
            user,
            redis,
        } = args.command;
        let owner = Owner { tenant, user };
        let d = store.delete_user(&owner).await?;
        let cached = match redis {
            Some(url) => {
                let cache = osprey_services::cache::ResponseCache::redis(
                    osprey_store::SharedRedis::open(&url)?,
                );
                cache.forget(&owner).await?
            }
            None => 0,
        };
        println!(
            "deleted {} of {}: {} conversations ({} items), {} facts, {} scratchpads, \
             {} request-log rows, {cached} cached answers",
            owner.user, owner.tenant, d.conversations, d.items, d.facts, d.working, d.requests
        );
        Ok(())
    })
}
