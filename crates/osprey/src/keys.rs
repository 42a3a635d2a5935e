//! `osprey keys create|list|revoke`: API keys in the store, from the command line.

use anyhow::Context;
use clap::{Args, Subcommand};
use osprey_store::{NewKey, now_ms};

/// `osprey keys`.
#[derive(Args, Debug)]
pub struct KeysArgs {
    /// The store (default: sqlite://$OSPREY_HOME/osprey.db).
    #[arg(long, env = "OSPREY_STORE", global = true)]
    pub store: Option<String>,
    /// Redis shared by the gateways: a revocation is announced there at once.
    #[arg(long, env = "OSPREY_REDIS", global = true)]
    pub redis: Option<String>,
    #[command(subcommand)]
    pub command: KeysCommand,
}

/// The key commands.
#[derive(Subcommand, Debug)]
pub enum KeysCommand {
    /// Create a key and print it (once: only its hash is stored).
    Create {
        /// The tenant the key acts for.
        #[arg(long)]
        tenant: String,
        /// A label.
        #[arg(long)]
        name: Option<String>,
        /// When it expires: a duration from now (`30d`, `12h`, `90m`, `3600s`) or Unix seconds.
        #[arg(long, value_parser = parse_expiry)]
        expires: Option<i64>,
        /// Requests per minute for this key (default: the tenant's).
        #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
        rpm: Option<i64>,
        /// Tokens per minute for this key (default: the tenant's).
        #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
        tpm: Option<i64>,
        /// An ACL group the key's requests belong to (repeatable): retrieval shows them the
        /// documents ingested with `--acl` of that group.
        #[arg(long = "group")]
        groups: Vec<String>,
        /// Tool scopes the key is granted, within its tenant's (`read,network`; default: the
        /// tenant's): an agent run's tool call outside them is refused.
        #[arg(long, value_delimiter = ',', value_parser = parse_scope)]
        tool_scopes: Option<Vec<String>>,
    },
    /// List keys (never their secrets).
    List,
    /// Revoke a key by id; every server refuses it from its next request.
    Revoke {
        /// The key's id (`key_…`).
        id: String,
    },
}

/// A tool scope's name, checked.
fn parse_scope(s: &str) -> Result<String, String> {
    osprey_agent::Scope::parse(s)
        .map(|scope| scope.as_str().to_owned())
        .ok_or_else(|| format!("unknown scope `{s}` (read, write, network, destructive)"))
}

/// `30d`, `12h`, `90m`, `3600s` from now, or absolute Unix seconds; as Unix ms.
fn parse_expiry(s: &str) -> Result<i64, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: i64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration like 30d or Unix seconds"))?;
    let scale: i64 = match unit {
        "" => return Ok(n.saturating_mul(1000)),
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        other => return Err(format!("unknown unit `{other}` (use s, m, h or d)")),
    };
    Ok(now_ms().saturating_add(n.saturating_mul(scale).saturating_mul(1000)))
}

pub fn run(args: KeysArgs) -> anyhow::Result<()> {
    crate::serve::with_store(&args.store.clone(), async move |store| {
        match args.command {
            KeysCommand::Create {
                tenant,
                name,
                expires,
                rpm,
                tpm,
                groups,
                tool_scopes,
            } => {
                let created = store
                    .create_key(NewKey {
                        tenant,
                        name,
                        expires_at: expires,
                        rpm,
                        tpm,
                        groups,
                        tool_scopes,
                    })
                    .await?;
                let r = &created.record;
                eprintln!(
                    "created {} for tenant {}{} — the key is shown only now:",
                    r.id,
                    r.tenant,
                    r.expires_at
                        .map_or(String::new(), |e| format!(", expires {}", iso(e)))
                );
                println!("{}", created.secret);
            }
            KeysCommand::List => {
                println!(
                    "{:<20} {:<12} {:<16} {:<14} {:>8} {:>10} {:<20} {:<20} status",
                    "id", "prefix", "tenant", "name", "rpm", "tpm", "created", "last used"
                );
                let now = now_ms();
                for k in store.list_keys().await? {
                    let status = match (k.revoked_at, k.is_active(now)) {
                        (Some(_), _) => "revoked",
                        (None, false) => "expired",
                        (None, true) => "active",
                    };
                    println!(
                        "{:<20} {:<12} {:<16} {:<14} {:>8} {:>10} {:<20} {:<20} {status}",
                        k.id,
                        format!("{}…", k.prefix),
                        k.tenant,
                        k.name.as_deref().unwrap_or("-"),
                        k.rpm.map_or("-".into(), |v| v.to_string()),
                        k.tpm.map_or("-".into(), |v| v.to_string()),
                        iso(k.created_at),
                        k.last_used_at.map_or("-".into(), iso),
                    );
                }
            }
            KeysCommand::Revoke { id } => {
                let k = store.revoke_key(&id).await?;
                if let Some(url) = &args.redis {
                    let redis = osprey_limits::redis::RedisLimiter::new(
                        osprey_store::SharedRedis::open(url)?,
                    );
                    redis
                        .revoke(&id)
                        .await
                        .with_context(|| format!("announcing the revocation on {url}"))?;
                }
                eprintln!(
                    "revoked {} (tenant {}); servers refuse it {}",
                    k.id,
                    k.tenant,
                    if args.redis.is_some() {
                        "from their next request"
                    } else {
                        "within a second"
                    }
                );
            }
        }
        Ok(())
    })
}

/// Unix ms as `YYYY-MM-DD HH:MM:SS` UTC.
pub fn iso(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiries_parse() {
        let now = now_ms();
        let d = parse_expiry("30d").unwrap();
        assert!((d - now - 30 * 86_400_000).abs() < 5_000);
        assert_eq!(parse_expiry("1700000000"), Ok(1_700_000_000_000));
        assert!(parse_expiry("3 weeks").is_err());
        assert_eq!(iso(0), "1970-01-01 00:00:00");
        assert_eq!(iso(1_764_547_200_000), "2025-12-01 00:00:00");
    }
}
