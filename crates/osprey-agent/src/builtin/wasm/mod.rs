//! Code execution in a WebAssembly sandbox (the wasmi interpreter): WASI (preview 1) modules,
//! binary or `.wat` text, run with a fuel limit (instructions), a memory limit, a wall-time
//! limit and a cap on what they may print. A module sees no filesystem and no network: stdin is
//! the call's input, stdout and stderr are captured, and a directory is visible (read-only,
//! [`ReadOnlyDir`]) only when the operator grants one.
//!
//! Two kinds of tool run here: `wasm_exec`, which runs the module the call gives (`.wat` text),
//! and operator modules (`[agent.wasm.modules.NAME]`), each its own tool whose JSON arguments
//! the module reads on stdin.
//!
//! An interpreter, not a compiler: a tool's module is small and runs for milliseconds, so
//! translating it once (cached) and interpreting it costs less than a JIT's compile, and the
//! build does not carry a code generator (see docs/build.md). The wall-time limit is checked
//! between slices of fuel: a run is resumed after each slice until its fuel or its time is
//! spent.

mod read_only;

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use wasmi::{
    Config, Engine, Linker, Module, Store, StoreLimits, StoreLimitsBuilder, TrapCode,
    TypedResumableCall,
};
use wasmi_wasi::wasi_common::pipe::{ReadPipe, WritePipe};
use wasmi_wasi::{WasiCtx, WasiCtxBuilder, ambient_authority};

pub use read_only::ReadOnlyDir;

use crate::tool::{Tool, ToolError, ToolSpec};

/// Fuel a run gets between two looks at the clock: the wall-time limit's granularity (a few
/// milliseconds of interpretation).
const SLICE: u64 = 2_000_000;

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

/// Runs WASI modules under limits; cheap to clone, one translated-module cache for all.
#[derive(Clone)]
pub struct Sandbox {
    engine: Engine,
    config: Arc<WasmConfig>,
    modules: Arc<Mutex<HashMap<u64, Module>>>,
}

struct RunState {
    wasi: WasiCtx,
    limits: StoreLimits,
}

/// How a run ended, before its output is read.
enum Ended {
    /// `_start` returned (0) or the module called `proc_exit`.
    Exited(i32),
    /// Stopped, with the reason for the caller.
    Failed(String),
}

impl Sandbox {
    /// A sandbox with `config`'s limits.
    pub fn new(config: WasmConfig) -> Result<Self, String> {
        let mut c = Config::default();
        c.consume_fuel(true);
        Ok(Self {
            engine: Engine::new(&c),
            config: Arc::new(config),
            modules: Arc::default(),
        })
    }

    /// The limits.
    pub fn config(&self) -> &WasmConfig {
        &self.config
    }

