//! The TOML config file of `osprey serve`, and `osprey config check`.
//!
//! Top-level keys are `osprey serve`'s flags by their long names (`port = 8080`,
//! `max_num_seqs = 16`, `upstream = ["big=http://gpu:8000/v1"]`); tables name tenants and
//! upstream models:
//!
//! ```toml
//! redis = "redis://127.0.0.1:6379"
//! default_rpm = 600
//!
//! [tenants.acme]
//! rpm = 60
//! tpm = 100000
//! max_concurrent = 8
//! models = ["smollm2-135m-instruct"]
//! max_tokens = 512
//! priority = "interactive"
//! default_model = "auto"      # for requests that name no model
//! policy = "strict"            # a [policies.NAME] (default: standard)
//!
//! [policies.strict]
//! prompt_injection = { flag = 0.3, block = 0.5 }
//! jailbreak = { flag = 0.3, block = 0.5 }
//! pii = { redact = 0.5 }
//! deny = ["internal codename"]
//! output_pii = "redact"
//! restore_pii = true
//! guards = ["injection_rules", "injection_classifier", "pii"]   # the default: all
//! audit = "acted"              # or "blocked", "off"
//!
//! [agent]                      # agent runs (POST /v1/responses); see docs/agents.md
//! default_scopes = ["read"]    # tool scopes of tenants that set no tool_scopes
//! budget = { steps = 8, tokens = 16384, wall_seconds = 120, tool_calls = 16, retries = 2 }
//! http_fetch = { allow = ["docs.internal:8080"] }
//! sql = { url = "postgres://reader@db/app", max_rows = 100 }
//! [[agent.mcp]]
//! label = "files"
//! command = "npx"
//! args = ["@modelcontextprotocol/server-filesystem", "/srv/shared"]
//! scopes = ["read"]
//!
//! [models.llama-70b]
//! url = "http://10.0.0.5:8000/v1"
//! api_key_env = "VLLM_KEY"
//! model = "meta-llama/Llama-3.3-70B-Instruct"
//!
//! [models.gemma-3-270m]        # a model served here (`--model gemma-3-270m`): no `url`
//! kv_cache_memory = "512MiB"   # its KV pool; the others share the rest of --kv-cache-memory
//! ```
//!
//! A flag or `OSPREY_*` variable beats the file, which beats the default. The file's flags are
//! checked by the same parser as the command line, so a bad value reads as a bad flag would,
//! with the file's line named.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::parser::ValueSource;
use clap::{ArgMatches, FromArgMatches};
use osprey_policy::pipeline::PolicyConfig;
use osprey_services::config::{
    ConfigTables, LocalModelConfig, ModelTable, TenantConfig, TierConfig, UpstreamConfig,
};

use crate::cli::{Cli, Command, ServeArgs};

/// A parsed config file.
#[derive(Debug, Default)]
pub struct ConfigFile {
    pub path: PathBuf,
    text: String,
    flags: BTreeMap<String, toml::Value>,
    pub tenants: BTreeMap<String, TenantConfig>,
    /// The upstream models (`[models.NAME]` with a `url`).
    pub models: BTreeMap<String, UpstreamConfig>,
    /// Settings of models served here (`[models.NAME]` without one).
    pub local_models: BTreeMap<String, LocalModelConfig>,
    pub tiers: Vec<TierConfig>,
    pub policies: BTreeMap<String, PolicyConfig>,
    pub agent: osprey_agent::AgentConfig,
}

