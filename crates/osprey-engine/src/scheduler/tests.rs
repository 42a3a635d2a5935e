//! The scheduler's unit tests: admission, budgets, preemption, policies.

use osprey_core::SamplingParams;

use super::*;
use crate::kda::{ExpertLayout, KdaConfig};
use crate::kv::KvCacheManager;
use crate::sampler::Sampler;

fn seq(manager: &SharedKvCacheManager, id: u64, prompt_len: usize, priority: Priority) -> Sequence {
    let tokens = (0..prompt_len as u32)
        .map(|i| i + 100 * id as u32)
        .collect();
    Sequence::for_test(manager, id, tokens, priority)
}

fn scheduler(config: SchedulerConfig, blocks: usize) -> (Scheduler, SharedKvCacheManager) {
    let manager = KvCacheManager::new(blocks, true);
    (Scheduler::new(config, manager.clone()), manager)
}

fn running_ids(s: &Scheduler) -> Vec<u64> {
    s.running().iter().map(|q| q.id).collect()
}

/// Marks the planned tokens as computed, as the engine does after a step.
fn run_step(s: &mut Scheduler) -> SchedulerOutput {
    let out = s.schedule();
    for p in &out.scheduled {
        s.running_mut()[p.index].num_computed += p.n_tokens;
    }
    out
}

#[test]
fn interactive_is_admitted_before_earlier_batch() {
    let config = SchedulerConfig {
        max_num_seqs: 2,
        ..SchedulerConfig::default()
    };
    let (mut s, m) = scheduler(config, 64);
    s.add(seq(&m, 1, 20, Priority::Batch));
    s.add(seq(&m, 2, 20, Priority::Batch));
    s.add(seq(&m, 3, 20, Priority::Interactive));
    run_step(&mut s);
    assert_eq!(running_ids(&s), [3, 1]);
}

#[test]
fn interactive_preempts_running_batch_for_a_seat() {
    let config = SchedulerConfig {
        max_num_seqs: 1,
        ..SchedulerConfig::default()
    };
    let (mut s, m) = scheduler(config, 64);
    s.add(seq(&m, 1, 20, Priority::Batch));
    run_step(&mut s);
    assert_eq!(running_ids(&s), [1]);
    s.add(seq(&m, 2, 20, Priority::Interactive));
    run_step(&mut s);
    assert_eq!(running_ids(&s), [2]);
    assert_eq!(s.preemptions(), 1);
    assert_eq!(s.num_waiting(), 1, "the batch sequence waits to be resumed");
}

#[test]
fn out_of_blocks_preempts_the_lowest_priority_newest() {
    // 6 blocks: three 32-token prompts fit (2 blocks each), then growth needs a fourth.
    let (mut s, m) = scheduler(SchedulerConfig::default(), 6);
    s.add(seq(&m, 1, 32, Priority::Interactive));
    s.add(seq(&m, 2, 32, Priority::Batch));
    s.add(seq(&m, 3, 32, Priority::Interactive));
    run_step(&mut s);
    assert_eq!(running_ids(&s), [1, 3, 2]);
    for q in s.running_mut() {
        q.tokens.push(7); // each sampled one token: the next step needs a third block
    }
    let out = run_step(&mut s);
    assert_eq!(
        running_ids(&s),
        [1, 3],
        "batch sequence 2 gave its blocks back"
    );
    assert_eq!(out.scheduled.len(), 2);
    assert_eq!(s.preemptions(), 1);
    assert_eq!(m.borrow().num_free_blocks(), 0);
}

#[test]
fn batch_prefill_is_chunked_while_interactive_work_runs() {
    let config = SchedulerConfig {
        batch_prefill_chunk: 16,
        ..SchedulerConfig::default()
    };
    let (mut s, m) = scheduler(config, 128);
    s.add(seq(&m, 1, 300, Priority::Batch));
    s.add(seq(&m, 2, 8, Priority::Interactive));
    let out = s.schedule();
    let chunks: Vec<(u64, usize)> = out
        .scheduled
        .iter()
        .map(|p| (s.running()[p.index].id, p.n_tokens))
        .collect();
    assert_eq!(chunks, [(2, 8), (1, 16)]);
}

