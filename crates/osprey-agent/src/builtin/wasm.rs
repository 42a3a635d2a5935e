//! Code execution in a wasmtime sandbox: WASI (preview 1) modules, binary or `.wat` text,
//! run with a fuel limit (instructions), a memory limit, a wall-time limit (epoch
//! interruption) and a cap on what they may print. A module sees no filesystem and no network:
//! stdin is the call's input, stdout and stderr are captured, and a directory is visible
//! (read-only) only when the operator grants one.
//!
//! Two kinds of tool run here: `wasm_exec`, which runs the module the call gives (`.wat` text),
//! and operator modules (`[agent.wasm.modules.NAME]`), each its own tool whose JSON arguments
//! the module reads on stdin.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use wasmtime::{Config, Engine, Linker, Module, Store, StoreLimits, StoreLimitsBuilder, Trap};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::{MemoryInputPipe, MemoryOutputPipe};
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

use crate::tool::{Tool, ToolError, ToolSpec};

/// How often the epoch ticks: the wall-time limit's granularity.
const TICK: Duration = Duration::from_millis(5);

/// The sandbox's limits (`[agent.wasm]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WasmConfig {
    /// Offer `wasm_exec` (code given by the call).
    pub exec: bool,
    /// Fuel per run (about one unit per WebAssembly instruction).
    pub fuel: u64,
    /// Most linear memory a module may have, bytes.
    pub memory_bytes: usize,
    /// Longest a run may take, seconds.
    pub timeout_seconds: f64,
    /// Most bytes a module may write to stdout (and, separately, stderr).
    pub max_output_bytes: usize,
    /// A host directory the module may read, seen as `/data` (none: no filesystem).
    pub read_dir: Option<PathBuf>,
    /// Operator modules, each a tool of its name.
    pub modules: HashMap<String, WasmModuleConfig>,
}

impl Default for WasmConfig {
    fn default() -> Self {
        Self {
            exec: true,
            fuel: 200_000_000,
            memory_bytes: 64 << 20,
            timeout_seconds: 5.0,
            max_output_bytes: 64 << 10,
            read_dir: None,
            modules: HashMap::new(),
        }
    }
}

/// One operator module.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WasmModuleConfig {
    /// The `.wasm` or `.wat` file.
    pub path: PathBuf,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of its arguments (it reads them as JSON on stdin).
    #[serde(default = "any_object")]
    pub parameters: Value,
}

fn any_object() -> Value {
    json!({"type": "object"})
}

/// What a run produced.
#[derive(Clone, Debug, PartialEq)]
pub struct WasmOutput {
    /// Exit status (0 when `_start` returned).
    pub exit_code: i32,
    /// What it printed.
    pub stdout: String,
    /// What it printed as errors.
    pub stderr: String,
    /// Fuel used.
    pub fuel_used: u64,
    /// Time to compile the module (0 when it was cached).
    pub compile: Duration,
    /// Time to instantiate and run it.
    pub run: Duration,
}

/// Runs WASI modules under limits; cheap to clone, one compiled-module cache for all.
#[derive(Clone)]
pub struct Sandbox {
    engine: Engine,
    config: Arc<WasmConfig>,
    modules: Arc<Mutex<HashMap<u64, Module>>>,
}

struct RunState {
    wasi: WasiP1Ctx,
    limits: StoreLimits,
}

