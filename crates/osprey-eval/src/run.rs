//! Running a suite against a target: each case's request, bounded concurrency, the
//! measurements perplexity and judge checkers need, and the per-case results.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::check::{Answer, Check, CheckOutcome, Failure};
use crate::suite::{Case, Suite};
use crate::target::Target;

/// One case's result.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CaseResult {
    /// The case's id.
    pub id: String,
    /// The case's tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Whether every checker passed.
    pub pass: bool,
    /// Each checker's verdict, in the suite's order.
    pub checks: Vec<CheckOutcome>,
    /// The answer's text.
    pub output: String,
    /// The request's failure, if it failed.
    pub error: Option<Failure>,
    /// Prompt tokens, as the server counted them.
    pub prompt_tokens: u64,
    /// Completion tokens, as the server counted them.
    pub completion_tokens: u64,
    /// Milliseconds from sending to the whole answer.
    pub latency_ms: f64,
    /// Estimated dollars, from the target's prices.
    pub cost: f64,
}

/// A suite's run against a target.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunReport {
    /// Unique: `SUITE-TARGET-<unix ms, hex>`.
    pub id: String,
    /// `run` or `replay`.
    pub kind: String,
    /// The suite's name.
    pub suite: String,
    /// The target as run (its key stays in the environment).
    pub target: Target,
    /// Unix seconds at the start.
    pub started_at: i64,
    /// Seconds the run took.
    pub duration_s: f64,
    /// Per case, in the suite's order.
    pub cases: Vec<CaseResult>,
}

/// Run options.
#[derive(Clone, Copy, Debug)]
pub struct RunConfig {
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Per-request timeout.
    pub timeout: Duration,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            concurrency: 4,
            timeout: Duration::from_secs(300),
        }
    }
}

/// Runs every case of `suite` against `target`; `progress` is called as each case finishes.
pub async fn run_suite(
    suite: &Suite,
    target: &Target,
    config: RunConfig,
    progress: &(dyn Fn(&CaseResult) + Sync),
) -> RunReport {
    let started = Instant::now();
    let client = Client::new(config.timeout);
    let mut results: Vec<(usize, CaseResult)> =
        futures_util::stream::iter(suite.cases.iter().enumerate())
            .map(|(i, case)| {
                let client = &client;
                async move {
                    let result = run_case(client, target, case).await;
                    progress(&result);
                    (i, result)
                }
            })
            .buffer_unordered(config.concurrency.max(1))
            .collect()
            .await;
    results.sort_by_key(|(i, _)| *i);
    RunReport {
        id: run_id(&suite.name, &target.name),
        kind: "run".into(),
        suite: suite.name.clone(),
        target: target.clone(),
        started_at: unix_now() as i64,
        duration_s: started.elapsed().as_secs_f64(),
        cases: results.into_iter().map(|(_, r)| r).collect(),
    }
}

/// The first model a server lists (`GET /v1/models`).
pub async fn first_model(url: &str) -> Result<String, crate::EvalError> {
    let failed = |e: String| crate::EvalError::Http(format!("listing {url}/v1/models: {e}"));
    let resp = reqwest::get(format!("{url}/v1/models"))
        .await
        .map_err(|e| failed(e.to_string()))?;
    let v: Value = resp.json().await.map_err(|e| failed(e.to_string()))?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| failed("no model listed".into()))
}

/// A fresh run id.
pub fn run_id(suite: &str, target: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    format!(
        "{}-{}-{:x}",
        clean(suite),
        clean(target),
        (unix_now() * 1000.0) as u64
    )
}

fn unix_now() -> f64 {
    (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH))
        .map_or(0.0, |d| d.as_secs_f64())
}