#[test]
fn batch_alone_prefills_at_full_budget() {
    let (mut s, m) = scheduler(SchedulerConfig::default(), 128);
    s.add(seq(&m, 1, 600, Priority::Batch));
    let out = s.schedule();
    assert_eq!(out.scheduled[0].n_tokens, 512);
}

#[test]
fn starving_batch_requests_count_as_interactive() {
    let config = SchedulerConfig {
        max_num_seqs: 1,
        starvation_timeout: Duration::ZERO,
        ..SchedulerConfig::default()
    };
    let (mut s, m) = scheduler(config, 64);
    s.add(seq(&m, 1, 20, Priority::Batch));
    s.add(seq(&m, 2, 20, Priority::Interactive));
    run_step(&mut s);
    assert_eq!(
        running_ids(&s),
        [1],
        "the older request goes first once batch has aged"
    );
}

#[test]
fn fcfs_ignores_priority() {
    let config = SchedulerConfig {
        max_num_seqs: 1,
        policy: SchedulingPolicy::Fcfs,
        ..SchedulerConfig::default()
    };
    let (mut s, m) = scheduler(config, 64);
    s.add(seq(&m, 1, 20, Priority::Batch));
    run_step(&mut s);
    s.add(seq(&m, 2, 20, Priority::Interactive));
    run_step(&mut s);
    assert_eq!(running_ids(&s), [1]);
    assert_eq!(s.preemptions(), 0);
}

#[test]
fn a_prefix_hit_skips_cached_tokens() {
    let (mut s, m) = scheduler(SchedulerConfig::default(), 64);
    s.add(seq(&m, 1, 40, Priority::Interactive));
    let first = run_step(&mut s);
    assert_eq!(first.scheduled[0].n_tokens, 40);
    let done = s.take_running(|_| true);
    // Commit what the step computed, as the engine does, then finish.
    for mut q in done {
        let tokens = q.tokens.clone();
        q.block_table.commit(&tokens, q.num_computed);
    }
    s.add(seq(&m, 1, 40, Priority::Interactive)); // same tokens
    let second = s.schedule();
    assert_eq!(
        second.scheduled[0].n_tokens, 8,
        "two cached blocks are reused"
    );
}

/// One MoE layer of 4 experts, top-1: slot e is expert e.
fn one_layer() -> ExpertLayout {
    ExpertLayout {
        experts: 4,
        top_k: 1,
        layers: 1,
    }
}

/// A running (prefilled) batch sequence whose recent tokens all went to `expert`.
fn decoding(m: &SharedKvCacheManager, id: u64, expert: u32) -> Sequence {
    let mut q = seq(m, id, 8, Priority::Batch);
    q.num_computed = 7;
    assert!(q.block_table.reserve(8));
    q.experts.observe(&one_layer(), &[expert], 1);
    q
}

fn kda(capacity: f32) -> SchedulerConfig {
    SchedulerConfig {
        policy: SchedulingPolicy::Kda,
        kda: KdaConfig {
            expert_capacity: capacity,
            max_deferrals: 2,
            ..KdaConfig::default()
        },
        ..SchedulerConfig::default()
    }
}

fn scheduled_ids(s: &Scheduler, out: &SchedulerOutput) -> Vec<u64> {
    let mut ids: Vec<u64> = out
        .scheduled
        .iter()
        .map(|p| s.running()[p.index].id)
        .collect();
    ids.sort_unstable();
    ids
}

