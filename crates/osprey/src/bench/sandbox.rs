//! `osprey bench sandbox`: what the WebAssembly sandbox costs: setting it up, translating a
//! module (cold, then from the cache), a call (instantiate a WASI module with fresh limits, run
//! it, read its output), alone and as the `wasm_exec` tool does it (on a blocking thread), and
//! a compute-bound module (a loop of ten million iterations).

use std::time::Instant;

use clap::Args;
use osprey_agent::Tool;
use osprey_agent::builtin::wasm::{HELLO_WAT, Sandbox, WasmConfig, WasmExec};

/// `osprey bench sandbox`.
#[derive(Args, Debug)]
pub struct SandboxBenchArgs {
    /// Calls timed.
    #[arg(long, default_value_t = 500)]
    calls: usize,
}

/// Sums the integers below ten million (about 60 million instructions), printing nothing.
const LOOP_WAT: &str = r#"(module (memory (export "memory") 1)
  (func (export "_start") (local $i i32) (local $sum i64)
    (loop
      (local.set $sum (i64.add (local.get $sum) (i64.extend_i32_u (local.get $i))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if 0 (i32.lt_u (local.get $i) (i32.const 10000000))))))"#;

fn quantiles(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)];
    (at(0.5), at(0.99))
}

pub fn run(args: SandboxBenchArgs) -> anyhow::Result<()> {
    let t = Instant::now();
    let sandbox = Sandbox::new(WasmConfig::default()).map_err(anyhow::Error::msg)?;
    println!("sandbox set up: {:.2} ms", t.elapsed().as_secs_f64() * 1e3);
    let first = sandbox
        .run(HELLO_WAT.as_bytes(), "", &[])
        .map_err(anyhow::Error::msg)?;
    println!(
        "first call: compile {:.2} ms, run {:.3} ms",
        first.compile.as_secs_f64() * 1e3,
        first.run.as_secs_f64() * 1e3
    );
    let mut direct = Vec::new();
    for _ in 0..args.calls {
        let t = Instant::now();
        let out = sandbox
            .run(HELLO_WAT.as_bytes(), "", &[])
            .map_err(anyhow::Error::msg)?;
        anyhow::ensure!(
            out.stdout == "hello\n",
            "unexpected output {:?}",
            out.stdout
        );
        direct.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let (p50, p99) = quantiles(direct);
    println!(
        "call (cached module, fresh store and WASI context), {} calls: p50 {p50:.3} ms, p99 {p99:.3} ms",
        args.calls
    );
    let mut loops = Vec::new();
    for _ in 0..5 {
        let out = sandbox
            .run(LOOP_WAT.as_bytes(), "", &[])
            .map_err(anyhow::Error::msg)?;
        loops.push((out.run.as_secs_f64() * 1e3, out.fuel_used));
    }
    let (p50, _) = quantiles(loops.iter().map(|l| l.0).collect());
    println!(
        "compute loop (10 M iterations, {} fuel), 5 runs: p50 {p50:.1} ms",
        loops[0].1
    );
    let tool = WasmExec::new(sandbox);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut via_tool = Vec::new();
    rt.block_on(async {
        for _ in 0..args.calls {
            let t = Instant::now();
            tool.call(serde_json::json!({"wat": HELLO_WAT}))
                .await
                .map_err(|e| anyhow::anyhow!(e.message))?;
            via_tool.push(t.elapsed().as_secs_f64() * 1e3);
        }
        anyhow::Ok(())
    })?;
    let (p50, p99) = quantiles(via_tool);
    println!(
        "wasm_exec tool call (JSON in and out, blocking thread): p50 {p50:.3} ms, p99 {p99:.3} ms"
    );
    Ok(())
}
