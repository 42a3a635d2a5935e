//! `osprey bench k3`: the K3 features measured on SmolLM2 (docs/k3.md).
//!
//! - `formats`: perplexity (golden text and a held-out text) and single-stream decode speed of
//!   the model in Q4_1 (the GGUF), MXFP4 and F16 checkpoints, in one run, repetitions
//!   interleaved;
//! - `moe`: the MoEfied model's perplexity against top-k (k = E is the dense model) and latent
//!   width, with the fraction of the dense model's multiply-adds per token;
//! - `kda`: the KDA scheduler against FCFS on the MoEfied model ([`kda`]).

mod kda;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::{Args, ValueEnum};
use osprey_engine::Prompter;
use osprey_models::convert::Input;
use osprey_models::convert::quantize::{QuantizeOptions, parse_format, quantize};
use osprey_models::convert::upcycle::{UpcycleMode, UpcycleOptions, upcycle};
use osprey_models::eval::perplexity;
use osprey_models::{
    BatchSeq, Checkpoint, ForwardBatch, ForwardScratch, KvCache, LogitsWanted, Transformer,
};

/// Which part to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Part {
    /// MXFP4 vs Q4_1 vs F16.
    Formats,
    /// MoEfication sweeps.
    Moe,
    /// KDA vs FCFS scheduling.
    Kda,
    /// All three.
    All,
}

/// Options of `osprey bench k3`.
#[derive(Args, Debug)]
pub struct K3BenchArgs {
    /// What to measure.
    #[arg(long, value_enum, default_value = "all")]
    pub part: Part,
    /// Where the checkpoints it writes go (default: $OSPREY_HOME/bench-k3); reused if there.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Experts of the MoEfied model.
    #[arg(long, default_value_t = 8)]
    pub experts: usize,
    /// Latent widths to sweep (the model width first).
    #[arg(long, value_delimiter = ',', default_value = "576,448,320,192")]
    pub latent_dims: Vec<usize>,
    /// Tokens decoded per speed measurement.
    #[arg(long, default_value_t = 128)]
    pub decode_tokens: usize,
    /// Repetitions; medians are reported.
    #[arg(long, short = 'r', default_value_t = 3)]
    pub repetitions: usize,
    /// Compute threads.
    #[arg(long, short = 't', default_value_t = 2)]
    pub threads: usize,
    #[command(flatten)]
    pub kda: kda::KdaArgs,
}

/// Held-out text for perplexity: written for this benchmark, in no dev data.
pub(super) const HELD_OUT: &str = "The lighthouse keeper kept two logbooks. In the first he wrote the weather \
every four hours: wind direction, the height of the swell, whether the fog horn had been needed \
and for how long. In the second, which he never showed the inspectors, he wrote down the ships \
he could name from their lights alone, the birds that struck the lantern glass in autumn, and \
the evenings when the mainland was so clear that he could count the windows of the church. \
When the light was automated in the spring, the first logbook went to the archive in the county \
town, where it is still consulted by people studying storms. The second went home with him. \
His daughter found it years later in a drawer under the tide tables, and she says it is the \
better record of the sea: the archive knows how hard the wind blew, but only the second book \
knows who was out in it. She has started a third, from the harbour wall, in the same hand.";

pub fn run(args: K3BenchArgs) -> anyhow::Result<()> {
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| osprey_models::osprey_home().join("bench-k3"));
    std::fs::create_dir_all(&dir)?;
    let gguf = crate::models::fetch_default()?;
    let prompter = Prompter::load(&gguf)?;
    let texts = Texts {
        golden: golden_ppl_ids()?,
        held_out: prompter.tokenizer().encode(HELD_OUT, false),
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build()?;
    pool.install(|| {
        if matches!(args.part, Part::Formats | Part::All) {
            formats(&args, &dir, &gguf, &texts)?;
        }
        if matches!(args.part, Part::Moe | Part::All) {
            moe(&args, &dir, &gguf, &texts)?;
        }
        anyhow::Ok(())
    })?;
    if matches!(args.part, Part::Kda | Part::All) {
        // Scheduling needs speed, not quality: MXFP4 experts run the fused kernel.
        kda::run(
            &args,
            &dir,
            &moefied(&dir, &gguf, args.experts, 576, "mxfp4")?,
        )?;
    }
    Ok(())
}

struct Texts {
    golden: Vec<u32>,
    held_out: Vec<u32>,
}

/// The golden perplexity text's ids (shared/data, located like the test kit does).
pub(super) fn golden_ppl_ids() -> anyhow::Result<Vec<u32>> {
    let path = std::env::var_os("OSPREY_GOLDEN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../../shared/data/golden/smollm2-135m-q4_1.json")
        });
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {} (set OSPREY_GOLDEN)", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)?;
    v["perplexity"]["ids"]
        .as_array()
        .context("no perplexity.ids")?
        .iter()
        .map(|x| x.as_u64().map(|i| i as u32).context("bad id"))
        .collect()
}

