//! `inkling-wgpu formats` (being built).
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`formats` is not built yet")
}
