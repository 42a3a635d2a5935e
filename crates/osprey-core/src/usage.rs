//! The token usage of a request as its backend reports it, read by whoever settles it (the
//! edge's rate limits, the request log) once the answer is done.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The actual token usage of a request, filled in by whoever served it.
#[derive(Debug, Default)]
pub struct UsageReport {
    prompt: AtomicU64,
    completion: AtomicU64,
    known: AtomicBool,
    prompt_known: AtomicBool,
}

impl UsageReport {
    /// Records the usage.
    pub fn set(&self, prompt: u64, completion: u64) {
        self.prompt.store(prompt, Ordering::Relaxed);
        self.completion.store(completion, Ordering::Relaxed);
        self.prompt_known.store(true, Ordering::Relaxed);
        self.known.store(true, Ordering::Relaxed);
    }

    /// `(prompt, completion)` tokens as far as they are known.
    pub fn tokens(&self) -> (Option<u64>, Option<u64>) {
        let known = self.known.load(Ordering::Relaxed);
        let prompt = self.prompt_known.load(Ordering::Relaxed);
        (
            prompt.then(|| self.prompt.load(Ordering::Relaxed)),
            known.then(|| self.completion.load(Ordering::Relaxed)),
        )
    }

    /// Records completion tokens only (the prompt's count is not known).
    pub fn set_completion_only(&self, completion: u64) {
        self.completion.store(completion, Ordering::Relaxed);
        self.known.store(true, Ordering::Relaxed);
    }
}