impl ConfigFile {
    /// Reads and parses `path`; errors name the line.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the config file {}", path.display()))?;
        let shape =
            ConfigTables::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let (mut models, mut local_models) = (BTreeMap::new(), BTreeMap::new());
        for (name, table) in shape.models {
            match table {
                ModelTable::Upstream(u) => models.insert(name, u).map(drop),
                ModelTable::Local(l) => local_models.insert(name, l).map(drop),
            };
        }
        Ok(Self {
            path: path.to_owned(),
            text,
            flags: shape.flags,
            tenants: shape.tenants,
            models,
            local_models,
            tiers: shape.tiers,
            policies: shape.policies,
            agent: shape.agent,
        })
    }

    /// The line (1-based) where `key` is set, for messages.
    fn line_of(&self, key: &str) -> Option<usize> {
        self.text
            .lines()
            .position(|l| {
                let l = l.trim_start();
                l.strip_prefix(key)
                    .is_some_and(|rest| rest.trim_start().starts_with('='))
            })
            .map(|i| i + 1)
    }

    /// Command-line arguments for the file's flags, except those in `skip`.
    fn args(&self, skip: impl Fn(&str) -> bool) -> anyhow::Result<Vec<String>> {
        let mut args = Vec::new();
        for (key, value) in &self.flags {
            let id = key.replace('-', "_");
            if skip(&id) {
                continue;
            }
            let flag = format!("--{}", key.replace('_', "-"));
            let at = || match self.line_of(key) {
                Some(n) => format!("{} line {n}", self.path.display()),
                None => self.path.display().to_string(),
            };
            match value {
                toml::Value::Boolean(true) => args.push(flag),
                toml::Value::Boolean(false) => {}
                toml::Value::Array(items) => {
                    for item in items {
                        args.push(flag.clone());
                        args.push(scalar(item).with_context(|| format!("{}: `{key}`", at()))?);
                    }
                }
                v => {
                    args.push(flag);
                    args.push(scalar(v).with_context(|| format!("{}: `{key}`", at()))?);
                }
            }
        }
        Ok(args)
    }

    /// `osprey serve`'s arguments: the command line's, then the file's for every flag the
    /// command line and environment left unset.
    pub fn serve_args(&self, argv: &[String], matches: &ArgMatches) -> anyhow::Result<ServeArgs> {
        let explicit = |id: &str| {
            matches!(
                matches.value_source(id),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        };
        let mut full = argv.to_vec();
        full.extend(self.args(explicit)?);
        match parse_serve(&full) {
            Ok(args) => Ok(args),
            Err(e) => Err(self.explain(e)),
        }
    }

    /// A clap error about the file's flags, with the file and line named.
    fn explain(&self, e: clap::Error) -> anyhow::Error {
        let text = e.to_string();
        // The first line names the argument at fault (later ones may suggest similar ones).
        let first = text.lines().next().unwrap_or("");
        let key = self.flags.keys().find(|k| {
            let flag = format!("--{}", k.replace('_', "-"));
            first.contains(&format!("'{flag}'")) || first.contains(&format!("'{flag} "))
        });
        match key.and_then(|k| Some((k, self.line_of(k)?))) {
            Some((k, line)) => anyhow::anyhow!(
                "{} line {line}: `{k}`: {}",
                self.path.display(),
                text.lines()
                    .next()
                    .unwrap_or("")
                    .trim_start_matches("error: ")
            ),
            None => anyhow::anyhow!("{}: {}", self.path.display(), text.trim()),
        }
    }
}

fn scalar(v: &toml::Value) -> anyhow::Result<String> {
    Ok(match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        other => bail!(
            "expected a string, number or boolean, found {}",
            other.type_str()
        ),
    })
}

fn parse_serve(argv: &[String]) -> Result<ServeArgs, clap::Error> {
    let matches = <Cli as clap::CommandFactory>::command().try_get_matches_from(argv)?;
    match Cli::from_arg_matches(&matches)?.command {
        Command::Serve(args) => Ok(*args),
        _ => unreachable!("argv starts with `osprey serve`"),
    }
}

