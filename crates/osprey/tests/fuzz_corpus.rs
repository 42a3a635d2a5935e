//! Every input the fuzzers kept (`fuzz/corpus/TARGET/`) and every input that once crashed a
//! target (`fuzz/regressions/TARGET/`), replayed on stable through the very entry points the
//! fuzz targets call: what was fixed stays fixed. The fuzzers themselves run outside CI's
//! budget (`reliability/fuzz.sh`).

#[path = "../../../fuzz/src/lib.rs"]
mod targets;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

#[test]
fn every_kept_fuzz_input_is_handled_without_a_panic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut replayed = Vec::new();
    let mut panicked = Vec::new();
    for (name, target) in targets::TARGETS {
        let mut count = 0;
        for kind in ["corpus", "regressions"] {
            let Ok(entries) = std::fs::read_dir(root.join(kind).join(name)) else {
                continue;
            };
            for entry in entries {
                let path = entry.expect("a directory entry").path();
                let bytes = std::fs::read(&path).expect("reading a kept input");
                if catch_unwind(AssertUnwindSafe(|| target(&bytes))).is_err() {
                    panicked.push(path.display().to_string());
                }
                count += 1;
            }
        }
        assert!(count > 0, "no kept inputs for the fuzz target `{name}`");
        replayed.push(format!("{name} {count}"));
    }
    eprintln!("replayed: {}", replayed.join(", "));
    assert!(panicked.is_empty(), "these inputs panic: {panicked:#?}");
}
