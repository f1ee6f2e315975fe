//! Command-line front end (`inkling-wgpu <subcommand>`). Each subcommand lives in its own file.
use clap::{Parser, Subcommand};
use std::process::ExitCode;

pub mod bench;
pub mod bench_batch;
pub mod bench_calls;
pub mod bench_decode;
pub mod bench_gemm;
pub mod bench_prefill;
pub mod bench_stream;
pub mod chat;
pub mod context;
pub mod convert;
pub mod formats;
pub mod generate;
pub mod info;
pub mod load;
pub mod output;
pub mod penalties;
pub mod perplexity;
pub mod placement;
pub mod prompt;
pub mod serve;
pub mod shaders;
pub mod smoke;
pub mod synth;
pub mod values;

/// Inkling mixture-of-experts language models on any GPU through wgpu.
#[derive(Parser, Debug)]
#[command(name = "inkling-wgpu", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate text from a checkpoint (default: the bundled demo model).
    Generate(generate::Args),
    /// Print the weight-format registry (FORMATS.md).
    Formats(formats::Args),
    /// Run the GEMV kernel of every format against the CPU reference on this adapter.
    Smoke(smoke::Args),
    /// Benchmarks (GEMV kernels, copy bandwidth, decode, comparison of two runs).
    Bench(bench::Args),
    /// Convert a checkpoint into a stamped quantised container.
    Convert(convert::Args),
    /// Print each tensor's format, the bytes per format and the total resident size.
    Info(info::Args),
    /// Write a container of random weights at the real Inkling shapes (benchmarks).
    Synth(synth::Args),
    /// Write every WGSL module the engine can build, named by pipeline key (no device).
    Shaders(shaders::Args),
    /// Chat with a model in Inkling's chat format (interactive, or one message per stdin line).
    Chat(chat::Args),
    /// Serve a model over an OpenAI-compatible HTTP API.
    Serve(serve::Args),
    /// Perplexity and bits per byte over a text; KL divergence to a base model (--kl-base).
    Perplexity(perplexity::Args),
}

/// Run a parsed command line; the exit code reflects failures the command reports itself.
/// `--peak-gbs`: a finite bandwidth of at least 0.001 GB/s.
pub fn parse_gbs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 1e-3 => Ok(v),
        _ => Err(format!(
            "expected a bandwidth in GB/s (a number ≥ 0.001), got {s:?}"
        )),
    }
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Generate(a) => generate::run(a),
        Command::Formats(a) => formats::run(a),
        Command::Smoke(a) => smoke::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Convert(a) => convert::run(a),
        Command::Info(a) => info::run(a),
        Command::Synth(a) => synth::run(a),
        Command::Shaders(a) => shaders::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Perplexity(a) => perplexity::run(a),
    }
}
