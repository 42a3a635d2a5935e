//! The safety policy in the request path ([`osprey_policy`]): each tenant's pipeline (its
//! `policy` names one of the config file's `[policies.NAME]`; without one, the standard policy)
//! screens a generation request's input before it is routed. User messages and prompts are read
//! as the caller's; `tool` messages as untrusted text, where an instruction is an indirect
//! injection. A text the policy blocks is refused (400 `content_policy_violation`, naming the
//! rules, never the text); one it redacts goes on with its PII replaced by placeholders; every
//! finding acted on is counted (`osprey_guard_verdicts_total`), logged and written to the
//! store's audit log, without the text ([`Auditor`]).
//!
//! Abuse: an API key whose requests are flagged as injections or jailbreaks `abuse_limit` times
//! (its tenant's policy; default 20) within [`ABUSE_WINDOW`] is throttled (429
//! `abuse_throttled`) until the window has room again ([`Abuse`]). On a server without keys
//! every caller is the same open tenant, so nobody is throttled; verdicts are still recorded.
//!
//! On the way out, [`GuardOut`] applies the policy's output rules (deny-listed phrases,
//! PII in answers) to every choice of an answer, streamed or not, and puts back the values
//! redacted from the caller's input where the policy says so (`restore_pii`). A stream is
//! filtered through a hold-back window ([`osprey_policy::stream`]); one that reaches a
//! forbidden phrase ends with a chunk whose `finish_reason` is `content_filter`, then
//! `data: [DONE]`. `logprobs` are refused under output rules: they would show the held-back
//! tokens.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use osprey_core::api::JsonBody;
use osprey_core::backend::ChoiceDelta;
use osprey_core::{Error, ErrorKind, FinishReason};
use osprey_policy::pipeline::{Audit, Pipeline, PolicyConfig};
use osprey_policy::redact::Redactor;
use osprey_policy::stream::{OutputFilter, OutputRules, Stop};
use osprey_policy::{Action, Category, Source, Verdict};
use osprey_store::{AuditEntry, Store};

use crate::edge::Caller;
use crate::outbound::{Seen, Step};
use serde_json::Value;

/// The pipelines by policy name, and the standard one.
#[derive(Clone)]
pub struct Policies {
    named: BTreeMap<String, Arc<Pipeline>>,
    standard: Arc<Pipeline>,
}

impl Default for Policies {
    fn default() -> Self {
        Self::new(BTreeMap::new())
    }
}

impl Policies {
    /// Pipelines for `configs` by name; `standard` (if named) replaces the standard policy.
    pub fn new(configs: BTreeMap<String, PolicyConfig>) -> Self {
        let mut named: BTreeMap<String, Arc<Pipeline>> = configs
            .into_iter()
            .map(|(name, c)| (name, Arc::new(Pipeline::new(c))))
            .collect();
        let standard = named
            .remove(STANDARD)
            .unwrap_or_else(|| Arc::new(Pipeline::default()));
        Self { named, standard }
    }

    /// The pipeline of policy `name` (the standard one for `None` or an unknown name).
    pub fn get(&self, name: Option<&str>) -> &Arc<Pipeline> {
        name.and_then(|n| self.named.get(n))
            .unwrap_or(&self.standard)
    }

    /// Whether a policy `name` is defined (`standard` always is).
    pub fn has(&self, name: &str) -> bool {
        name == STANDARD || self.named.contains_key(name)
    }
}

/// The name of the standard policy.
pub const STANDARD: &str = "standard";

/// Bodies larger than this are screened on a blocking thread, off the async workers.
pub const SCREEN_INLINE_BYTES: usize = 32 << 10;

