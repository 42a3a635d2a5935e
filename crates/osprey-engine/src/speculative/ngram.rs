//! Prompt-lookup drafts from an index of the sequence's own n-grams.

use std::collections::HashMap;

/// Finds drafts for one sequence by matching its latest `n` tokens (`max_n` down to `min_n`)
/// against its earlier tokens. The index grows with the sequence ([`Self::extend`]): lookups
/// cost `O(max_n − min_n)` hash probes, whatever the sequence's length.
#[derive(Clone, Debug)]
pub struct NgramProposer {
    min_n: usize,
    max_n: usize,
    /// The tokens indexed so far (the sequence's prompt and output).
    tokens: Vec<u32>,
    /// For each n-gram that ended before the last token, keyed by its length and hash: the
    /// position just after its latest occurrence.
    ends: HashMap<(usize, u64), usize>,
}

impl NgramProposer {
    /// A proposer matching n-grams of `min_n..=max_n` tokens (`1 <= min_n <= max_n`).
    pub fn new(min_n: usize, max_n: usize) -> Self {
        assert!(
            1 <= min_n && min_n <= max_n,
            "n-gram lengths {min_n}..={max_n}"
        );
        Self {
            min_n,
            max_n,
            tokens: Vec::new(),
            ends: HashMap::new(),
        }
    }

    /// Tokens indexed.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Appends `new` tokens to the sequence.
    pub fn extend(&mut self, new: &[u32]) {
        for &t in new {
            // The n-grams ending at the current last token become findable once a token
            // follows them (a match must have something after it to propose).
            let end = self.tokens.len();
            for n in self.min_n..=self.max_n.min(end) {
                let key = (n, hash(&self.tokens[end - n..end]));
                self.ends.insert(key, end);
            }
            self.tokens.push(t);
        }
    }

    /// Forgets every token after the first `len` (the sequence was cut back, say preempted
    /// and resumed from a shorter prefix), rebuilding the index.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.tokens.len() {
            return;
        }
        let kept = self.tokens[..len].to_vec();
        self.tokens.clear();
        self.ends.clear();
        self.extend(&kept);
    }

    /// Up to `k` tokens that followed the latest earlier occurrence of the sequence's longest
    /// matching suffix; empty when no suffix of `min_n` tokens or more occurred before.
    pub fn propose(&self, k: usize) -> &[u32] {
        let len = self.tokens.len();
        if k == 0 {
            return &[];
        }
        for n in (self.min_n..=self.max_n.min(len)).rev() {
            let suffix = &self.tokens[len - n..];
            let Some(&end) = self.ends.get(&(n, hash(suffix))) else {
                continue;
            };
            // A hash collision is a miss, not a wrong draft.
            if end >= n && &self.tokens[end - n..end] == suffix {
                return &self.tokens[end..(end + k).min(len)];
            }
        }
        &[]
    }
}

/// FNV-1a over the token ids.
fn hash(tokens: &[u32]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for t in tokens {
        for b in t.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn indexed(tokens: &[u32]) -> NgramProposer {
        let mut p = NgramProposer::new(2, 4);
        p.extend(tokens);
        p
    }

    #[test]
    fn a_repeated_passage_drafts_what_followed_it() {
        // "1 2 3 4 5 6 ... 1 2 3": the suffix "1 2 3" occurred at the start, followed by 4 5 6.
        let p = indexed(&[1, 2, 3, 4, 5, 6, 9, 9, 1, 2, 3]);
        assert_eq!(p.propose(3), &[4, 5, 6]);
        assert_eq!(p.propose(10), &[4, 5, 6, 9, 9, 1, 2, 3], "up to the end");
        assert_eq!(p.propose(0), &[] as &[u32]);
    }

    #[test]
    fn the_longest_match_wins_then_the_latest_occurrence() {
        // "7 8" occurs twice: after "5 7 8" (then 1) and after "6 7 8" (then 2). The suffix
        // "6 7 8" matches the second occurrence with 3 tokens; "7 8" alone would take the
        // latest too, but a shorter match is only a fallback.
        let p = indexed(&[5, 7, 8, 1, 6, 7, 8, 2, 0, 5, 7, 8]);
        assert_eq!(p.propose(1), &[1], "longest: 5 7 8 -> 1");
        let p = indexed(&[5, 7, 8, 1, 6, 7, 8, 2, 0, 3, 7, 8]);
        assert_eq!(
            p.propose(1),
            &[2],
            "only 7 8 matches: its latest occurrence"
        );
    }

    #[test]
    fn nothing_is_drafted_without_a_match_of_min_n() {
        assert!(indexed(&[1, 2, 3, 4, 5]).propose(4).is_empty());
        assert!(
            indexed(&[1, 2, 3, 9, 3]).propose(4).is_empty(),
            "one token is too short"
        );
        assert!(indexed(&[]).propose(4).is_empty());
    }

    #[test]
    fn extending_and_truncating_keep_the_index_exact() {
        let tokens = [4, 1, 2, 3, 4, 1, 2, 5, 4, 1, 2];
        let mut step = NgramProposer::new(2, 4);
        for &t in &tokens {
            step.extend(&[t]);
        }
        assert_eq!(step.propose(2), indexed(&tokens).propose(2));
        assert_eq!(
            step.propose(2),
            &[5, 4],
            "the latest 4 1 2 was followed by 5"
        );
        step.truncate(7); // 4 1 2 3 4 1 2
        assert_eq!(step.propose(2), &[3, 4]);
        assert_eq!(step.len(), 7);
    }
}
