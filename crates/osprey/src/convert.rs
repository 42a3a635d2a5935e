//! `osprey quantize` and `osprey upcycle`: checkpoint conversions with a progress bar.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use osprey_models::WeightFormat;
use osprey_models::checkpoint::layout::Index;
use osprey_models::convert::quantize::{QuantizeOptions, parse_format, quantize};
use osprey_models::convert::upcycle::{UpcycleMode, UpcycleOptions, upcycle};
use osprey_models::convert::{CALIBRATION_TEXT, Input};

/// `osprey quantize`.
#[derive(Args, Debug)]
pub struct QuantizeArgs {
    /// Matrix format: mxfp4, f16, bf16 or f32.
    #[arg(long, default_value = "mxfp4")]
    pub format: String,
    /// Number of safetensors shards.
    #[arg(long, default_value_t = 96)]
    pub shards: usize,
    /// Keep the token embedding (the tied output head of small models) in F16.
    #[arg(long)]
    pub keep_embeddings: bool,
    /// A GGUF file or a checkpoint directory (default model if `-`).
    pub input: PathBuf,
    /// The checkpoint directory to write.
    pub output: PathBuf,
}

/// How `osprey upcycle` makes experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Method {
    /// Every expert a copy of the dense MLP: reproduces the dense model.
    Identity,
    /// The MLP's neurons clustered into experts: a sparse model.
    Moefy,
}

/// `osprey upcycle`.
#[derive(Args, Debug)]
pub struct UpcycleArgs {
    /// identity or moefy.
    #[arg(long, value_enum, default_value = "identity")]
    pub method: Method,
    /// Experts per layer.
    #[arg(long, default_value_t = 8)]
    pub experts: usize,
    /// Experts each token is routed to.
    #[arg(long, default_value_t = 2)]
    pub top_k: usize,
    /// Latent width of the MoE layers (moefy; default: the model width, exact projections).
    #[arg(long)]
    pub latent_dim: Option<usize>,
    /// Format of MoEfied experts: f16, bf16, f32 or mxfp4 (identity copies keep the MLP's).
    #[arg(long, default_value = "f16")]
    pub expert_format: String,
    /// Number of safetensors shards.
    #[arg(long, default_value_t = 96)]
    pub shards: usize,
    /// A dense GGUF file or checkpoint directory (default model if `-`).
    pub src: PathBuf,
    /// The k3 checkpoint directory to write.
    pub dst: PathBuf,
}

fn open_input(path: &std::path::Path) -> anyhow::Result<Input> {
    let path = if path.as_os_str() == "-" {
        crate::models::fetch_default()?
    } else {
        path.to_owned()
    };
    Input::open(&path).with_context(|| format!("opening {}", path.display()))
}

/// Runs a conversion under a progress bar of its tensors, then reports what it wrote.
fn with_progress(
    out: &std::path::Path,
    convert: impl FnOnce(&dyn Fn(usize), &(dyn Fn(&str) + Sync)) -> osprey_models::Result<Index>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template(
            "{spinner} [{bar:40}] {pos}/{len} tensors, {per_sec}, eta {eta}  {msg}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    let index = convert(&|n| bar.set_length(n as u64), &|name| {
        bar.set_message(name.to_owned());
        bar.inc(1);
    })?;
    bar.finish_and_clear();
    report(&index, out, started);
    Ok(())
}

fn report(index: &Index, out: &std::path::Path, started: Instant) {
    let m = &index.metadata;
    println!(
        "wrote {} in {:.1} s: {} shards, {} tensors, {:.1} MB, format {}",
        out.display(),
        started.elapsed().as_secs_f64(),
        m.shards.len(),
        index.weight_map.len(),
        m.total_size as f64 / 1e6,
        m.format
    );
    if !m.kept.is_empty() {
        println!("kept in higher precision ({}):", m.kept.len());
        let mut reasons: std::collections::BTreeMap<&str, usize> = Default::default();
        for why in m.kept.values() {
            *reasons.entry(why).or_default() += 1;
        }
        for (why, n) in reasons {
            println!("  {n:>4} × {why}");
        }
    }
}

pub fn run_quantize(args: QuantizeArgs) -> anyhow::Result<()> {
    let input = open_input(&args.input)?;
    let options = QuantizeOptions {
        format: parse_format(&args.format)?,
        shards: args.shards,
        keep_embeddings: args.keep_embeddings,
    };
    with_progress(&args.output, |on_plan, on_tensor| {
        quantize(&input, &args.output, &options, on_plan, on_tensor)
    })
}

/// [`CALIBRATION_TEXT`] in `input`'s own tokens.
pub fn calibration_tokens(input: &Input) -> anyhow::Result<Vec<u32>> {
    let prompter = osprey_engine::Prompter::from_gguf(input.tokenizer())?;
    Ok(prompter.tokenizer().encode(CALIBRATION_TEXT, true))
}

pub fn run_upcycle(args: UpcycleArgs) -> anyhow::Result<()> {
    let input = open_input(&args.src)?;
    let width = input.config()?.d_model;
    let mode = match args.method {
        Method::Identity => UpcycleMode::Identity,
        Method::Moefy => UpcycleMode::Moefy {
            latent_dim: args.latent_dim.unwrap_or(width),
        },
    };
    let expert_format: WeightFormat = parse_format(&args.expert_format)?;
    let options = UpcycleOptions {
        mode,
        experts: args.experts,
        top_k: args.top_k,
        shards: args.shards,
        expert_format,
        calibration: calibration_tokens(&input)?,
    };
    with_progress(&args.dst, |on_plan, on_tensor| {
        upcycle(&input, &args.dst, &options, on_plan, on_tensor)
    })
}