/// Screens a request's input under `pipeline`, refusing a caller throttled for abuse and
/// counting the attacks it is flagged for.
pub async fn screen(
    state: &crate::state::Services,
    pipeline: &Arc<Pipeline>,
    auditor: &Auditor,
    body: &mut JsonBody,
) -> Result<Screened, Error> {
    let limit = pipeline.config().abuse_limit();
    let key = auditor.key().filter(|_| limit.is_some());
    if let (Some(key), Some(limit)) = (key, limit)
        && let Some(wait) = state.abuse().throttled(key, limit)
    {
        return Err(throttled(wait));
    }
    let screened = match body.received_len() > SCREEN_INLINE_BYTES {
        false => screen_input(pipeline, auditor, body),
        true => {
            let (pipeline, auditor) = (pipeline.clone(), auditor.clone());
            let mut owned = std::mem::take(body);
            let handle = tokio::runtime::Handle::current();
            let screened;
            (*body, screened) = tokio::task::spawn_blocking(move || {
                // The auditor spawns its store writes on the runtime.
                let _runtime = handle.enter();
                let screened = screen_input(&pipeline, &auditor, &mut owned);
                (owned, screened)
            })
            .await
            .map_err(|e| Error::new(ErrorKind::Internal, e.to_string()))?;
            screened
        }
    };
    let attack = match &screened {
        Ok(s) => s.attack,
        Err(e) => e.code.as_deref() == Some("content_policy_violation"),
    };
    if let (Some(key), Some(limit), true) = (key, limit, attack)
        && state.abuse().record(key) == limit as usize
    {
        tracing::warn!(
            tenant = auditor.tenant(),
            key,
            limit,
            "key throttled for abuse"
        );
        metrics::counter!(osprey_core::metrics::ABUSE_THROTTLED, "tenant" => auditor.tenant().to_owned())
            .increment(1);
    }
    screened
}

/// What screening a request's input (in place) found.
pub struct Screened {
    /// What was redacted, to be put back in the answer (when the policy says so).
    pub restore: Option<Arc<Redactor>>,
    /// Whether an injection or jailbreak was flagged (for abuse counting).
    pub attack: bool,
}

/// Whether `verdict` acts on an injection or a jailbreak.
fn is_attack(verdict: &Verdict) -> bool {
    verdict.flagged(Category::PromptInjection) || verdict.flagged(Category::Jailbreak)
}

/// Screens the input of a generation request (`body`; one that is not JSON is left to the
/// handler to refuse) under `pipeline`, recording verdicts with `auditor`.
pub fn screen_input(
    pipeline: &Pipeline,
    auditor: &Auditor,
    body: &mut JsonBody,
) -> Result<Screened, Error> {
    let logprobs = matches!(body.get("logprobs"), Value::Bool(true) | Value::Number(_));
    if logprobs && pipeline.config().output_rules().is_active() {
        return Err(Error::invalid(
            "logprobs",
            "logprobs are not available under this tenant's output policy: they would show \
             text the policy holds back.",
        ));
    }
    let mut redactor = Redactor::default();
    let (redacted, attack) = body.change(|v| {
        let screened = screen_texts(pipeline, auditor, v, &mut redactor);
        (screened.as_ref().map_or(true, |s| s.0), screened)
    })?;
    Ok(Screened {
        attack,
        restore: (redacted && pipeline.config().restore_pii).then(|| Arc::new(redactor)),
    })
}

/// Screens the texts of the messages (or the prompt) of `v`, redacting them in place with
/// `redactor`: whether anything was redacted, and whether an attack was flagged.
fn screen_texts(
    pipeline: &Pipeline,
    auditor: &Auditor,
    v: &mut Value,
    redactor: &mut Redactor,
) -> Result<(bool, bool), Error> {
    let (mut redacted, mut attack) = (false, false);
    let mut screen = |text: &mut String, source: Source| -> Result<(), Error> {
        let verdict = pipeline.check(text, source);
        auditor.record(source, &verdict);
        attack |= is_attack(&verdict);
        match verdict.action {
            Action::Block => Err(blocked(&verdict)),
            Action::Redact => {
                *text = redactor.redact(text, None);
                redacted = true;
                Ok(())
            }
            Action::Allow | Action::Flag => Ok(()),
        }
    };
    if let Some(messages) = v.get_mut("messages").and_then(Value::as_array_mut) {
        for m in messages {
            let source = match m["role"].as_str() {
                Some("user") => Source::User,
                Some("tool" | "function") => Source::Untrusted,
                _ => continue,
            };
            for text in texts(&mut m["content"]) {
                screen(text, source)?;
            }
        }
    } else if let Some(prompt) = v.get_mut("prompt") {
        for text in texts(prompt) {
            screen(text, Source::User)?;
        }
    }
    Ok((redacted, attack))
}

