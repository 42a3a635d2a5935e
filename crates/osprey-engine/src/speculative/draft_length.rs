//! How many tokens a sequence drafts next, from how many of its recent drafts were accepted.

/// A sequence's draft length: it grows by one after a draft accepted whole and falls to one
/// more than what was accepted after a rejection, between 1 and `max`. A sequence whose drafts
/// keep failing therefore drafts a single token (one extra row a step), and one copying a
/// passage climbs to `max` within a few steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftLength {
    next: usize,
    max: usize,
}

impl DraftLength {
    /// Starts at `max.min(start)`; `max` is at least 1.
    pub fn new(start: usize, max: usize) -> Self {
        let max = max.max(1);
        Self {
            next: start.clamp(1, max),
            max,
        }
    }

    /// Tokens to draft next.
    pub fn next(&self) -> usize {
        self.next
    }

    /// Records that `accepted` of `drafted` tokens were accepted.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        debug_assert!(accepted <= drafted);
        if drafted == 0 {
            return;
        }
        self.next = if accepted == drafted {
            self.next + 1
        } else {
            accepted + 1
        }
        .clamp(1, self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_on_acceptance_and_falls_on_rejection() {
        let mut d = DraftLength::new(2, 5);
        d.record(2, 2);
        assert_eq!(d.next(), 3);
        d.record(3, 3);
        d.record(4, 4);
        d.record(5, 5);
        assert_eq!(d.next(), 5, "capped");
        d.record(5, 2);
        assert_eq!(d.next(), 3, "one past what was accepted");
        d.record(3, 0);
        assert_eq!(d.next(), 1, "never below one");
        d.record(0, 0);
        assert_eq!(d.next(), 1, "no draft, no change");
        assert_eq!(DraftLength::new(9, 4).next(), 4);
        assert_eq!(DraftLength::new(0, 0).next(), 1);
    }
}
