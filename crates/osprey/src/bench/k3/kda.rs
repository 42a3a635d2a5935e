//! KDA vs FCFS on the MoEfied model (filled in with the scheduler work).

use std::path::Path;

use clap::Args;

/// Options of the KDA comparison.
#[derive(Args, Debug)]
pub struct KdaArgs {}

pub fn run(_args: &super::K3BenchArgs, _model: &Path) -> anyhow::Result<()> {
    Ok(())
}
