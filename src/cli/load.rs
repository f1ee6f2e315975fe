//! Opening a chat model for `chat` and `serve`: the tokenizer (with Inkling's chat specials, checked
//! before the weights are read), the weights, and a CPU or GPU forward with a KV cache of
//! `--ctx` tokens.
use super::generate::{gpu_backend, Device};
use crate::chat::Renderer;
use crate::model::sampling::SamplingParams;
use crate::model::text::{load_tokenizer, tokenizer_eos_ids};
use crate::model::{Checkpoint, CpuModel, Forward, GenerationConfig, GpuModelOptions, Weights};
use anyhow::{bail, Context};
use std::path::PathBuf;
use tokenizers::Tokenizer;

/// The model flags shared by `chat` and `serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// Checkpoint directory (config.json, safetensors or a converted container, tokenizer.json with
    /// Inkling's chat special tokens). Default: the bundled model.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Where to run the model.
    #[arg(long, value_enum, default_value_t = Device::Gpu)]
    pub device: Device,
    /// Context length in tokens (prompt and answers of the whole conversation): the KV cache's
    /// size on the GPU.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(2..))]
    pub ctx: u32,
}

impl ModelArgs {
    pub fn dir(&self) -> PathBuf {
        self.model.clone().unwrap_or_else(crate::bundled_model_dir)
    }
}

/// An open chat model, lent to a closure by [`with_chat_model`].
pub struct ChatModel<'a> {
    pub dir: PathBuf,
    pub tok: &'a Tokenizer,
    pub renderer: &'a Renderer,
    pub model: &'a mut dyn Forward,
    /// `<|content_model_end_sampling|>` and the model's own EOS ids.
    pub stop_ids: Vec<u32>,
    pub generation: GenerationConfig,
    /// Context length in tokens.
    pub ctx: usize,
}

/// The tokenizer of `dir` and its renderer; an error naming the file when it has no chat specials.
pub fn open_tokenizer(dir: &std::path::Path) -> anyhow::Result<(Tokenizer, Renderer)> {
    let tok = load_tokenizer(dir)?.with_context(|| {
        format!(
            "{}: no tokenizer.json; `chat` and `serve` need the model's tokenizer",
            dir.display()
        )
    })?;
    let renderer =
        Renderer::new(&tok).with_context(|| format!("{}", dir.join("tokenizer.json").display()))?;
    Ok((tok, renderer))
}

/// Open the model of `args` (whose tokenizer and renderer [`open_tokenizer`] gave) and run `f`
/// with it.
pub fn with_chat_model<R>(
    args: &ModelArgs,
    tok: &Tokenizer,
    renderer: &Renderer,
    f: impl FnOnce(ChatModel<'_>) -> anyhow::Result<R>,
) -> anyhow::Result<R> {
    let dir = args.dir();
    let ck = Checkpoint::open(&dir)?;
    let weights = Weights::load(&ck)?;
    let generation = ck.generation.clone().unwrap_or_default();
    let mut stop_ids = vec![renderer.specials().model_end_sampling];
    let eos = generation
        .eos_token_ids
        .iter()
        .chain(&ck.config.eos_token_ids);
    for id in eos.copied().chain(tokenizer_eos_ids(&dir, tok)) {
        if !stop_ids.contains(&id) {
            stop_ids.push(id);
        }
    }
    let ctx = args.ctx as usize;
    let mut cpu;
    let mut gpu;
    let model: &mut dyn Forward = match args.device {
        Device::Cpu => {
            cpu = CpuModel::new(&weights);
            &mut cpu
        }
        Device::Gpu => {
            gpu = gpu_backend(&weights, GpuModelOptions::new(ctx))?;
            &mut gpu
        }
    };
    f(ChatModel {
        dir,
        tok,
        renderer,
        model,
        stop_ids,
        generation,
        ctx,
    })
}

/// Sampling settings: the flags where given, else the model's generation_config.json when it
/// samples, else greedy.
pub fn sampling(
    generation: &GenerationConfig,
    temperature: Option<f32>,
    top_k: Option<usize>,
    top_p: Option<f32>,
) -> anyhow::Result<SamplingParams> {
    let g = generation.do_sample;
    let temperature = temperature.unwrap_or(if g {
        generation.temperature.unwrap_or(1.0)
    } else {
        0.0
    });
    if !temperature.is_finite() || temperature < 0.0 {
        bail!("temperature must be a finite number ≥ 0 (0 = greedy), got {temperature}");
    }
    let top_p = top_p.or(generation.top_p.filter(|_| g)).unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        bail!("top_p must be in (0, 1] (1 = off), got {top_p}");
    }
    Ok(SamplingParams {
        temperature,
        top_k: top_k.or(generation.top_k.filter(|_| g)).unwrap_or(0),
        top_p,
    })
}