/// Guard-out, a step of the way out ([`crate::outbound`]): every choice of an answer through
/// its own filter of the policy's output rules, with the values redacted from the caller's
/// input put back where the policy says so. A streamed choice is released through the filter's
/// hold-back window, and one the rules stop ends the stream with `finish_reason:
/// content_filter`. A whole answer's choice is filtered whole at its finish; one the rules stop
/// is emptied, with the same finish reason. Fields of another server's deltas that Osprey does
/// not know ([`ChoiceDelta::extra`]) are not sent.
pub struct GuardOut {
    rules: OutputRules,
    restore: Option<Arc<Redactor>>,
    auditor: Auditor,
    /// Whether the answer is whole (not streamed).
    whole: bool,
    /// Each choice's filter and, for a whole answer, its text so far; by index.
    choices: BTreeMap<usize, (OutputFilter, String)>,
}

impl GuardOut {
    /// The step for `pipeline`'s output rules, restoring `restore`'s values, over a whole answer
    /// if `whole`; none when there is nothing to do.
    pub fn new(
        pipeline: &Pipeline,
        restore: Option<Arc<Redactor>>,
        auditor: Auditor,
        whole: bool,
    ) -> Option<Self> {
        let rules = pipeline.config().output_rules();
        (rules.is_active() || restore.is_some()).then(|| Self {
            rules,
            restore,
            auditor,
            whole,
            choices: BTreeMap::new(),
        })
    }
}

impl Step for GuardOut {
    fn delta(&mut self, delta: &mut ChoiceDelta) -> Seen {
        let (rules, restore) = (&self.rules, &self.restore);
        let (filter, held) = (self.choices.entry(delta.index))
            .or_insert_with(|| (OutputFilter::new(rules, restore.clone()), String::new()));
        let text = std::mem::take(&mut delta.text);
        // Fields Osprey does not know (a reasoning model's `reasoning_content`) are not read
        // by the rules, so they do not go out under them.
        delta.extra = None;
        let finishing = delta.finish.is_some();
        let out = match self.whole {
            true if !finishing => {
                held.push_str(&text);
                Ok(String::new())
            }
            true => {
                held.push_str(&text);
                filter.filter_all(held)
            }
            false => filter.push(&text).and_then(|released| match finishing {
                true => filter.finish().map(|rest| released + &rest),
                false => Ok(released),
            }),
        };
        match out {
            Ok(released) => {
                delta.text = released;
                match delta.is_empty() {
                    true => Seen::Drop,
                    false => Seen::Send,
                }
            }
            Err(stop) => {
                self.auditor.stopped(stop);
                delta.finish = Some(FinishReason::ContentFilter);
                match self.whole {
                    // The backend finishes the answer, for its usage; this choice is over.
                    true => Seen::Send,
                    false => Seen::Last,
                }
            }
        }
    }
}