async fn run_case(client: &Client, target: &Target, case: &Case) -> CaseResult {
    let start = Instant::now();
    let mut reply = match case.generates() {
        true => {
            client
                .answer(target, &request_body(target, case), case.prompt.is_some())
                .await
        }
        false => Reply::default(),
    };
    let latency_ms = start.elapsed().as_secs_f64() * 1000.0;
    for check in &case.checks {
        match check {
            Check::Perplexity { text, .. } if !reply.answer.perplexity.contains_key(text) => {
                if let Some(ppl) = client.perplexity(target, text).await {
                    reply.answer.perplexity.insert(text.clone(), ppl);
                }
            }
            Check::Similar { value, .. } if reply.answer.error.is_none() => {
                if let Some(sim) = client.similarity(target, &reply.answer.text, value).await {
                    reply.answer.similarity.insert(value.clone(), sim);
                }
            }
            Check::Judge { rubric } if reply.answer.error.is_none() => {
                let verdict = client
                    .judge(&target.judge_target(), case, rubric, &reply.answer.text)
                    .await;
                reply.answer.verdicts.insert(rubric.clone(), verdict);
            }
            _ => {}
        }
    }
    let checks: Vec<CheckOutcome> = case
        .checks
        .iter()
        .map(|c| c.evaluate(&reply.answer))
        .collect();
    CaseResult {
        id: case.id.clone(),
        tags: case.tags.clone(),
        pass: checks.iter().all(|c| c.pass),
        checks,
        output: reply.answer.text,
        error: reply.answer.error,
        prompt_tokens: reply.prompt_tokens,
        completion_tokens: reply.completion_tokens,
        latency_ms,
        cost: target.cost.of(reply.prompt_tokens, reply.completion_tokens),
    }
}

/// The request for `case`: the target's defaults, the case's fields over them.
pub fn request_body(target: &Target, case: &Case) -> Value {
    let mut body = Map::new();
    body.insert("temperature".into(), json!(0));
    body.extend(target.params.clone());
    body.extend(case.params.clone());
    body.insert("model".into(), json!(target.model));
    match &case.prompt {
        Some(p) => body.insert("prompt".into(), json!(p)),
        None => body.insert("messages".into(), json!(case.messages)),
    };
    let mut osprey = (target.osprey.clone()).unwrap_or_else(|| json!({}));
    if target.bypass_cache {
        osprey["cache"] = json!(false);
    }
    if let (Some(o), Some(extra)) = (
        osprey.as_object_mut(),
        case.osprey.as_ref().and_then(Value::as_object),
    ) {
        o.extend(extra.clone());
    }
    if osprey.as_object().is_some_and(|o| !o.is_empty()) {
        body.insert("osprey".into(), osprey);
    }
    Value::Object(body)
}

/// An answer and its usage.
#[derive(Default)]
pub(crate) struct Reply {
    pub answer: Answer,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// The HTTP side: one pooled client.
pub(crate) struct Client(reqwest::Client);

impl Client {
    pub fn new(timeout: Duration) -> Client {
        Client(
            reqwest::Client::builder()
                .timeout(timeout)
                .build()
                .expect("an HTTP client"),
        )
    }

    async fn post(&self, target: &Target, path: &str, body: &Value) -> Result<Value, Failure> {
        let mut req = self.0.post(format!("{}/v1/{path}", target.url)).json(body);
        if let Some(key) = target.api_key() {
            req = req.bearer_auth(key);
        }
        let failure = |status: u16, code: Option<String>, message: String| Failure {
            status,
            code,
            message,
        };
        let resp = req
            .send()
            .await
            .map_err(|e| failure(0, None, e.to_string()))?;
        let status = resp.status().as_u16();
        let text = resp
            .text()
            .await
            .map_err(|e| failure(status, None, e.to_string()))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|_| failure(status, None, text.chars().take(200).collect()))?;
        if !(200..300).contains(&status) || v.get("error").is_some_and(|e| !e.is_null()) {
            let e = &v["error"];
            let message = e["message"]
                .as_str()
                .map_or_else(|| v.to_string(), str::to_owned);
            return Err(failure(
                status,
                e["code"].as_str().map(str::to_owned),
                message,
            ));
        }
        Ok(v)
    }

