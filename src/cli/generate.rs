//! `inkling-wgpu generate` (being built).
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`generate` is not built yet")
}
