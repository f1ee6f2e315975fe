//! What every command that runs the model shares: the GPU forward ([`gpu_backend`]), the ids a run
//! stops on ([`eos_ids`]) and its sampling settings ([`sampling`]), both read from the checkpoint
//! as transformers 5.24.0 `generate` reads them; and opening a chat model for `chat` and `serve`:
//! the tokenizer (with Inkling's chat specials, checked before the weights are read), the weights,
//! and a CPU or GPU forward with a KV cache of `--ctx` tokens.
use super::context::{context_length, BadArgument};
use super::output::errln;
pub use super::placement::Device;
use super::placement::PlacementArgs;
use crate::chat::Renderer;
use crate::model::config::reachable_eos;
use crate::model::sampling::SamplingParams;
use crate::model::text::{load_tokenizer, tokenizer_eos_ids};
use crate::model::{
    BatchForward, Checkpoint, CpuModel, CpuSlots, GenerationConfig, GpuModel, GpuModelOptions,
    TextConfig, Weights,
};
use anyhow::{bail, Context};
use std::path::PathBuf;
use tokenizers::Tokenizer;

/// The GPU forward of `w` with `opts` (its KV cache holds `opts`' sequence length); a missing
/// adapter is an error that points at `--device cpu`, and a software adapter (lavapipe) gets a
/// one-line note on stderr that `--device cpu` is faster there (printed above `progress`, the bar
/// or spinner the caller shows meanwhile; `ProgressBar::hidden()` for none).
pub fn gpu_backend<'w>(
    w: &'w Weights<'w>,
    opts: GpuModelOptions,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<GpuModel<'w>> {
    let gpu = crate::gpu::device::Gpu::new()
        .map_err(|e| anyhow::anyhow!("{e}; or run with `--device cpu` to use the CPU forward"))?;
    static NOTE: std::sync::Once = std::sync::Once::new();
    if gpu.is_cpu() {
        NOTE.call_once(|| {
            let note = format!(
                "note: {} is a software adapter that runs on the CPU; `--device cpu` (the CPU \
                 forward, same tokens) is usually many times faster there",
                gpu.info.name
            );
            // a hidden bar drops its println
            if progress.is_hidden() {
                errln!("{note}");
            } else {
                progress.println(note);
            }
        });
    }
    let model = GpuModel::new(&gpu, w, opts)
        .with_context(|| format!("building the GPU model on {}", gpu.describe()))?;
    Ok(model)
}

/// The EOS ids of a checkpoint, as transformers 5.24.0 `generate` stops: `generation` is
/// generation_config.json's `eos_token_id` list when the checkpoint has that file (`None` when it
/// has none), `config` config.json's (the decoder's). transformers builds its generation config from
/// generation_config.json alone when the file exists, so its list is the EOS list (empty when the
/// file sets none) and config.json's is used only without the file. `tokenizer` (the id of
/// tokenizer_config.json's `eos_token`) is appended when not listed yet; duplicates are dropped, the
/// order kept. Returns `(reachable, unreachable)`: the ids below `logits_width`, which stop a run,
/// and those at or past it, which can never be generated (transformers never matches them; the
/// caller warns).
pub fn eos_rule(
    generation: Option<&[u32]>,
    config: &[u32],
    tokenizer: &[u32],
    logits_width: usize,
) -> (Vec<u32>, Vec<u32>) {
    let mut ids: Vec<u32> = Vec::new();
    for &id in generation.unwrap_or(config).iter().chain(tokenizer) {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    reachable_eos(&ids, logits_width)
}

/// [`eos_rule`] on checkpoint `ck` and its tokenizer `tok` (for tokenizer_config.json's
/// `eos_token`; none without a tokenizer). Prints one `warning:` line per id that can never be
/// generated and returns the ids a run stops on.
pub fn eos_ids(ck: &Checkpoint, tok: Option<&Tokenizer>) -> Vec<u32> {
    let tokenizer = tok.map_or(vec![], |t| tokenizer_eos_ids(&ck.dir, t));
    let generation = ck.generation.as_ref().map(|g| g.eos_token_ids.as_slice());
    let width = ck.config.logits_width();
    let (eos, unreachable) = eos_rule(generation, &ck.config.eos_token_ids, &tokenizer, width);
    for id in unreachable {
        errln!(
            "warning: EOS id {id} is past the model's {width} logits and can never be generated; \
             ignored (as transformers does)"
        );
    }
    eos
}

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
    /// Context length in tokens (prompt and answers of the whole conversation; the KV cache's
    /// size on the GPU). Default: the model's max_position_embeddings, at most 4096; a larger
    /// value than the model's is refused.
    #[arg(allow_negative_numbers = true, long)]
    pub ctx: Option<usize>,
    #[command(flatten)]
    pub placement: PlacementArgs,
}

