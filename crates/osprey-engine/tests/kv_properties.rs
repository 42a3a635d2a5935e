//! Block accounting under random traffic: arrivals sharing prefixes, prefill and decode steps,
//! speculative steps whose rejected drafts are rolled back, finishes, cancellations and
//! preemptions, on a pool small enough to run out, with one KV group or several, windowed ones
//! among them. After every operation the pool must balance exactly, a windowed group must hold
//! no more than its window needs, and no sequence may be left to read a page it gave back.

use osprey_engine::kv::{BlockTable, KvCacheManager, SharedKvCacheManager};
use osprey_models::{BLOCK_SIZE, NO_BLOCK};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

#[derive(Clone, Debug)]
enum Op {
    /// A new sequence: `shared` leading tokens of one of three common prefixes, then its own.
    Arrive {
        prefix: usize,
        shared: usize,
        own: usize,
        seed: u32,
    },
    /// Sequence `seq` computes up to `n` more tokens (sampling one first if its prompt is done).
    Step { seq: usize, n: usize },
    /// Sequence `seq` finishes or its client disconnects: its table is dropped.
    Finish { seq: usize },
    /// Sequence `seq` is preempted: blocks released, recomputed later.
    Preempt { seq: usize },
    /// Sequence `seq` decodes with a draft of `k` tokens, of which the first `accept` are
    /// accepted: it reserves room for all of them, keeps the accepted ones and a token of its
    /// own, and gives back what lies past them.
    Draft { seq: usize, k: usize, accept: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0..3usize, 0..70usize, 1..30usize, any::<u32>())
            .prop_map(|(prefix, shared, own, seed)| Op::Arrive { prefix, shared, own, seed }),
        4 => (any::<usize>(), 1..48usize).prop_map(|(seq, n)| Op::Step { seq, n }),
        1 => any::<usize>().prop_map(|seq| Op::Finish { seq }),
        1 => any::<usize>().prop_map(|seq| Op::Preempt { seq }),
        2 => (any::<usize>(), 1..24usize, 0..24usize)
            .prop_map(|(seq, k, accept)| Op::Draft { seq, k, accept }),
    ]
}

struct Seq {
    tokens: Vec<u32>,
    computed: usize,
    table: BlockTable,
}

fn common_prefix(which: usize) -> Vec<u32> {
    (0..70).map(|i| (which as u32) * 1000 + i).collect()
}

/// What the scheduler does for one sequence's step: match a prefix if it holds nothing,
/// reserve, and commit, or preempt itself when the pool is dry.
fn step(seq: &mut Seq, n: usize) {
    if seq.computed == seq.tokens.len() {
        let next = seq
            .tokens
            .last()
            .map_or(0, |t| t.wrapping_mul(31).wrapping_add(7))
            % 5000;
        seq.tokens.push(next);
    }
    if seq.table.is_empty() {
        seq.computed = seq.table.match_prefix(&seq.tokens);
        assert_eq!(seq.computed % BLOCK_SIZE, 0);
        assert!(
            seq.computed < seq.tokens.len(),
            "a hit leaves a token to compute"
        );
    }
    let need = seq.computed + n.min(seq.tokens.len() - seq.computed);
    if seq.table.reserve(need) {
        seq.computed = need;
        seq.table.commit(&seq.tokens, seq.computed);
    } else {
        seq.table.release();
        seq.computed = 0;
    }
}

/// A speculative decode step, for a sequence whose prompt is computed: as in [`step`], its
/// next token is sampled; rows for it and for a draft of `k` are reserved; the first `accept`
/// drafted tokens are accepted and join the sequence (the token the last verified row gives is
/// sampled at its next step), and the table shrinks to the rows kept.
fn draft(seq: &mut Seq, k: usize, accept: usize) {
    if seq.table.is_empty() || seq.computed != seq.tokens.len() {
        return; // not decoding
    }
    let last = *seq.tokens.last().expect("a prompt");
    seq.tokens
        .push(last.wrapping_mul(31).wrapping_add(7) % 5000);
    if !seq.table.reserve(seq.computed + 1 + k) {
        seq.table.release();
        seq.computed = 0;
        return;
    }
    let accepted = accept.min(k);
    for i in 0..accepted {
        seq.tokens
            .push((last.wrapping_mul(7) + i as u32 + 1) % 5000);
    }
    seq.computed += 1 + accepted;
    seq.table.commit(&seq.tokens, seq.computed);
    seq.table.shrink(seq.computed);
    for table in seq.table.tables() {
        assert_eq!(
            table.len(),
            seq.computed.div_ceil(BLOCK_SIZE),
            "nothing past the kept rows"
        );
    }
}

