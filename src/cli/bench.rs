//! `inkling-wgpu bench` (being built).
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`bench` is not built yet")
}