    /// Sends one chat (or completions) request and reads its answer.
    pub async fn answer(&self, target: &Target, body: &Value, completions: bool) -> Reply {
        let path = if completions {
            "completions"
        } else {
            "chat/completions"
        };
        let v = match self.post(target, path, body).await {
            Ok(v) => v,
            Err(f) => {
                return Reply {
                    answer: Answer {
                        error: Some(f),
                        ..Answer::default()
                    },
                    ..Reply::default()
                };
            }
        };
        let choice = &v["choices"][0];
        let text = osprey_core::api::choice_text(choice);
        let tool_calls = (choice["message"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten())
        .map(|c| {
            let f = &c["function"];
            let args = match &f["arguments"] {
                Value::String(s) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
                other => other.clone(),
            };
            (f["name"].as_str().unwrap_or_default().to_owned(), args)
        })
        .collect();
        let citations = (v["osprey"]["citations"].as_array().into_iter().flatten())
            .filter_map(|c| c["document_id"].as_str().map(str::to_owned))
            .collect();
        Reply {
            answer: Answer {
                text: text.unwrap_or_default().to_owned(),
                tool_calls,
                citations,
                ..Answer::default()
            },
            prompt_tokens: v["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
            completion_tokens: v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
        }
    }

    /// The target model's perplexity on `text`: `echo` with no output scores the prompt.
    async fn perplexity(&self, target: &Target, text: &str) -> Option<f64> {
        let body = json!({"model": target.model, "prompt": text, "max_tokens": 0, "echo": true, "logprobs": 0});
        let v = self.post(target, "completions", &body).await.ok()?;
        let lps: Vec<f64> = (v["choices"][0]["logprobs"]["token_logprobs"]
            .as_array()?
            .iter())
        .filter_map(Value::as_f64)
        .collect();
        (!lps.is_empty()).then(|| (-lps.iter().sum::<f64>() / lps.len() as f64).exp())
    }

    /// Cosine similarity of `a` and `b` by the target server's embeddings.
    async fn similarity(&self, target: &Target, a: &str, b: &str) -> Option<f64> {
        let mut body = json!({"input": [a, b]});
        if let Some(m) = &target.embedding_model {
            body["model"] = json!(m);
        }
        let v = self.post(target, "embeddings", &body).await.ok()?;
        let vec = |i: usize| -> Option<Vec<f64>> {
            Some(
                v["data"][i]["embedding"]
                    .as_array()?
                    .iter()
                    .filter_map(Value::as_f64)
                    .collect(),
            )
        };
        let (x, y) = (vec(0)?, vec(1)?);
        let dot: f64 = x.iter().zip(&y).map(|(p, q)| p * q).sum();
        let norm = |v: &[f64]| v.iter().map(|p| p * p).sum::<f64>().sqrt();
        let denom = norm(&x) * norm(&y);
        (denom > 0.0).then(|| dot / denom)
    }

    /// Asks the judge whether `answer` meets `rubric`: `(pass, its words)`.
    async fn judge(
        &self,
        judge: &Target,
        case: &Case,
        rubric: &str,
        answer: &str,
    ) -> (bool, String) {
        let question = match &case.prompt {
            Some(p) => p.clone(),
            None => (case.messages.iter())
                .map(|m| format!("{}: {}", m["role"].as_str().unwrap_or("?"), m["content"]))
                .collect::<Vec<_>>()
                .join("\n"),
        };
        let body = json!({
            "model": judge.model, "temperature": 0, "max_tokens": 48,
            "messages": [
                {"role": "system", "content": "You grade an answer against a rubric. Reply with PASS or FAIL, then one short reason."},
                {"role": "user", "content": format!("Rubric: {rubric}\n\nQuestion:\n{question}\n\nAnswer:\n{answer}\n\nDoes the answer meet the rubric? Reply PASS or FAIL.")},
            ],
        });
        let said = self.answer(judge, &body, false).await.answer;
        if let Some(f) = said.error {
            return (false, format!("judge failed: {}", f.message));
        }
        let upper = said.text.to_uppercase();
        let at = |w: &str| upper.find(w).unwrap_or(usize::MAX);
        let pass = at("PASS") < at("FAIL");
        (pass, said.text.trim().chars().take(160).collect())
    }
}

/// A run's figures.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Summary {
    /// Cases run.
    pub cases: usize,
    /// Cases that passed every checker.
    pub passed: usize,
    /// `passed / cases`.
    pub pass_rate: f64,
    /// Per checker type: (passed, run).
    pub by_checker: BTreeMap<String, (usize, usize)>,
    /// Cases whose request failed (not counting expected refusals).
    pub errors: usize,
    /// Total prompt tokens.
    pub prompt_tokens: u64,
    /// Total completion tokens.
    pub completion_tokens: u64,
    /// Estimated dollars.
    pub cost: f64,
    /// Median latency, ms.
    pub latency_p50_ms: f64,
    /// 95th percentile latency, ms.
    pub latency_p95_ms: f64,
    /// Cases with a judge and rule checkers: how often the judge agreed with the rules.
    pub judge_agreement: Option<(usize, usize)>,
}

impl RunReport {
    /// Its figures.
    pub fn summary(&self) -> Summary {
        let mut s = Summary {
            cases: self.cases.len(),
            ..Summary::default()
        };
        let mut latencies = Vec::new();
        let mut agreement = (0, 0);
        for c in &self.cases {
            s.passed += c.pass as usize;
            let expected_refusal = c.checks.iter().any(|k| k.kind == "error");
            s.errors += (c.error.is_some() && !expected_refusal) as usize;
            s.prompt_tokens += c.prompt_tokens;
            s.completion_tokens += c.completion_tokens;
            s.cost += c.cost;
            latencies.push(c.latency_ms);
            for k in &c.checks {
                let e = s.by_checker.entry(k.kind.clone()).or_default();
                e.0 += k.pass as usize;
                e.1 += 1;
            }
            let (judged, rules): (Vec<_>, Vec<_>) =
                c.checks.iter().partition(|k| k.kind == "judge");
            if let (Some(j), false) = (judged.first(), rules.is_empty()) {
                agreement.1 += 1;
                agreement.0 += (j.pass == rules.iter().all(|k| k.pass)) as usize;
            }
        }
        s.pass_rate = s.passed as f64 / s.cases.max(1) as f64;
        s.latency_p50_ms = crate::stats::quantile(&latencies, 0.5);
        s.latency_p95_ms = crate::stats::quantile(&latencies, 0.95);
        s.judge_agreement = (agreement.1 > 0).then_some(agreement);
        s
    }

    /// Per-case metrics for paired comparison, by name: `pass`, `check.KIND` (share of that
    /// case's checkers of the type that passed), `latency_ms`, `completion_tokens`, `cost`.
    pub fn metrics(&self) -> HashMap<&str, BTreeMap<String, f64>> {
        let mut out = HashMap::new();
        for c in &self.cases {
            let mut m = BTreeMap::new();
            m.insert("pass".to_string(), c.pass as u8 as f64);
            let mut kinds: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
            for k in &c.checks {
                let e = kinds.entry(k.kind.as_str()).or_default();
                e.0 += k.pass as u8 as f64;
                e.1 += 1.0;
            }
            for (kind, (passed, n)) in kinds {
                m.insert(format!("check.{kind}"), passed / n);
            }
            m.insert("latency_ms".into(), c.latency_ms);
            m.insert("completion_tokens".into(), c.completion_tokens as f64);
            m.insert("cost".into(), c.cost);
            out.insert(c.id.as_str(), m);
        }
        out
    }
}