fn check(manager: &SharedKvCacheManager, seqs: &[Seq]) {
    let m = manager.borrow();
    let a = m.allocator();
    let total = a.num_total();
    let mut holders = vec![0u32; total];
    for s in seqs {
        for (table, w) in s.table.tables().iter().zip(m.windows()) {
            assert!(table.len() >= s.computed.div_ceil(BLOCK_SIZE));
            // What the next position sees is held; in a windowed group, nothing before it.
            let seen = w.map_or(0, |w| (s.computed + 1).saturating_sub(w) / BLOCK_SIZE);
            let needed = seen..s.computed.div_ceil(BLOCK_SIZE);
            assert!(
                table[needed].iter().all(|&b| b != NO_BLOCK),
                "a page the sequence reads was given back"
            );
            if let Some(w) = w {
                assert!(
                    table[..seen].iter().all(|&b| b == NO_BLOCK),
                    "held behind the window"
                );
                let live = table.iter().filter(|&&b| b != NO_BLOCK).count();
                assert!(
                    live <= w.div_ceil(BLOCK_SIZE) + 1,
                    "{live} pages for a window of {w}"
                );
            }
        }
        for b in s.table.held() {
            holders[b as usize] += 1;
        }
    }
    let free = a.free_queue();
    assert_eq!(free.len(), a.num_free());
    let mut in_free = vec![false; total];
    for &b in &free {
        assert!(!in_free[b as usize], "block {b} twice in the free queue");
        in_free[b as usize] = true;
    }
    let mut used = 0;
    for b in 0..total {
        assert_eq!(a.ref_count(b as u32), holders[b], "refcount of block {b}");
        assert_eq!(
            in_free[b],
            holders[b] == 0,
            "block {b} is free iff unreferenced"
        );
        used += usize::from(holders[b] > 0);
    }
    assert_eq!(free.len() + used, total, "free + used = pool");
    let cache = m.prefix_cache();
    for (block, hash, tokens) in cache.entries() {
        assert_eq!(
            cache.get(hash, tokens),
            Some(block),
            "cached block {block} is reachable"
        );
    }
    // No sequence reads a cached block holding other tokens than its own.
    for s in seqs {
        for table in s.table.tables() {
            for (i, &b) in table.iter().enumerate().take(s.computed / BLOCK_SIZE) {
                if let Some((_, _, tokens)) = cache.entries().find(|e| e.0 == b) {
                    assert_eq!(tokens, &s.tokens[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE]);
                }
            }
        }
    }
}

proptest! {
    // Failures are kept next to this file (`kv_properties.proptest-regressions`) and replayed
    // first. Proptest's default looks for a folder above this file holding a `main.rs` (now
    // `tests/`, whose `main.rs` makes this file a module) and would keep them in
    // `proptest-regressions/kv_properties.txt` beside it instead.
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn block_accounting_balances(
        ops in prop::collection::vec(op(), 1..200),
        pool in 4..24usize,
        windows in prop_oneof![
            Just(vec![None]),
            // Gemma 3's shape: a full group, then windowed ones.
            Just(vec![None, Some(40), Some(40)]),
            // Mistral's: every layer windowed.
            Just(vec![Some(24)]),
        ],
    ) {
        let pool = pool * windows.len();
        let manager = KvCacheManager::grouped(pool, true, windows);
        let mut seqs: Vec<Seq> = Vec::new();
        for op in ops {
            match op {
                Op::Arrive { prefix, shared, own, seed } => {
                    let mut tokens = common_prefix(prefix)[..shared].to_vec();
                    tokens.extend((0..own as u32).map(|i| 2000 + seed.wrapping_add(i) % 3000));
                    let table = BlockTable::new(manager.clone(), if seed % 7 == 0 { "other" } else { "" });
                    seqs.push(Seq { tokens, computed: 0, table });
                }
                Op::Step { seq, n } if !seqs.is_empty() => {
                    let i = seq % seqs.len();
                    step(&mut seqs[i], n);
                }
                Op::Finish { seq } if !seqs.is_empty() => {
                    seqs.swap_remove(seq % seqs.len());
                }
                Op::Draft { seq, k, accept } if !seqs.is_empty() => {
                    let i = seq % seqs.len();
                    draft(&mut seqs[i], k, accept);
                }
                Op::Preempt { seq } if !seqs.is_empty() => {
                    let i = seq % seqs.len();
                    let s = &mut seqs[i];
                    s.table.release();
                    s.computed = 0;
                }
                _ => {}
            }
            check(&manager, &seqs);
        }
        seqs.clear();
        check(&manager, &seqs);
        let m = manager.borrow();
        prop_assert_eq!(m.num_free_blocks(), pool, "nothing leaks");
        let c = m.counters();
        prop_assert!(c.hit_tokens <= c.queried_tokens);
    }
}