/// The strings of a message content or a prompt: a string, text parts, or a list of strings.
fn texts(content: &mut Value) -> Vec<&mut String> {
    match content {
        Value::String(s) => vec![s],
        Value::Array(items) => items
            .iter_mut()
            .filter_map(|item| match item {
                Value::String(s) => Some(s),
                Value::Object(part) => match part.get_mut("text") {
                    Some(Value::String(s)) => Some(s),
                    _ => None,
                },
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Records the verdicts of one caller's request: counted, logged and written to the audit
/// log, never with the text.
#[derive(Clone)]
pub struct Auditor {
    store: Option<Store>,
    audit: Audit,
    tenant: String,
    key_id: Option<String>,
    /// The request's record, which gets every verdict too.
    record: Arc<crate::record::RequestRecord>,
}

impl Auditor {
    /// For `caller`, writing the verdicts `audit` covers to `store` if there is one.
    pub fn new(store: Option<Store>, audit: Audit, caller: &Caller) -> Self {
        Self {
            store,
            audit,
            tenant: caller.tenant.name.clone(),
            key_id: caller.key_id.clone(),
            record: caller.record.clone(),
        }
    }

    /// The tenant of the request.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The key abuse is counted against, if the request used one.
    pub fn key(&self) -> Option<&str> {
        self.key_id.as_deref()
    }

    /// Records the findings of `verdict` acted on.
    pub fn record(&self, source: Source, verdict: &Verdict) {
        let acted = verdict.findings.iter().filter(|(_, a)| *a > Action::Allow);
        let entries: Vec<AuditEntry> = acted
            .map(|(f, a)| self.entry(source, f.category.as_str(), f.rule, *a, f.score))
            .filter(|(_, action)| self.audit.covers(*action))
            .map(|(entry, _)| entry)
            .collect();
        self.write(entries);
    }

    /// Records an answer the output rules stopped.
    fn stopped(&self, stop: Stop) {
        let category = match stop {
            Stop::Denied => "denied",
            Stop::Pii(_) => "pii",
        };
        let (entry, action) = self.entry(Source::Model, category, stop.rule(), Action::Block, 1.0);
        if self.audit.covers(action) {
            self.write(vec![entry]);
        }
    }

    fn entry(
        &self,
        source: Source,
        category: &str,
        rule: &str,
        action: Action,
        score: f32,
    ) -> (AuditEntry, Action) {
        metrics::counter!(
            osprey_core::metrics::GUARD_VERDICTS,
            "tenant" => self.tenant.clone(),
            "category" => category.to_owned(),
            "action" => action_name(action),
            "source" => source_name(source),
        )
        .increment(1);
        tracing::warn!(
            tenant = %self.tenant,
            key = self.key_id.as_deref().unwrap_or("-"),
            source = source_name(source),
            category,
            rule,
            score,
            action = action_name(action),
            "guard verdict"
        );
        self.record.note(|n| {
            n.guards.push(crate::record::GuardNote {
                source: source_name(source).to_owned(),
                category: category.to_owned(),
                rule: rule.to_owned(),
                action: action_name(action).to_owned(),
                score,
            })
        });
        let entry = AuditEntry {
            at: 0,
            tenant: self.tenant.clone(),
            key_id: self.key_id.clone(),
            source: source_name(source).to_owned(),
            category: category.to_owned(),
            rule: rule.to_owned(),
            action: action_name(action).to_owned(),
            score: f64::from(score),
        };
        (entry, action)
    }

    fn write(&self, entries: Vec<AuditEntry>) {
        if let (Some(store), false) = (self.store.clone(), entries.is_empty()) {
            tokio::spawn(async move {
                if let Err(e) = store.audit(&entries).await {
                    tracing::error!(error = %e, "the audit log could not be written");
                }
            });
        }
    }
}

/// How far back flagged requests count towards a key's abuse limit.
pub const ABUSE_WINDOW: Duration = Duration::from_secs(600);

/// Flagged requests per key within [`ABUSE_WINDOW`].
#[derive(Default)]
pub struct Abuse {
    flagged: Mutex<HashMap<String, VecDeque<Instant>>>,
}

impl Abuse {
    /// Counts a flagged request of `who`; returns how many it has in the window.
    pub fn record(&self, who: &str) -> usize {
        let mut flagged = self.flagged.lock().expect("abuse lock");
        let times = flagged.entry(who.to_owned()).or_default();
        let now = Instant::now();
        times.push_back(now);
        while times.front().is_some_and(|t| now - *t > ABUSE_WINDOW) {
            times.pop_front();
        }
        times.len()
    }

    /// If `who` has `limit` flagged requests or more in the window: how long until it has
    /// fewer.
    pub fn throttled(&self, who: &str, limit: u32) -> Option<Duration> {
        let mut flagged = self.flagged.lock().expect("abuse lock");
        let times = flagged.get_mut(who)?;
        let now = Instant::now();
        while times.front().is_some_and(|t| now - *t > ABUSE_WINDOW) {
            times.pop_front();
        }
        let over = times.len().checked_sub(limit as usize)?;
        // Room again once the oldest `over + 1` have left the window.
        let t = times.get(over)?;
        Some(ABUSE_WINDOW.saturating_sub(now - *t))
    }
}

/// The refusal of a throttled key.
pub fn throttled(wait: Duration) -> Error {
    Error::new(
        ErrorKind::RateLimited,
        "Too many of this key's recent requests were flagged by the safety policy; it is \
         throttled for a while.",
    )
    .with_code("abuse_throttled")
    .with_retry_after(wait.as_secs().max(1))
}

/// The refusal of a blocked input, naming the rules that blocked it.
fn blocked(verdict: &Verdict) -> Error {
    let rules: Vec<&str> = (verdict.findings.iter())
        .filter(|(_, a)| *a == Action::Block)
        .map(|(f, _)| f.rule)
        .collect();
    Error::invalid(
        "messages",
        format!(
            "The request was refused by the safety policy ({}).",
            rules.join(", ")
        ),
    )
    .with_code("content_policy_violation")
}

/// An action's name.
pub fn action_name(action: Action) -> &'static str {
    match action {
        Action::Allow => "allow",
        Action::Flag => "flag",
        Action::Redact => "redact",
        Action::Block => "block",
    }
}

fn source_name(source: Source) -> &'static str {
    match source {
        Source::User => "user",
        Source::Untrusted => "untrusted",
        Source::Model => "model",
    }
}
