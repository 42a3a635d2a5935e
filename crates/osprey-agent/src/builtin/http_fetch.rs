//! `http_fetch`: GET a URL whose host is on the operator's allow-list (redirects too), within a
//! time limit, reading at most a capped number of bytes. Needs the `network` scope.

use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::scope::{Scope, Scopes};
use crate::tool::{Tool, ToolError, ToolSpec};

/// The operator's settings (`[agent.http_fetch]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpFetchConfig {
    /// Hosts that may be fetched: `example.com` (any port), `example.com:8080`, or
    /// `*.example.com` (its subdomains). Empty: the tool is not offered.
    pub allow: Vec<String>,
    /// Most bytes of a body read.
    pub max_bytes: usize,
    /// Longest a fetch may take, seconds.
    pub timeout_seconds: f64,
}

impl Default for HttpFetchConfig {
    fn default() -> Self {
        Self {
            allow: Vec::new(),
            max_bytes: 64 << 10,
            timeout_seconds: 10.0,
        }
    }
}

impl HttpFetchConfig {
    /// Whether `host` (with `port`) is on the allow-list.
    pub fn allows(&self, host: &str, port: Option<u16>) -> bool {
        let host = host.to_ascii_lowercase();
        self.allow.iter().any(|entry| {
            let entry = entry.trim().to_ascii_lowercase();
            let (name, want_port) = match entry.rsplit_once(':') {
                Some((n, p)) if p.parse::<u16>().is_ok() => (n.to_owned(), p.parse().ok()),
                _ => (entry.clone(), None),
            };
            let host_ok = match name.strip_prefix("*.") {
                Some(suffix) => host.ends_with(&format!(".{suffix}")),
                None => host == name,
            };
            host_ok && want_port.is_none_or(|p| Some(p) == port)
        })
    }
}

/// The fetch tool.
pub struct HttpFetch {
    spec: ToolSpec,
    config: HttpFetchConfig,
    client: reqwest::Client,
}

impl HttpFetch {
    /// A fetcher for `config`'s hosts.
    pub fn new(config: HttpFetchConfig) -> Self {
        let parameters = json!({
            "type": "object",
            "properties": {"url": {"type": "string", "maxLength": 2048,
                "description": "An http:// URL on the allowed hosts"}},
            "required": ["url"],
            "additionalProperties": false
        });
        let hosts = config.allow.join(", ");
        let mut spec = ToolSpec::new(
            "http_fetch",
            &format!("Fetches a web page or API response by URL (GET). Allowed hosts: {hosts}."),
            parameters,
        )
        .with_scopes(Scopes::of(&[Scope::Network]));
        spec.timeout = Duration::from_secs_f64(config.timeout_seconds.max(0.1));
        let allowed = config.clone();
        // Each redirect is checked against the allow-list too.
        let policy = reqwest::redirect::Policy::custom(move |attempt| {
            let url = attempt.url();
            let ok = attempt.previous().len() < 5
                && allowed.allows(
                    url.host_str().unwrap_or_default(),
                    url.port_or_known_default(),
                );
            if ok { attempt.follow() } else { attempt.stop() }
        });
        let client = reqwest::Client::builder()
            .redirect(policy)
            .timeout(spec.timeout)
            .build()
            .unwrap_or_default();
        Self {
            spec,
            config,
            client,
        }
    }

    async fn fetch(&self, url: &str) -> Result<String, ToolError> {
        let parsed = reqwest::Url::parse(url)
            .map_err(|e| ToolError::fatal(format!("`{url}` is not a URL: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(ToolError::fatal("only http and https URLs can be fetched"));
        }
        let host = parsed.host_str().unwrap_or_default();
        if !self.config.allows(host, parsed.port_or_known_default()) {
            return Err(ToolError::fatal(format!(
                "`{host}` is not on the allow-list of this server"
            )));
        }
        let response = self.client.get(parsed.clone()).send().await.map_err(|e| {
            let message = format!("fetching {url} failed: {e}");
            match e.is_timeout() || e.is_connect() {
                true => ToolError::transient(message),
                false => ToolError::fatal(message),
            }
        })?;
        let status = response.status();
        if status.is_redirection() {
            return Err(ToolError::fatal(format!(
                "{url} redirects to a host that is not allowed"
            )));
        }
        let kind = (response.headers().get(reqwest::header::CONTENT_TYPE))
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let mut body = Vec::new();
        let mut cut = false;
        let mut chunks = response.bytes_stream();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| ToolError::transient(format!("reading {url}: {e}")))?;
            let room = self.config.max_bytes - body.len();
            body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if chunk.len() > room {
                cut = true;
                break;
            }
        }
        if status.is_server_error() {
            return Err(ToolError::transient(format!("{url} answered {status}")));
        }
        let mut text = format!(
            "status: {}\ncontent-type: {kind}\n\n{}",
            status.as_u16(),
            String::from_utf8_lossy(&body)
        );
        if cut {
            text.push_str(&format!("\n[cut at {} bytes]", self.config.max_bytes));
        }
        Ok(text)
    }
}

impl Tool for HttpFetch {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call(&self, arguments: Value) -> BoxFuture<'_, Result<String, ToolError>> {
        let url = arguments["url"].as_str().unwrap_or_default().to_owned();
        Box::pin(async move { self.fetch(&url).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allow_list_matches_hosts_ports_and_subdomains() {
        let c = HttpFetchConfig {
            allow: vec![
                "example.com".into(),
                "127.0.0.1:8080".into(),
                "*.docs.rs".into(),
            ],
            ..HttpFetchConfig::default()
        };
        assert!(c.allows("example.com", Some(80)) && c.allows("EXAMPLE.com", Some(8000)));
        assert!(!c.allows("evil-example.com", Some(80)));
        assert!(c.allows("127.0.0.1", Some(8080)) && !c.allows("127.0.0.1", Some(8081)));
        assert!(c.allows("serde.docs.rs", Some(443)) && !c.allows("docs.rs", Some(443)));
    }
}
