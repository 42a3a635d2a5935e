//! One streamed chat request against an OpenAI-compatible server, timed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::Value;

use super::workload::{Class, RequestSpec};

/// What happened to one request.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Outcome {
    pub class: Class,
    /// `None` if it completed; the error otherwise (including being cut off).
    pub error: Option<String>,
    /// Seconds from sending to the first generated text.
    pub ttft: Option<f64>,
    /// Seconds from sending to the end of the stream.
    pub e2e: f64,
    /// Generated tokens (the server's usage count when given, else content chunks).
    pub output_tokens: u64,
    /// A hash of the generated text, to tell whether two servers wrote the same.
    #[serde(default)]
    pub text_hash: u64,
}

impl Outcome {
    /// Mean seconds per output token after the first.
    pub fn tpot(&self) -> Option<f64> {
        let ttft = self.ttft?;
        (self.error.is_none() && self.output_tokens > 1)
            .then(|| (self.e2e - ttft) / (self.output_tokens - 1) as f64)
    }
}

/// Tokens served per class, counted as they stream in, so that requests cut off at the end of
/// a measurement window count for what they got.
#[derive(Debug, Default)]
pub struct Tally {
    /// Prompt tokens of requests whose first token arrived (so their prompt was processed).
    prompt: [AtomicU64; 2],
    /// Output tokens received.
    output: [AtomicU64; 2],
}

impl Tally {
    fn slot(class: Class) -> usize {
        match class {
            Class::Interactive => 0,
            Class::Batch => 1,
        }
    }

    /// Counts `n` prompt tokens of `class` as processed.
    pub fn add_prompt(&self, class: Class, n: u64) {
        self.prompt[Self::slot(class)].fetch_add(n, Ordering::Relaxed);
    }

    /// Counts `n` output tokens of `class` as received.
    pub fn add_output(&self, class: Class, n: u64) {
        self.output[Self::slot(class)].fetch_add(n, Ordering::Relaxed);
    }

    /// (prompt, output) tokens of `class` so far.
    pub fn of(&self, class: Class) -> (u64, u64) {
        let i = Self::slot(class);
        let get = |c: &[AtomicU64; 2]| c[i].load(Ordering::Relaxed);
        (get(&self.prompt), get(&self.output))
    }
}

/// Sends `spec` to `url` (`/v1/chat/completions`) and reads the stream to its end, counting
/// its tokens into `tally` as they arrive.
pub async fn send(
    client: &reqwest::Client,
    url: &str,
    model: &str,
    spec: &RequestSpec,
    tally: &Arc<Tally>,
) -> Outcome {
    let start = Instant::now();
    let mut outcome = Outcome {
        class: spec.class,
        error: None,
        ttft: None,
        e2e: 0.0,
        output_tokens: 0,
        text_hash: 0,
    };
    let mut written = std::collections::hash_map::DefaultHasher::new();
    let result = async {
        let body = spec.body(model);
        let post = || {
            client
                .post(format!("{url}/v1/chat/completions"))
                .json(&body)
                .send()
        };
        // A pooled keep-alive connection the server has just closed fails before the request
        // reaches it (llama-server closes them after a few requests): retry those, not others.
        let mut resp = post().await;
        for _ in 0..3 {
            match &resp {
                Err(e) if e.is_request() || e.is_connect() => resp = post().await,
                _ => break,
            }
        }
        let resp = resp.map_err(|e| format!("sending: {e}"))?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            return Err(format!(
                "HTTP {status}: {}",
                body.chars().take(200).collect::<String>()
            ));
        }
        let mut stream = resp.bytes_stream();
        let mut buf = Vec::new();
        let (mut chunks, mut usage) = (0u64, None);
        while let Some(bytes) = stream.next().await {
            buf.extend_from_slice(&bytes.map_err(|e| format!("reading: {e}"))?);
            while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = buf.drain(..end + 2).collect();
                let text = String::from_utf8_lossy(&event);
                for data in text.lines().filter_map(|l| l.strip_prefix("data:")) {
                    let data = data.trim();
                    if data == "[DONE]" {
                        continue;
                    }
                    let v: Value =
                        serde_json::from_str(data).map_err(|e| format!("bad chunk: {e}"))?;
                    if let Some(e) = v.get("error") {
                        return Err(format!("stream error: {e}"));
                    }
                    let content = &v["choices"][0]["delta"]["content"];
                    if let Some(c) = content.as_str() {
                        std::hash::Hash::hash(c, &mut written);
                    }
                    if content.as_str().is_some_and(|c| !c.is_empty()) {
                        if outcome.ttft.is_none() {
                            outcome.ttft = Some(start.elapsed().as_secs_f64());
                            tally.add_prompt(spec.class, spec.prompt_tokens as u64);
                        }
                        chunks += 1;
                        tally.add_output(spec.class, 1);
                    }
                    if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                        usage = Some(n);
                    }
                }
            }
        }
        // A chunk can carry more than one token: the server's count is the exact one.
        let tokens = usage.unwrap_or(chunks);
        tally.add_output(spec.class, tokens.saturating_sub(chunks));
        Ok(tokens)
    }
    .await;
    outcome.e2e = start.elapsed().as_secs_f64();
    match result {
        Ok(n) => {
            outcome.output_tokens = n;
            outcome.text_hash = std::hash::Hasher::finish(&written);
        }
        Err(e) => outcome.error = Some(e),
    }
    outcome
}

/// An HTTP client for many concurrent streams.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .timeout(Duration::from_secs(1800))
        .build()
        .expect("an HTTP client")
}

/// The first model a server lists.
pub async fn first_model(client: &reqwest::Client, url: &str) -> anyhow::Result<String> {
    let v: Value = client
        .get(format!("{url}/v1/models"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("{url}/v1/models lists no model"))
}