    /// Translates `code` (`.wasm` bytes or `.wat` text), or takes it from the cache.
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
            .map_err(|e| format!("the module does not compile: {e}"))?;
        let compile = t.elapsed();
        let mut cache = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= 64 {
            cache.clear();
        }
        cache.insert(key, module.clone());
        Ok((module, compile))
    }

    /// The WASI context of one run: `stdin`, the captured outputs, `args`, and the granted
    /// directory (if any) as `/data`.
    fn wasi(
        &self,
        stdin: &str,
        args: &[String],
        out: &Capped,
        err: &Capped,
    ) -> Result<WasiCtx, String> {
        let mut wasi = WasiCtxBuilder::new();
        wasi.stdin(Box::new(ReadPipe::from(stdin.as_bytes())))
            .stdout(Box::new(WritePipe::from_shared(out.0.clone())))
            .stderr(Box::new(WritePipe::from_shared(err.0.clone())));
        std::iter::once("module")
            .chain(args.iter().map(String::as_str))
            .try_for_each(|a| wasi.arg(a).map(drop))
            .map_err(|e| format!("the module's arguments: {e}"))?;
        let ctx = wasi.build();
        if let Some(dir) = &self.config.read_dir {
            let opened = wasmi_wasi::Dir::open_ambient_dir(dir, ambient_authority())
                .map_err(|e| format!("agent.wasm.read_dir: {}: {e}", dir.display()))?;
            ctx.push_preopened_dir(Box::new(ReadOnlyDir::new(opened)), "/data")
                .map_err(|e| format!("agent.wasm.read_dir: {e}"))?;
        }
        Ok(ctx)
    }

    /// Runs `code`'s `_start` with `stdin` and `args`, within the limits (blocking: call from
    /// a blocking thread).
    pub fn run(&self, code: &[u8], stdin: &str, args: &[String]) -> Result<WasmOutput, String> {
        let (module, compile) = self.module(code)?;
        let c = &self.config;
        let (stdout, stderr) = (
            Capped::new(c.max_output_bytes),
            Capped::new(c.max_output_bytes),
        );
        let limits = StoreLimitsBuilder::new()
            .memory_size(c.memory_bytes)
            .instances(1)
            .tables(4)
            .memories(1)
            .build();
        let wasi = self.wasi(stdin, args, &stdout, &stderr)?;
        let mut store = Store::new(&self.engine, RunState { wasi, limits });
        store.limiter(|s| &mut s.limits);
        let mut linker: Linker<RunState> = Linker::new(&self.engine);
        wasmi_wasi::add_to_linker(&mut linker, |s| &mut s.wasi).map_err(|e| e.to_string())?;
        let t = Instant::now();
        let deadline = t + Duration::from_secs_f64(c.timeout_seconds);
        // Fuel is handed out a slice at a time; `left` is what is not handed out yet.
        let mut left = c.fuel;
        let mut refuel = |store: &mut Store<RunState>| {
            let slice = left.min(SLICE);
            left -= slice;
            store.set_fuel(slice).map(|()| slice > 0)
        };
        refuel(&mut store).map_err(|e| e.to_string())?;
        let mut call = linker
            .instantiate_and_start(&mut store, &module)
            .and_then(|instance| instance.get_typed_func::<(), ()>(&store, "_start"))
            .and_then(|start| start.call_resumable(&mut store, ()));
        let ended = loop {
            match call {
                Ok(TypedResumableCall::Finished(())) => break Ended::Exited(0),
                Ok(TypedResumableCall::OutOfFuel(paused)) => {
                    if Instant::now() >= deadline {
                        break Ended::Failed(format!(
                            "the module ran past its time limit ({} s)",
                            c.timeout_seconds
                        ));
                    }
                    match refuel(&mut store) {
                        Ok(true) => call = paused.resume(&mut store),
                        _ => {
                            break Ended::Failed(format!(
                                "the module ran out of fuel ({} units)",
                                c.fuel
                            ));
                        }
                    }
                }
                // A host function's error (`proc_exit` is one) ends the run.
                Ok(TypedResumableCall::HostTrap(trapped)) => {
                    break ended_by(trapped.host_error(), c);
                }
                Err(e) => break ended_by(&e, c),
            }
        };
        let run = t.elapsed();
        let fuel_used = c.fuel - left - store.get_fuel().unwrap_or(0);
        drop(store);
        let (stdout, stderr) = (stdout.contents(), stderr.contents());
        if stdout.len().max(stderr.len()) > c.max_output_bytes {
            return Err(too_much(c.max_output_bytes));
        }
        let exit_code = match ended {
            Ended::Exited(code) => code,
            Ended::Failed(why) => return Err(why),
        };
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

/// How an error from instantiating or running a module ends the run.
fn ended_by(e: &wasmi::Error, c: &WasmConfig) -> Ended {
    if let Some(code) = e.i32_exit_status() {
        return Ended::Exited(code);
    }
    Ended::Failed(match e.as_trap_code() {
        Some(TrapCode::OutOfFuel) => format!("the module ran out of fuel ({} units)", c.fuel),
        Some(TrapCode::GrowthOperationLimited | TrapCode::OutOfSystemMemory) => {
            too_hungry(c.memory_bytes)
        }
        _ => {
            let text = e.to_string();
            if text.contains("memory") && (text.contains("limit") || text.contains("exceed")) {
                too_hungry(c.memory_bytes)
            } else {
                format!("the module failed: {text}")
            }
        }
    })
}

fn too_hungry(cap: usize) -> String {
    format!("the module asked for more than {cap} bytes of memory")
}

/// An output buffer that keeps at most one byte beyond its cap: a module that fills it wrote
/// too much. (A full buffer fails the guest's write rather than trapping, so the cap is checked
/// after the run.)
#[derive(Clone)]
struct Capped(Arc<RwLock<CappedBuf>>);

struct CappedBuf {
    bytes: Vec<u8>,
    room: usize,
}

impl Capped {
    fn new(cap: usize) -> Self {
        Self(Arc::new(RwLock::new(CappedBuf {
            bytes: Vec::new(),
            room: cap + 1,
        })))
    }

    fn contents(&self) -> Vec<u8> {
        std::mem::take(&mut self.0.write().unwrap_or_else(|e| e.into_inner()).bytes)
    }
}

impl Write for CappedBuf {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(self.room - self.bytes.len());
        if n == 0 && !buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "output beyond capacity",
            ));
        }
        self.bytes.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
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