/// `osprey config check FILE`: parses the file, its flags and tables, and builds what serving
/// would build from them, reporting the first problem with its line.
pub fn check(path: &Path) -> anyhow::Result<()> {
    let file = ConfigFile::load(path)?;
    let mut argv = vec!["osprey".to_owned(), "serve".to_owned()];
    argv.extend(file.args(|_| false)?);
    let args = parse_serve(&argv).map_err(|e| file.explain(e))?;
    let edge = crate::serve::edge_config(&args, &file);
    let client = osprey_router::upstream::http_client();
    let at_model = |name: &str, e: String| {
        let line = file
            .text
            .lines()
            .position(|l| l.trim() == format!("[models.{name}]"));
        anyhow::anyhow!(
            "{}{}: {e}",
            path.display(),
            line.map_or(String::new(), |n| format!(" line {}", n + 1))
        )
    };
    let mut upstreams = Vec::new();
    for (name, model) in &file.models {
        upstreams.push(
            osprey_router::upstream::Upstream::new(name, model, client.clone())
                .map_err(|e| at_model(name, e))?,
        );
    }
    for (name, model) in crate::serve::upstreams_from_flags(&args.upstream)? {
        upstreams.push(
            osprey_router::upstream::Upstream::new(&name, &model, client.clone())
                .map_err(anyhow::Error::msg)?,
        );
    }
    let local = crate::serve::local_names(&args)?;
    osprey_router::upstream::check_fallbacks(&upstreams, &local)
        .map_err(|(name, why)| at_model(&name, why))?;
    let floor = args.auto_min_logprob;
    crate::serve::tiers(&file, args.auto_confidence, floor, &upstreams, &local)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    crate::serve::check_default_models(&file, &upstreams, &local)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if !args.no_engine {
        let models = crate::models::local_models(&args.engine)?;
        crate::serve::engine_configs(&args.engine, &models, &file.local_models)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    crate::serve::policies(&file).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    osprey_agent::Builtins::new(&file.agent)
        .map_err(|e| anyhow::anyhow!("{}: [agent]: {e}", path.display()))?;
    println!(
        "{}: ok ({} tenants, {} upstream models, {} tiers, store {}, limits {})",
        path.display(),
        edge.tenants.len(),
        file.models.len() + args.upstream.len(),
        file.tiers.len(),
        args.store.as_deref().unwrap_or("default"),
        if args.redis.is_some() {
            "shared through Redis"
        } else {
            "local"
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("osprey-config-{:x}.toml", rand::random::<u64>()));
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn a_good_file_checks_and_its_flags_parse() {
        let path = file(
            "port = 9001\nmax_num_seqs = 4\nno-prefix-caching = true\nupstream = [\"a=http://127.0.0.1:1/v1\"]\n\
             [tenants.acme]\nrpm = 60\nmodels = [\"a\"]\npriority = \"batch\"\n\
             [models.b]\nurl = \"http://127.0.0.1:2/v1\"\n",
        );
        check(&path).unwrap();
        let file = ConfigFile::load(&path).unwrap();
        let argv: Vec<String> = ["osprey", "serve", "--port", "9002"]
            .map(String::from)
            .to_vec();
        let matches = <Cli as clap::CommandFactory>::command().get_matches_from(&argv);
        let args = file
            .serve_args(&argv, matches.subcommand_matches("serve").unwrap())
            .unwrap();
        assert_eq!(args.port, 9002, "the command line beats the file");
        assert_eq!(args.engine.max_num_seqs, 4);
        assert!(args.engine.no_prefix_caching);
        assert_eq!(args.upstream, ["a=http://127.0.0.1:1/v1"]);
        assert_eq!(file.tenants["acme"].rpm, Some(60));
    }

    #[test]
    fn a_fallback_may_be_the_local_model() {
        let name = osprey_models::DEFAULT_MODEL.served_name;
        let text = format!("[models.big]\nurl = \"http://a/v1\"\nfallbacks = [\"{name}\"]\n");
        check(&file(&text)).unwrap();
        let e = check(&file(&format!("no_engine = true\n{text}"))).unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
    }

    #[test]
    fn tiers_must_name_served_models() {
        let name = osprey_models::DEFAULT_MODEL.served_name;
        let big = "[models.big]\nurl = \"http://a/v1\"\n";
        let tiers = format!(
            "[[tiers]]\nname = \"small\"\nmodel = \"{name}\"\n[[tiers]]\nname = \"large\"\nmodel = \"big\"\n"
        );
        check(&file(&format!("{big}{tiers}"))).unwrap();
        let e = check(&file(&tiers)).unwrap_err();
        assert!(
            e.to_string().contains("model `big` is not served here"),
            "{e}"
        );
        let twice = format!("{big}{tiers}[[tiers]]\nname = \"small\"\nmodel = \"big\"\n");
        let e = check(&file(&twice)).unwrap_err();
        assert!(e.to_string().contains("listed twice"), "{e}");
        let typo = format!("{big}[[tiers]]\nname = \"small\"\nmodle = \"big\"\n");
        assert!(check(&file(&typo)).is_err());
        let policy = "[tenants.acme]\npolicy = \"lean\"\n[policies.lean]\nguards = [\"pii\"]\naudit = \"blocked\"\n";
        check(&file(policy)).unwrap();
        let e = check(&file(&policy.replace("[\"pii\"]", "[\"pi\"]"))).unwrap_err();
        assert!(e.to_string().contains("unknown guard `pi`"), "{e}");
        let e = check(&file("[tenants.acme]\npolicy = \"nope\"\n")).unwrap_err();
        assert!(
            e.to_string().contains("policy `nope` is not defined"),
            "{e}"
        );
        let auto = "[tenants.acme]\ndefault_model = \"auto\"\n";
        check(&file(&format!("{auto}{big}{tiers}"))).unwrap();
        let e = check(&file(&format!("{auto}{big}"))).unwrap_err();
        assert!(e.to_string().contains("auto needs [[tiers]]"), "{e}");
    }

    #[test]
    fn bad_files_name_the_line() {
        let cases = [
            ("port = 80\nmax_num_seqs = \"many\"\n", "line 2"),
            ("port = 80\n\nportt = 81\n", "line 3"),
            ("[tenants.acme]\nrpm = 60\nrmp = 5\n", "line 3"),
            ("port = \n", "line 1"),
            ("[models.x]\nurl = \"ftp://nope\"\n", "line 1"),
            (
                "port = 80\n[models.x]\nurl = \"http://a/v1\"\nfallbacks = [\"y\"]\n",
                "line 2",
            ),
        ];
        for (text, want) in cases {
            let e = check(&file(text)).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