#[test]
fn kda_runs_the_earliest_deadline_first() {
    let config = SchedulerConfig {
        max_num_seqs: 1,
        ..kda(2.0)
    };
    let (mut s, m) = scheduler(config, 64);
    s.add(seq(&m, 1, 20, Priority::Interactive));
    let mut urgent = seq(&m, 2, 20, Priority::Interactive);
    urgent.deadline = Some(Duration::from_millis(100));
    s.add(urgent);
    run_step(&mut s);
    assert_eq!(running_ids(&s), [2], "the later request is due sooner");
}

#[test]
fn kda_promotes_a_batch_request_past_its_deadline() {
    let config = SchedulerConfig {
        max_num_seqs: 1,
        ..kda(2.0)
    };
    let (mut s, m) = scheduler(config, 64);
    let mut late = seq(&m, 1, 20, Priority::Batch);
    late.deadline = Some(Duration::ZERO);
    s.add(late);
    s.add(seq(&m, 2, 20, Priority::Interactive));
    run_step(&mut s);
    assert_eq!(running_ids(&s), [1]);
}

#[test]
fn kda_defers_sequences_that_would_overload_a_hot_expert_but_never_starves_them() {
    // Four decodes: three on expert 0, one on expert 3. Fair share 1 token per expert;
    // capacity 2× lets two tokens onto expert 0.
    let (mut s, m) = scheduler(kda(2.0), 64);
    s.set_expert_layout(Some(one_layer()));
    for (id, e) in [(1, 0), (2, 0), (3, 0), (4, 3)] {
        s.running.push(decoding(&m, id, e));
    }
    let out = s.schedule();
    assert_eq!(scheduled_ids(&s, &out), [1, 2, 4]);
    assert_eq!(s.deferrals(), 1);
    // Deferred twice in a row (max_deferrals), it then runs whatever the load.
    s.schedule();
    let out = s.schedule();
    assert!(scheduled_ids(&s, &out).contains(&3));
    assert_eq!(s.deferrals(), 2);
}

#[test]
fn other_policies_never_defer_for_experts() {
    for policy in [SchedulingPolicy::Priority, SchedulingPolicy::Fcfs] {
        let (mut s, m) = scheduler(SchedulerConfig { policy, ..kda(1.0) }, 64);
        s.set_expert_layout(Some(one_layer()));
        for id in 1..=4 {
            s.running.push(decoding(&m, id, 0));
        }
        let out = s.schedule();
        assert_eq!(out.scheduled.len(), 4, "{policy:?}");
        assert_eq!(s.deferrals(), 0);
    }
}

#[test]
fn kda_puts_demoted_sequences_sharing_the_critical_paths_experts_first() {
    let (mut s, m) = scheduler(kda(4.0), 64);
    s.set_expert_layout(Some(one_layer()));
    let mut critical = decoding(&m, 1, 2);
    critical.priority = Priority::Interactive;
    s.running.push(decoding(&m, 2, 0));
    s.running.push(decoding(&m, 3, 1));
    s.running.push(decoding(&m, 4, 2));
    s.running.push(critical);
    s.schedule();
    assert_eq!(
        running_ids(&s)[..2],
        [1, 4],
        "4 shares expert 2 with the critical path"
    );
}

#[test]
fn the_policy_switches_while_requests_wait() {
    let config = SchedulerConfig {
        max_num_seqs: 1,
        policy: SchedulingPolicy::Fcfs,
        ..SchedulerConfig::default()
    };
    let (mut s, m) = scheduler(config, 64);
    s.add(seq(&m, 1, 20, Priority::Batch));
    s.add(seq(&m, 2, 20, Priority::Interactive));
    s.set_policy(SchedulingPolicy::Kda);
    assert_eq!(s.policy(), SchedulingPolicy::Kda);
    run_step(&mut s);
    assert_eq!(running_ids(&s), [2], "interactive goes first once requeued");
    assert_eq!(s.num_waiting(), 1);
}

