//! The `kda` policy on a real MoE model: SmolLM2 upcycled by identity into 4 experts, top-2.
//! Its zero router sends every token to experts 0 and 1 of each layer, the most skewed load
//! there is (imbalance exactly 2), so under `kda` with a capacity of 1.5× the fair share the
//! scheduler must hold sequences back, without changing any answer and without starving any.

use std::path::PathBuf;

use candle_core::quantized::GgmlDType;
use osprey_core::{Priority, SamplingParams};
use osprey_engine::{
    Engine, EngineConfig, GenerateRequest, KdaConfig, SchedulerConfig, SchedulingPolicy,
};
use osprey_models::WeightFormat;
use osprey_models::convert::Input;
use osprey_models::convert::upcycle::{UpcycleMode, UpcycleOptions, upcycle};

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn identity_moe() -> TempDir {
    let dir = TempDir(std::env::temp_dir().join(format!("osprey-kda-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    let options = UpcycleOptions {
        mode: UpcycleMode::Identity,
        experts: 4,
        top_k: 2,
        shards: 4,
        expert_format: WeightFormat::Ggml(GgmlDType::Q4_1),
        calibration: Vec::new(),
    };
    let input = Input::open(&osprey_testkit::default_model()).unwrap();
    upcycle(&input, &dir.0, &options, &|_| {}, &|_| {}).unwrap();
    dir
}

/// Greedy tokens of each prompt, all submitted at once as batch work.
async fn batch(engine: &Engine, prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let runs: Vec<_> = prompts
        .iter()
        .map(|p| {
            let params = SamplingParams {
                temperature: 0.0,
                max_tokens: 12,
                ignore_eos: true,
                ..SamplingParams::default()
            };
            let request = GenerateRequest {
                priority: Priority::Batch,
                ..GenerateRequest::new(p.clone(), params)
            };
            let mut generation = engine.generate(engine.validate(request).unwrap()).unwrap();
            tokio::spawn(async move {
                let mut ids = Vec::new();
                while let Some(delta) = generation.next().await {
                    ids.extend(delta.unwrap().token.map(|t| t.id));
                }
                ids
            })
        })
        .collect();
    let mut out = Vec::new();
    for run in runs {
        out.push(run.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kda_holds_back_sequences_on_a_hot_expert_without_changing_any_answer() {
    let model = identity_moe();
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            policy: SchedulingPolicy::Fcfs,
            kda: KdaConfig {
                expert_capacity: 1.5,
                max_deferrals: 2,
                heat_interval: 2,
                ..KdaConfig::default()
            },
            ..SchedulerConfig::default()
        },
        kv_cache_bytes: 64 << 20,
        threads: 2,
        ..EngineConfig::default()
    };
    let engine = Engine::load(&model.0, config).unwrap();
    let prompts: Vec<Vec<u32>> = (0..6)
        .map(|i| {
            let text = format!("Question {i}: what do ospreys eat, and where do they nest?");
            engine.tokenizer().encode(&text, true)
        })
        .collect();

    let fcfs = batch(&engine, &prompts).await;
    let stats = engine.stats();
    assert_eq!(stats.deferrals(), 0, "fcfs never defers");
    let routed = stats.routing();
    assert!(routed.steps > 0, "every step's routing is measured");
    let mean = routed.imbalance / routed.steps as f64;
    assert!(
        (mean - 2.0).abs() < 1e-6,
        "two of four experts take everything: {mean}"
    );

    // Switched while the server runs; the same prompts again.
    engine.set_scheduling_policy(SchedulingPolicy::Kda).unwrap();
    assert_eq!(stats.policy(), SchedulingPolicy::Kda);
    let kda = batch(&engine, &prompts).await;
    assert_eq!(
        kda, fcfs,
        "holding a sequence back changes none of its tokens"
    );
    assert!(kda.iter().all(|ids| ids.len() == 12), "nothing starves");
    assert!(
        stats.deferrals() > 0,
        "six decodes on two experts exceed 1.5× their share"
    );
}
