//! The engine loop's side of the KV tiers ([`crate::tiers`]): evicted blocks go down, and a new
//! request whose prefix is below the hot pool waits, parked, while its blocks come up.
//!
//! Order matters around the pool: a block evicted by an allocation still holds its old
//! contents until the next forward pass (or a fetched block) writes there, so every allocation
//! is followed by [`Tiering::demote`] before anything is written.

use std::collections::HashMap;
use std::time::Duration;

use osprey_core::metrics as names;
use osprey_models::{BLOCK_SIZE, KvCache};

use crate::kv::{BlockHash, KvCacheManager, prefix_hashes};
use crate::sequence::Sequence;
use crate::tiers::KvTiers;

/// Hashes of a prompt's full blocks with their tokens, in chain order.
type Chain = Vec<(BlockHash, [u32; BLOCK_SIZE])>;

/// The tiers' handle and the sequences waiting on them.
pub struct Tiering {
    tiers: KvTiers,
    /// Sequences whose prefix blocks are being fetched, by ticket.
    parked: HashMap<u64, Sequence>,
    /// Blocks brought back into the pool so far, per tier (warm, cold, shared).
    pub promoted: [u64; 3],
}

impl Tiering {
    pub fn new(tiers: KvTiers) -> Self {
        Self {
            tiers,
            parked: HashMap::new(),
            promoted: [0; 3],
        }
    }

    /// Whether sequences wait on fetches.
    pub fn waiting(&self) -> bool {
        !self.parked.is_empty()
    }

    /// Sequences parked.
    pub fn num_parked(&self) -> usize {
        self.parked.len()
    }

    /// Parks `seq` if part of its prompt's prefix (salted with `salt`) is missing from the pool,
    /// asking the tiers for it; otherwise gives it back to be scheduled at once.
    pub fn park(&mut self, seq: Sequence, salt: &str, kv: &KvCacheManager) -> Option<Sequence> {
        if !seq.prefix_cacheable {
            return Some(seq);
        }
        let chain: Chain = prefix_hashes(salt, &seq.tokens)
            .into_iter()
            .zip(seq.tokens.chunks_exact(BLOCK_SIZE))
            .map(|(h, t)| (h, t.try_into().expect("a full block")))
            .collect();
        let hot = kv.cached_prefix_len(&chain);
        if hot == chain.len() {
            return Some(seq);
        }
        let ticket = self.tiers.fetch(chain[hot..].to_vec());
        self.parked.insert(ticket, seq);
        None
    }

    /// Sends the blocks the pool evicted since the last call down the tiers (reading their
    /// contents, which are still in place).
    pub fn demote(&self, manager: &mut KvCacheManager, kv: &KvCache) {
        let evicted = manager.take_evicted();
        if evicted.is_empty() {
            return;
        }
        metrics::counter!(names::KV_TIER_DEMOTED).increment(evicted.len() as u64);
        for e in evicted {
            let mut data = Vec::with_capacity(kv.block_len());
            kv.read_block(e.block, &mut data);
            self.tiers.store(e.hash, e.tokens, data, e.heat);
        }
    }

    /// Puts the blocks of finished fetches into the pool's prefix cache and returns their
    /// sequences, ready to be scheduled (waiting up to `wait` for a fetch when none is done).
    pub fn collect(
        &mut self,
        manager: &mut KvCacheManager,
        kv: &mut KvCache,
        wait: Duration,
    ) -> Vec<Sequence> {
        let mut ready = Vec::new();
        for fetched in self.tiers.poll(wait) {
            let Some(seq) = self.parked.remove(&fetched.ticket) else {
                continue;
            };
            for block in fetched.blocks {
                if let Some(b) = manager.adopt(block.hash, &block.tokens) {
                    self.demote(manager, kv);
                    kv.write_block(b, &block.data);
                    metrics::counter!(names::KV_TIER_PROMOTED, "tier" => block.tier.as_str())
                        .increment(1);
                    self.promoted[block.tier as usize] += 1;
                }
            }
            if !seq.is_cancelled() {
                ready.push(seq);
            }
        }
        ready
    }
}