#[test]
fn a_long_prompt_waits_until_all_of_it_fits() {
    // 10 blocks; two 100-token prompts (7 blocks each), 128 tokens a step.
    let config = SchedulerConfig {
        max_num_batched_tokens: 128,
        ..SchedulerConfig::default()
    };
    let (mut s, m) = scheduler(config, 10);
    s.add(seq(&m, 1, 100, Priority::Interactive));
    s.add(seq(&m, 2, 100, Priority::Interactive));
    run_step(&mut s);
    assert_eq!(running_ids(&s), [1], "the second would not fit whole");
    assert_eq!(s.running()[0].num_computed, 100);
    assert_eq!(s.num_waiting(), 1);
}

/// Workload E without the model: `clients` conversations over contexts of `context` tokens,
/// each turn its context and a question of its own, 32 tokens out, then the next turn; a pool
/// of `blocks`. Runs `steps` steps the way the engine does (compute, register full blocks,
/// sample once the prompt is in) and returns the turns each client finished.
fn conversations(clients: usize, context: usize, blocks: usize, steps: usize) -> Vec<usize> {
    let (mut s, m) = scheduler(SchedulerConfig::default(), blocks);
    let prompt = |user: usize, turn: usize| -> Vec<u32> {
        let mut t: Vec<u32> = (0..context as u32)
            .map(|i| 1 + i + 10_000 * user as u32)
            .collect();
        t.extend((0..20).map(|i| 5_000_000 + (turn * 100 + i) as u32));
        t
    };
    let mut turn = vec![0; clients];
    let mut next_id = 0;
    let mut add = |s: &mut Scheduler, user: usize, turn: usize| {
        next_id += 1;
        let mut q = seq(&m, next_id, 0, Priority::Interactive);
        q.tokens = prompt(user, turn);
        q.prompt_len = q.tokens.len();
        q.sampler = Sampler::new(
            SamplingParams {
                max_tokens: 32,
                ..SamplingParams::default()
            },
            0,
            &q.tokens,
            Vec::new(),
        );
        q.id = (user as u64) << 32 | next_id;
        s.add(q);
    };
    for user in 0..clients {
        add(&mut s, user, 0);
    }
    for _ in 0..steps {
        let out = s.schedule();
        assert!(out.ended.is_empty(), "nothing is too long for the pool");
        for p in &out.scheduled {
            let q = &mut s.running_mut()[p.index];
            q.num_computed += p.n_tokens;
            q.block_table.commit(&q.tokens, q.num_computed);
            if q.num_computed == q.tokens.len() {
                q.finish = q.push_token(7);
            }
        }
        for q in s.take_running(|q| q.finish.is_some()) {
            let user = (q.id >> 32) as usize;
            turn[user] += 1;
            add(&mut s, user, turn[user]);
        }
    }
    turn
}

#[test]
fn conversations_past_the_pool_all_keep_finishing_turns() {
    // Twice the contexts the pool holds, each recomputed turn after turn: slow, but every
    // client gets through (no livelock, no client starved).
    let turns = conversations(16, 2000, 1092, 3000);
    assert!(turns.iter().all(|&t| t >= 2), "turns per client: {turns:?}");
}

#[test]
fn sequences_taken_out_of_line_go_back_to_their_place() {
    let (mut s, m) = scheduler(SchedulerConfig::default(), 64);
    let start = Instant::now();
    for id in 1..=4 {
        let mut q = seq(&m, id, 16, Priority::Interactive);
        q.arrival = start + Duration::from_millis(id);
        s.add(q);
    }
    let taken = s.take_waiting(|q| q.id % 2 == 0);
    assert_eq!(taken.iter().map(|q| q.id).collect::<Vec<_>>(), [2, 4]);
    assert_eq!(s.num_waiting(), 2);
    for q in taken.into_iter().rev() {
        s.put_back(q);
    }
    let order: Vec<u64> = s.take_waiting(|_| true).iter().map(|q| q.id).collect();
    assert_eq!(order, [1, 2, 3, 4], "in arrival order again");
}