impl Sandbox {
    /// A sandbox with `config`'s limits; starts the thread that ticks the epoch.
    pub fn new(config: WasmConfig) -> Result<Self, String> {
        let mut c = Config::new();
        c.consume_fuel(true).epoch_interruption(true);
        let engine = Engine::new(&c).map_err(|e| format!("wasm engine: {e}"))?;
        let ticker = engine.weak();
        std::thread::Builder::new()
            .name("osprey-wasm-epoch".into())
            .spawn(move || {
                while let Some(engine) = ticker.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(TICK);
                }
            })
            .map_err(|e| format!("wasm epoch thread: {e}"))?;
        Ok(Self {
            engine,
            config: Arc::new(config),
            modules: Arc::default(),
        })
    }

    /// The limits.
    pub fn config(&self) -> &WasmConfig {
        &self.config
    }

    /// Compiles `code` (`.wasm` bytes or `.wat` text), or takes it from the cache.
    fn module(&self, code: &[u8]) -> Result<(Module, Duration), String> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        code.hash(&mut h);
        let key = h.finish();
        if let Some(m) = self
            .modules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok((m.clone(), Duration::ZERO));
        }
        let t = Instant::now();
        let module = Module::new(&self.engine, code)
            .map_err(|e| format!("the module does not compile: {e:#}"))?;
        let compile = t.elapsed();
        let mut cache = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= 64 {
            cache.clear();
        }
        cache.insert(key, module.clone());
        Ok((module, compile))
    }

    /// Runs `code`'s `_start` with `stdin` and `args`, within the limits (blocking: call from
    /// a blocking thread).
    pub fn run(&self, code: &[u8], stdin: &str, args: &[String]) -> Result<WasmOutput, String> {
        let (module, compile) = self.module(code)?;
        let c = &self.config;
        // One byte beyond the cap: a module that fills it wrote too much. (A full pipe does not
        // trap; the guest's writes just start failing, so the cap is checked afterwards.)
        let stdout = MemoryOutputPipe::new(c.max_output_bytes + 1);
        let stderr = MemoryOutputPipe::new(c.max_output_bytes + 1);
        let mut wasi = WasiCtxBuilder::new();
        wasi.stdin(MemoryInputPipe::new(stdin.as_bytes().to_vec()))
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .arg("module");
        for a in args {
            wasi.arg(a);
        }
        if let Some(dir) = &c.read_dir {
            wasi.preopened_dir(dir, "/data", FsPerms::ReadOnly)
                .map_err(|e| format!("agent.wasm.read_dir: {e}"))?;
        }
        let limits = StoreLimitsBuilder::new()
            .memory_size(c.memory_bytes)
            .instances(1)
            .tables(4)
            .memories(1)
            .build();
        let mut store = Store::new(
            &self.engine,
            RunState {
                wasi: wasi.build_p1(),
                limits,
            },
        );
        store.limiter(|s| &mut s.limits);
        store.set_fuel(c.fuel).map_err(|e| e.to_string())?;
        let ticks = (c.timeout_seconds / TICK.as_secs_f64()).ceil().max(1.0) as u64;
        store.set_epoch_deadline(ticks);
        let mut linker: Linker<RunState> = Linker::new(&self.engine);
        wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |s| &mut s.wasi)
            .map_err(|e| e.to_string())?;
        let t = Instant::now();
        let outcome = linker
            .instantiate(&mut store, &module)
            .and_then(|instance| instance.get_typed_func::<(), ()>(&mut store, "_start"))
            .and_then(|start| start.call(&mut store, ()));
        let run = t.elapsed();
        let fuel_used = c.fuel - store.get_fuel().unwrap_or(0);
        let exit_code = match outcome {
            Ok(()) => 0,
            Err(e) => {
                if let Some(exit) = e.downcast_ref::<I32Exit>() {
                    exit.0
                } else {
                    return Err(match e.downcast_ref::<Trap>() {
                        Some(Trap::OutOfFuel) => {
                            format!("the module ran out of fuel ({} units)", c.fuel)
                        }
                        Some(Trap::Interrupt) => {
                            format!(
                                "the module ran past its time limit ({} s)",
                                c.timeout_seconds
                            )
                        }
                        _ => {
                            let text = format!("{e:#}");
                            if text.contains("beyond capacity") {
                                too_much(c.max_output_bytes)
                            } else if text.contains("memory") && text.contains("limit") {
                                format!(
                                    "the module asked for more than {} bytes of memory",
                                    c.memory_bytes
                                )
                            } else {
                                format!("the module failed: {text}")
                            }
                        }
                    });
                }
            }
        };
        let (stdout, stderr) = (stdout.contents(), stderr.contents());
        if stdout.len().max(stderr.len()) > c.max_output_bytes {
            return Err(too_much(c.max_output_bytes));
        }
        Ok(WasmOutput {
            exit_code,
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            fuel_used,
            compile,
            run,
        })
    }

    /// [`run`](Self::run) on a blocking thread, as a tool result.
    async fn call(
        &self,
        code: Vec<u8>,
        stdin: String,
        args: Vec<String>,
    ) -> Result<String, ToolError> {
        let sandbox = self.clone();
        let out = tokio::task::spawn_blocking(move || sandbox.run(&code, &stdin, &args))
            .await
            .map_err(|e| ToolError::fatal(format!("the sandbox failed: {e}")))?
            .map_err(ToolError::fatal)?;
        Ok(json!({
            "exit_code": out.exit_code,
            "stdout": out.stdout,
            "stderr": out.stderr,
            "fuel_used": out.fuel_used,
        })
        .to_string())
    }
}