/// A checkpoint in `dir/name`, written by `make` unless it is already there.
fn cached(
    dir: &Path,
    name: &str,
    make: impl FnOnce(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    if !Checkpoint::is_checkpoint(&path) {
        eprintln!("writing {} ...", path.display());
        let _ = std::fs::remove_dir_all(&path);
        make(&path)?;
    }
    Ok(path)
}

fn quantized(
    dir: &Path,
    gguf: &Path,
    format: &str,
    keep_embeddings: bool,
) -> anyhow::Result<PathBuf> {
    let name = if keep_embeddings {
        format!("{format}-f16-embd")
    } else {
        format.to_owned()
    };
    cached(dir, &name, |out| {
        let options = QuantizeOptions {
            format: parse_format(format)?,
            shards: 96,
            keep_embeddings,
        };
        quantize(&Input::open(gguf)?, out, &options, &|_| {}, &|_| {})?;
        Ok(())
    })
}

/// SmolLM2 MoEfied into `experts` experts of latent width `latent`, in `format` (top-k 2 as
/// written; the sweeps override it).
fn moefied(
    dir: &Path,
    gguf: &Path,
    experts: usize,
    latent: usize,
    format: &str,
) -> anyhow::Result<PathBuf> {
    cached(
        dir,
        &format!("moefy-e{experts}-l{latent}-{format}"),
        |out| {
            let input = Input::open(gguf)?;
            let options = UpcycleOptions {
                mode: UpcycleMode::Moefy { latent_dim: latent },
                experts,
                top_k: 2,
                shards: 96,
                expert_format: parse_format(format)?,
                calibration: crate::convert::calibration_tokens(&input)?,
            };
            upcycle(&input, out, &options, &|_| {}, &|_| {})?;
            Ok(())
        },
    )
}

/// Opens a k3 checkpoint with every MoE layer's top-k set to `k`.
fn open_with_top_k(path: &Path, k: usize) -> anyhow::Result<Transformer> {
    let ckpt = Checkpoint::open(path)?;
    let mut c = ckpt.config().clone();
    for layer in c.k3.iter_mut().flat_map(|p| p.layers.iter_mut()) {
        if let Some(m) = &mut layer.moe {
            m.top_k = k;
        }
    }
    Ok(Transformer::from_source(c.model, c.k3, &ckpt)?)
}

/// Single-stream decode tokens/s over `n` tokens after a short prompt.
fn decode_speed(model: &Transformer, n: usize) -> f64 {
    let config = model.config();
    let (mut kv, tables) = KvCache::for_sequence(config, n + 16);
    let mut scratch = ForwardScratch::default();
    let token = |i: usize| ((i * 7919 + 13) % config.vocab_size) as u32;
    let mut step = |tokens: &[u32], start: usize| {
        let seqs = [BatchSeq {
            n_tokens: tokens.len(),
            start_pos: start,
            block_tables: &tables,
            logits: LogitsWanted::Last,
        }];
        model.forward(
            &ForwardBatch {
                tokens,
                seqs: &seqs,
            },
            &mut kv,
            &mut scratch,
        );
    };
    step(&[token(0), token(1)], 0);
    let t = Instant::now();
    for i in 0..n {
        step(&[token(i + 2)], i + 2);
    }
    n as f64 / t.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn formats(args: &K3BenchArgs, dir: &Path, gguf: &Path, texts: &Texts) -> anyhow::Result<()> {
    let paths = [
        ("Q4_1 (GGUF)", gguf.to_owned()),
        ("MXFP4", quantized(dir, gguf, "mxfp4", false)?),
        (
            "MXFP4, F16 embeddings",
            quantized(dir, gguf, "mxfp4", true)?,
        ),
        ("F16", quantized(dir, gguf, "f16", false)?),
    ];
    let mut models = Vec::new();
    for (name, path) in &paths {
        let t = Instant::now();
        let model = Transformer::open(path)?;
        models.push((*name, model, t.elapsed().as_secs_f64()));
    }
    let mut speeds = vec![Vec::new(); models.len()];
    for _ in 0..args.repetitions {
        for (i, (_, m, _)) in models.iter().enumerate() {
            speeds[i].push(decode_speed(m, args.decode_tokens));
        }
    }
    println!(
        "\n### Formats: SmolLM2-135M, checkpoints in 96 shards, {} threads\n",
        args.threads
    );
    println!(
        "| format | weights read/token | load s | PPL golden | PPL held-out | decode t/s | vs Q4_1 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let base = median(speeds[0].clone());
    for ((name, m, load), s) in models.iter().zip(speeds) {
        let (_, g) = perplexity(m, &texts.golden);
        let (_, h) = perplexity(m, &texts.held_out);
        let tps = median(s);
        println!(
            "| {name} | {:.1} MB | {load:.2} | {g:.3} | {h:.3} | {tps:.1} | {:.2}× |",
            m.weight_bytes() as f64 / 1e6,
            tps / base
        );
    }
    Ok(())
}

fn moe(args: &K3BenchArgs, dir: &Path, gguf: &Path, texts: &Texts) -> anyhow::Result<()> {
    let e = args.experts;
    let dense = Transformer::open(&quantized(dir, gguf, "f16", false)?)?;
    let (da, dm, dh) = dense.macs_per_token();
    let (_, dg) = perplexity(&dense, &texts.golden);
    let (_, dho) = perplexity(&dense, &texts.held_out);
    println!("\n### MoEfication: {e} experts, F16 experts (dense F16: PPL {dg:.3} / {dho:.3})\n");
    println!(
        "| latent | top-k | PPL golden | PPL held-out | MLP MACs vs dense | model MACs vs dense | decode t/s |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut ks: Vec<usize> = (0..).map(|i| 1usize << i).take_while(|&k| k < e).collect();
    ks.push(e);
    for &latent in &args.latent_dims {
        let path = moefied(dir, gguf, e, latent, "f16")?;
        for &k in &ks {
            let m = open_with_top_k(&path, k)?;
            let (a, mlp, h) = m.macs_per_token();
            let (_, g) = perplexity(&m, &texts.golden);
            let (_, ho) = perplexity(&m, &texts.held_out);
            let tps = decode_speed(&m, args.decode_tokens);
            println!(
                "| {latent} | {k} | {g:.3} | {ho:.3} | {:.3} | {:.3} | {tps:.1} |",
                mlp as f64 / dm as f64,
                (a + mlp + h) as f64 / (da + dm + dh) as f64
            );
        }
    }
    Ok(())
}