impl ModelArgs {
    /// `--model`, else the bundled model written to its cache directory
    /// ([`crate::bundled::materialize`]; errors say where it could not be written).
    pub fn dir(&self) -> anyhow::Result<PathBuf> {
        match &self.model {
            Some(d) => Ok(d.clone()),
            None => crate::bundled::materialize(),
        }
    }

    /// The context of a run on a model with `config` ([`context_length`]).
    pub fn context(&self, config: &TextConfig) -> Result<usize, BadArgument> {
        context_length(self.ctx, config.max_position_embeddings)
    }
}

/// An open chat model, lent to a closure by [`with_chat_model`].
pub struct ChatModel<'a> {
    pub dir: PathBuf,
    pub tok: &'a Tokenizer,
    pub renderer: &'a Renderer,
    /// The forward with its sequence slots (one for `chat`).
    pub model: &'a mut dyn BatchForward,
    /// `<|content_model_end_sampling|>` and the model's own EOS ids.
    pub stop_ids: Vec<u32>,
    pub generation: GenerationConfig,
    /// Context length in tokens.
    pub ctx: usize,
}

/// The tokenizer of `dir` and its renderer; an error naming the file when it has no chat specials.
pub fn open_tokenizer(dir: &std::path::Path) -> anyhow::Result<(Tokenizer, Renderer)> {
    if let Some(why) = crate::container::reader::model_dir_problem(dir) {
        bail!("{}: {why}", dir.display());
    }
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

/// Open the model of `args` (whose tokenizer and renderer [`open_tokenizer`] gave) with `slots`
/// sequence slots (`serve --parallel`; 1 for `chat`) and run `f` with it. Errors: what loading
/// the checkpoint and the backend give; with several slots, a KV cache that the device cannot
/// hold is refused with an error naming `--parallel` and `--ctx`.
pub fn with_chat_model<R>(
    args: &ModelArgs,
    slots: usize,
    tok: &Tokenizer,
    renderer: &Renderer,
    f: impl FnOnce(ChatModel<'_>) -> anyhow::Result<R>,
) -> anyhow::Result<R> {
    let dir = args.dir()?;
    let ck = Checkpoint::open(&dir)?;
    let ctx = args.context(&ck.config)?;
    let weights = Weights::load(&ck)?;
    let generation = ck.generation.clone().unwrap_or_default();
    let mut stop_ids = vec![renderer.specials().model_end_sampling];
    for id in eos_ids(&ck, Some(tok)) {
        if !stop_ids.contains(&id) {
            stop_ids.push(id);
        }
    }
    let placement = args.placement.placement(args.device)?;
    let opts = GpuModelOptions {
        placement,
        seq_slots: slots,
        ..GpuModelOptions::new(ctx)
    };
    // only a run that really streams reads or writes the usage file
    let streams = args.device == Device::Gpu && GpuModel::plan_slots(&weights, &opts)?.is_some();
    let usage = args.placement.usage_file(&ck, streams)?;
    let mut cpu;
    let mut gpu = None;
    let model: &mut dyn BatchForward = match args.device {
        Device::Cpu => {
            cpu = CpuSlots::new(CpuModel::new(&weights), slots)?;
            &mut cpu
        }
        Device::Gpu => {
            let hidden = indicatif::ProgressBar::hidden();
            let opts = GpuModelOptions {
                usage: usage.seed.clone(),
                ..opts
            };
            let m = gpu_backend(&weights, opts, &hidden);
            let m = if slots > 1 {
                m.with_context(|| {
                    format!(
                        "building {slots} sequence slots (--parallel) of {ctx} tokens of \
                         context (--ctx) each"
                    )
                })
            } else {
                m
            };
            gpu.insert(m?)
        }
    };
    let r = f(ChatModel {
        dir,
        tok,
        renderer,
        model,
        stop_ids,
        generation,
        ctx,
    });
    if let Some(g) = gpu.as_ref() {
        usage.save(g);
    }
    r
}

pub use crate::model::sampling::random_seed;

/// transformers 5.24.0's defaults for what a sampling generation_config.json leaves unset
/// (`GenerationConfig._get_default_generation_params`): temperature, top_k, top_p.
pub const SAMPLING_DEFAULTS: (f32, usize, f32) = (1.0, 50, 1.0);

/// Sampling settings: each flag where given (`None`: not given), else generation_config.json's
/// value when it sets `do_sample` (transformers' [`SAMPLING_DEFAULTS`] for what it leaves unset),
/// else greedy (temperature 0) with top-k off (0) and top-p off (1), as transformers decodes
/// greedily without `do_sample`. A temperature of 0 is greedy decoding (the file's 0 with
/// `do_sample` is refused, as transformers refuses it). Each field of [`GenerationConfig::ignored`]
/// is warned about on stderr. Errors: a temperature that is not finite or below 0, a top-p outside
/// (0, 1]; the message names the flag, or the file (`dir`/generation_config.json) for its own
/// values.
pub fn sampling(
    dir: &std::path::Path,
    generation: &GenerationConfig,
    temperature: Option<f32>,
    top_k: Option<usize>,
    top_p: Option<f32>,
) -> anyhow::Result<SamplingParams> {
    let (t0, k0, p0) = SAMPLING_DEFAULTS;
    let sample = generation.do_sample;
    let named = |flag: bool, field: &str| {
        if flag {
            format!("--{}", field.replace('_', "-"))
        } else {
            generation_field(dir, field)
        }
    };
    for field in &generation.ignored {
        eprintln!(
            "warning: {} sets {field}, which this engine does not implement; it is ignored",
            dir.join("generation_config.json").display()
        );
    }
    let t = pick(temperature, generation.temperature, sample, t0, 0.0);
    if t == 0.0 && temperature.is_none() && sample {
        // transformers' TemperatureLogitsWarper: "has to be a strictly positive float"
        bail!(
            "{} must be > 0 when do_sample is true (transformers refuses 0; set do_sample to \
             false for greedy decoding; generate and chat also take --temperature)",
            named(false, "temperature")
        );
    }
    if !t.is_finite() || t < 0.0 {
        bail!(
            "{} must be a finite number ≥ 0 (0 = greedy), got {t}",
            named(temperature.is_some(), "temperature")
        );
    }
    let p = pick(top_p, generation.top_p, sample, p0, 1.0);
    if !(p > 0.0 && p <= 1.0) {
        bail!(
            "{} must be in (0, 1] (1 = off), got {p}",
            named(top_p.is_some(), "top_p")
        );
    }
    let k = pick(top_k, generation.top_k, sample, k0, 0);
    Ok(SamplingParams {
        temperature: t,
        top_k: k,
        top_p: p,
        ..Default::default()
    })
}

/// How a message names `field` of `dir`/generation_config.json: `DIR/generation_config.json: FIELD`.
pub fn generation_field(dir: &std::path::Path, field: &str) -> String {
    format!("{}: {field}", dir.join("generation_config.json").display())
}

/// How many tokens `generate` asks for after a prompt of `prompt_len` tokens: `--max-tokens`
/// (`flag`) when given, else generation_config.json's `max_new_tokens`, else its `max_length`
/// less the prompt (as transformers 5.24.0 reads them), else 64. Errors, naming the file and
/// field, as transformers refuses them: a `max_new_tokens` of 0, a `max_length` the prompt fills.
pub fn new_tokens(
    flag: Option<usize>,
    g: &GenerationConfig,
    dir: &std::path::Path,
    prompt_len: usize,
) -> anyhow::Result<usize> {
    Ok(match (flag, g.max_new_tokens, g.max_length) {
        (Some(n), _, _) => n,
        (None, Some(0), _) => bail!(
            "{} must be at least 1 (transformers refuses 0), got 0; generate's --max-tokens N \
             overrides it",
            generation_field(dir, "max_new_tokens")
        ),
        (None, Some(n), _) => n,
        (None, None, Some(l)) if l <= prompt_len => bail!(
            "{} {l} (prompt and new tokens) leaves no room after {}; generate's --max-tokens N \
             overrides it",
            generation_field(dir, "max_length"),
            if prompt_len == 1 {
                "a one-token prompt".to_string()
            } else {
                format!("the prompt's {prompt_len} tokens")
            }
        ),
        (None, None, Some(l)) => l - prompt_len,
        (None, None, None) => 64,
    })
}

/// One sampling value: the flag's when given, else (when the file samples) the file's, or
/// transformers' `default` when it leaves the value unset, else `off` (the greedy value).
fn pick<T: Copy>(flag: Option<T>, file: Option<T>, sample: bool, default: T, off: T) -> T {
    flag.unwrap_or(if sample { file.unwrap_or(default) } else { off })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gen(do_sample: bool, t: Option<f32>, k: Option<usize>, p: Option<f32>) -> GenerationConfig {
        GenerationConfig {
            do_sample,
            temperature: t,
            top_k: k,
            top_p: p,
            ..Default::default()
        }
    }

    fn params(t: f32, k: usize, p: f32) -> SamplingParams {
        SamplingParams {
            temperature: t,
            top_k: k,
            top_p: p,
            ..Default::default()
        }
    }

    /// transformers 5.24.0: `GenerationConfig.from_pretrained(dir)` then
    /// `generate`'s `_prepare_generation_config` (the file's values, then the global defaults).
    #[test]
    fn sampling_follows_generation_config() {
        // {"do_sample": false, "temperature": 0.6, "top_k": 20}: greedy, the values unused
        let g = gen(false, Some(0.6), Some(20), Some(0.9));
        assert_eq!(
            sampling(std::path::Path::new("m"), &g, None, None, None).unwrap(),
            params(0.0, 0, 1.0)
        );
        // {"do_sample": true}: temperature 1.0, top_k 50, top_p 1.0
        let g = gen(true, None, None, None);
        assert_eq!(
            sampling(std::path::Path::new("m"), &g, None, None, None).unwrap(),
            params(1.0, 50, 1.0)
        );
        // {"do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95}
        let g = gen(true, Some(0.6), Some(20), Some(0.95));
        assert_eq!(
            sampling(std::path::Path::new("m"), &g, None, None, None).unwrap(),
            params(0.6, 20, 0.95)
        );
        // flags win over the file, one by one
        assert_eq!(
            sampling(std::path::Path::new("m"), &g, Some(0.8), None, Some(0.5)).unwrap(),
            params(0.8, 20, 0.5)
        );
        assert_eq!(
            sampling(std::path::Path::new("m"), &g, Some(0.0), None, None)
                .unwrap()
                .temperature,
            0.0
        );
        // sampling turned on by the flag alone: the file's values stay unused
        let g = gen(false, Some(0.6), Some(20), Some(0.9));
        assert_eq!(
            sampling(std::path::Path::new("m"), &g, Some(0.7), None, None).unwrap(),
            params(0.7, 0, 1.0)
        );
    }

    #[test]
    fn sampling_refuses_values_out_of_range_naming_their_source() {
        let g = gen(true, Some(-1.0), None, Some(1.5));
        let e = sampling(std::path::Path::new("m"), &g, None, None, Some(0.5))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("m/generation_config.json: temperature must be"),
            "{e}"
        );
        let e = sampling(std::path::Path::new("m"), &g, Some(0.5), None, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("m/generation_config.json: top_p must be in (0, 1]"),
            "{e}"
        );
        let e = sampling(std::path::Path::new("m"), &g, Some(f32::NAN), None, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--temperature must be a finite number"),
            "{e}"
        );
        let e = sampling(std::path::Path::new("m"), &g, Some(0.5), None, Some(0.0))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--top-p must be in (0, 1]"), "{e}");
    }

    /// transformers 5.24.0 `generate`: `generation_config.eos_token_id` (from generation_config.json
    /// when the checkpoint has it, else from config.json through `GenerationConfig.from_model_config`)
    /// becomes `EosTokenCriteria`'s list.
    #[test]
    fn eos_follows_generation_config_then_config() {
        // tiny-causal-f32: generation_config [2, 221], config 2
        assert_eq!(
            eos_rule(Some(&[2, 221]), &[2], &[], 416),
            (vec![2, 221], vec![])
        );
        // a generation_config.json list that differs from config.json's: its list alone
        assert_eq!(eos_rule(Some(&[7]), &[2, 9], &[], 416), (vec![7], vec![]));
        // a generation_config.json without eos_token_id: none from config.json
        assert_eq!(eos_rule(Some(&[]), &[2], &[], 416), (vec![], vec![]));
        // no generation_config.json: config.json's
        assert_eq!(eos_rule(None, &[2, 9], &[], 416), (vec![2, 9], vec![]));
        // the tokenizer's eos_token appended once; ids past the logits apart
        assert_eq!(
            eos_rule(Some(&[2, 221, 100_000]), &[2], &[221, 5], 400),
            (vec![2, 221, 5], vec![100_000])
        );
    }
}