/// `wasm_exec`: runs the module a call gives.
pub struct WasmExec {
    spec: ToolSpec,
    sandbox: Sandbox,
}

impl WasmExec {
    /// The tool over `sandbox`.
    pub fn new(sandbox: Sandbox) -> Self {
        let parameters = json!({
            "type": "object",
            "properties": {
                "wat": {"type": "string", "maxLength": 65536,
                    "description": "A WASI module in WebAssembly text format, exporting _start"},
                "stdin": {"type": "string", "maxLength": 65536},
                "args": {"type": "array", "items": {"type": "string"}, "maxItems": 16}
            },
            "required": ["wat"],
            "additionalProperties": false
        });
        let mut spec = ToolSpec::new(
            "wasm_exec",
            "Runs a WebAssembly (WASI) module in a sandbox without files or network; returns its exit code and output.",
            parameters,
        );
        spec.timeout = Duration::from_secs_f64(sandbox.config().timeout_seconds + 5.0);
        Self { spec, sandbox }
    }
}

impl Tool for WasmExec {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call(&self, arguments: Value) -> BoxFuture<'_, Result<String, ToolError>> {
        let code = arguments["wat"]
            .as_str()
            .unwrap_or_default()
            .as_bytes()
            .to_vec();
        let stdin = arguments["stdin"].as_str().unwrap_or_default().to_owned();
        let args = (arguments["args"].as_array().into_iter().flatten())
            .filter_map(|a| a.as_str().map(str::to_owned))
            .collect();
        Box::pin(self.sandbox.call(code, stdin, args))
    }
}

/// An operator's module, offered as a tool of its own.
pub struct WasmModuleTool {
    spec: ToolSpec,
    code: Vec<u8>,
    sandbox: Sandbox,
}

impl WasmModuleTool {
    /// Reads the module `name` of `config`; an error names the file.
    pub fn new(sandbox: Sandbox, name: &str, config: &WasmModuleConfig) -> Result<Self, String> {
        let code = std::fs::read(&config.path)
            .map_err(|e| format!("agent.wasm.modules.{name}: {}: {e}", config.path.display()))?;
        sandbox
            .module(&code)
            .map_err(|e| format!("agent.wasm.modules.{name}: {e}"))?;
        let mut spec = ToolSpec::new(name, &config.description, config.parameters.clone());
        spec.timeout = Duration::from_secs_f64(sandbox.config().timeout_seconds + 5.0);
        Ok(Self {
            spec,
            code,
            sandbox,
        })
    }
}

impl Tool for WasmModuleTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call(&self, arguments: Value) -> BoxFuture<'_, Result<String, ToolError>> {
        Box::pin(
            self.sandbox
                .call(self.code.clone(), arguments.to_string(), Vec::new()),
        )
    }
}

fn too_much(cap: usize) -> String {
    format!("the module wrote more than {cap} bytes")
}

/// The smallest WASI program: prints `hello` and a newline (the sandbox's test and benchmark).
pub const HELLO_WAT: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "hello\n")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const 6))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"#;
