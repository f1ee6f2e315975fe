//! `inkling-wgpu generate`: load a checkpoint, run a forward backend, stream text.
use super::context::BadArgument;
use super::load::{eos_ids, gpu_backend, new_tokens, random_seed, Device};
use super::output::{out, outln};
use super::penalties::command_sampling;
use super::placement::PlacementArgs;
use crate::model::generate::{fit_new_tokens, generate, GenOutput, GenerateParams};
use crate::model::text::{load_tokenizer, TextStream};
use crate::model::{Checkpoint, CpuModel, Forward, GpuModel, GpuModelOptions, Weights};
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tokenizers::Tokenizer;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Checkpoint directory (config.json, safetensors, tokenizer.json). Default: the bundled demo model.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Prompt text (encoded without special tokens); `-` reads it from standard input. Without
    /// --prompt, --prompt-file or --prompt-ids, a piped standard input is the prompt.
    #[arg(long, conflicts_with = "prompt_ids")]
    pub prompt: Option<String>,
    /// Read the prompt text from a file (UTF-8, used as it is).
    #[arg(long, value_name = "PATH", conflicts_with_all = ["prompt_ids", "prompt"])]
    pub prompt_file: Option<PathBuf>,
    /// Prompt as token ids: 1,2,3
    #[arg(allow_negative_numbers = true, long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    /// Maximum new tokens (default: generation_config.json's max_new_tokens, else its max_length
    /// less the prompt, else 64); capped, with a warning, at what the model's context
    /// (max_position_embeddings) leaves after the prompt.
    #[arg(long, allow_negative_numbers = true, value_parser = super::values::parse_tokens)]
    pub max_tokens: Option<usize>,
    /// Sampling temperature; 0 = greedy (default: generation_config.json's when it sets do_sample,
    /// 1 when it sets do_sample without a temperature, else 0).
    #[arg(long, allow_negative_numbers = true, value_parser = super::values::parse_temperature)]
    pub temperature: Option<f32>,
    /// Keep only the k most likely tokens (0 or -1 = off; default: generation_config.json's when it
    /// sets do_sample, 50 when it sets do_sample without a top_k, as transformers; else 0).
    #[arg(long, allow_negative_numbers = true, value_parser = super::values::parse_top_k)]
    pub top_k: Option<usize>,
    /// Nucleus sampling mass in (0, 1] (1 = off; default: generation_config.json's when it sets
    /// do_sample, else 1).
    #[arg(long, allow_negative_numbers = true, value_parser = super::values::parse_top_p)]
    pub top_p: Option<f32>,
    #[command(flatten)]
    pub penalties: super::penalties::PenaltyArgs,
    /// PRNG seed for sampling (default: a fresh random seed each run, printed in the stats line and
    /// `stats.seed` of `--json`).
    #[arg(long, allow_negative_numbers = true)]
    pub seed: Option<u64>,
    /// Where to run the model.
    #[arg(long, value_enum, default_value_t = Device::Gpu)]
    pub device: Device,
    /// Print one JSON object on stdout instead of streamed text.
    #[arg(long)]
    pub json: bool,
    /// Profile the decode steps (GPU only): per-phase GPU time per token from timestamp queries,
    /// decode tok/s, bytes per token and the roofline (on stderr; under "profile" with --json).
    #[arg(long)]
    pub profile: bool,
    /// Copy bandwidth in GB/s for the roofline (default: measured once like `bench copy`).
    #[arg(allow_negative_numbers = true, long, value_parser = super::parse_gbs)]
    pub peak_gbs: Option<f64>,
    #[command(flatten)]
    pub placement: PlacementArgs,
    /// Test hook: fail the GPU step of the routed experts of LAYER in the step feeding position
    /// POS (streaming only), to exercise the CPU fallback.
    #[arg(long, hide = true, value_name = "POS:LAYER")]
    pub inject_gpu_failure: Option<String>,
}

/// The most bytes of prompt text worth reading: a text longer than the context (`ctx` positions,
/// 4096 when the config names none) times the tokenizer's longest token cannot fit, capped at
/// 1 GiB (also without a tokenizer, or with a normalizer, where no token bound holds).
fn max_prompt_bytes(tok: Option<&Tokenizer>, ctx: Option<usize>) -> u64 {
    let per_token = tok.map_or(usize::MAX, crate::model::text::longest_token_bytes);
    let bound = per_token.saturating_mul(ctx.unwrap_or(super::context::DEFAULT_CTX));
    (bound as u64).min(1 << 30)
}

/// The prompt's ids: `--prompt-ids`, or the prompt text (`--prompt`, `--prompt-file`, standard
/// input) encoded without special tokens. Errors: no prompt, no tokenizer for a text prompt, a
/// prompt of no tokens.
fn prompt_ids(
    args: &Args,
    tok: Option<&Tokenizer>,
    dir: &Path,
    ctx: Option<usize>,
) -> anyhow::Result<Vec<u32>> {
    let text = match &args.prompt_ids {
        Some(_) => None,
        None => super::prompt::prompt_text(
            args.prompt.as_deref(),
            args.prompt_file.as_deref(),
            max_prompt_bytes(tok, ctx),
        )?,
    };
    let prompt: Vec<u32> = match (&args.prompt_ids, &text) {
        (Some(ids), _) => ids.clone(),
        (None, Some(text)) => {
            let tok = tok.with_context(|| {
                format!("{}: no tokenizer.json; use --prompt-ids", dir.display())
            })?;
            tok.encode(text.as_str(), false)
                .map_err(|e| anyhow::anyhow!("encoding the prompt: {e}"))?
                .get_ids()
                .to_vec()
        }
        (None, None) => bail!(
            "no prompt: give --prompt TEXT, --prompt - (standard input), --prompt-file PATH or \
             --prompt-ids 1,2,3"
        ),
    };
    if prompt.is_empty() {
        bail!("the prompt encodes to no tokens");
    }
    Ok(prompt)
}

/// What a run of `args` on `ck` generates for a prompt of `prompt_len` tokens: the EOS ids and the
/// sampling settings (the rules every command shares, [`eos_ids`] and [`sampling`]), the seed, and
/// `--max-tokens` (default: generation_config.json's `max_new_tokens`, else 64) capped, with a
/// warning, at what the model's context leaves after the prompt.
fn generate_params(
    args: &Args,
    ck: &Checkpoint,
    tok: Option<&Tokenizer>,
    prompt_len: usize,
) -> anyhow::Result<GenerateParams> {
    let gen_cfg = ck.generation.clone().unwrap_or_default();
    let eos = eos_ids(ck, tok);
    let sampling = command_sampling(
        &ck.dir,
        &gen_cfg,
        args.temperature,
        args.top_k,
        args.top_p,
        args.seed,
        &args.penalties,
    )?;
    let requested = new_tokens(args.max_tokens, &gen_cfg, &ck.dir, prompt_len)?;
    let max_new_tokens = fit_new_tokens(requested, prompt_len, ck.config.max_position_embeddings)?;
    if max_new_tokens < requested {
        eprintln!(
            "warning: generating at most {max_new_tokens} tokens, not {requested}: the prompt's {} \
             tokens and the model's context of {} positions (max_position_embeddings) leave no more",
            prompt_len,
            ck.config.max_position_embeddings.unwrap_or(0)
        );
    }
    Ok(GenerateParams {
        max_new_tokens,
        sampling,
        // greedy decoding draws nothing, so its seed is 0 and never printed
        seed: match args.seed {
            Some(s) => s,
            None if sampling.temperature > 0.0 => random_seed(),
            None => 0,
        },
        eos_ids: eos,
    })
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let dir = match &args.model {
        Some(d) => d.clone(),
        None => crate::bundled::materialize()?,
    };
    let ck = Checkpoint::open(&dir)?;
    let weights = Weights::load(&ck)?;
    let tok = load_tokenizer(&dir)?;
    let prompt = prompt_ids(&args, tok.as_ref(), &dir, ck.config.max_position_embeddings)?;
    // the model refuses such ids too; here the message names the flag
    let vocab = ck.config.vocab_size;
    let ids = args.prompt_ids.as_deref().unwrap_or_default();
    if let Some(i) = ids.iter().position(|&id| id as usize >= vocab) {
        return Err(BadArgument(format!(
            "--prompt-ids: token id {} (entry {}) is outside the vocabulary of {vocab} tokens \
             (vocab_size in {})",
            ids[i],
            i + 1,
            dir.join("config.json").display()
        ))
        .into());
    }
    // the first token of a process waits for the weights' upload and the kernels' compilation
    let waiting = crate::progress::spinner(!args.json, "loading the model, compiling GPU kernels");
    let params = generate_params(&args, &ck, tok.as_ref(), prompt.len())?;

    if args.profile && args.device != Device::Gpu {
        return Err(BadArgument(
            "--profile times the GPU forward; use it with --device gpu".into(),
        )
        .into());
    }
    let placement = args.placement.placement(args.device)?;
    // the KV cache holds what can be used: prompt + new tokens, within the model's context
    let max_seq = prompt.len().saturating_add(params.max_new_tokens.max(1));
    let mut opts = GpuModelOptions {
        placement,
        ..GpuModelOptions::new(max_seq)
    };
    // Only a run that really streams reads or writes the usage file.
    let streams = args.device == Device::Gpu && GpuModel::plan_slots(&weights, &opts)?.is_some();
    let usage = args.placement.usage_file(&ck, streams)?;
    let inject = match args.inject_gpu_failure.as_deref() {
        None => None,
        Some(s) => {
            let (a, b) = s
                .split_once(':')
                .context("--inject-gpu-failure takes POS:LAYER")?;
            Some((a.parse::<usize>()?, b.parse::<usize>()?))
        }
    };

    let mut cpu_model;
    let mut gpu_model = None;
    // pipelines built before the first token (load and prefill) and after it (decode)
    let mut compiles = None;
    let backend: &mut dyn Forward = match args.device {
        Device::Cpu => {
            cpu_model = CpuModel::new(&weights);
            &mut cpu_model
        }
        Device::Gpu => {
            opts.usage = usage.seed.clone();
            let m = gpu_model.insert(gpu_backend(&weights, opts, &waiting)?);
            compiles = Some(m.gpu().compiles.clone());
            if let Some((pos, layer)) = inject {
                m.inject_routed_failure(pos, layer)?;
            }
            if args.profile {
                m.start_profile();
            }
            m
        }
    };

    let mut stream = tok.as_ref().map(TextStream::new);
    let mut text = String::new();
    let json = args.json;
    let mut at_first_token = None;
    // when each generated id reached the host, from the first one's arrival (--json)
    let mut first_at = None;
    let mut token_times = Vec::new();
    let mut on_token = |id: u32| -> anyhow::Result<()> {
        let now = std::time::Instant::now();
        let t0 = *first_at.get_or_insert_with(|| {
            at_first_token = compiles.as_ref().map(|c| c.read());
            now
        });
        token_times.push((now - t0).as_secs_f64());
        if !waiting.is_finished() {
            waiting.finish_and_clear();
        }
        let piece = match stream.as_mut() {
            Some(s) => s.step(id)?,
            None => format!("[{id}]"),
        };
        if !piece.is_empty() {
            text.push_str(&piece);
            if !json {
                out!("{piece}")?;
            }
        }
        Ok(())
    };
    let out = generate(backend, &prompt, &params, &mut on_token);
    waiting.finish_and_clear();
    let out: GenOutput = out?;
    // the first token's callback ran when there was one
    let pipelines = match (compiles.as_ref(), at_first_token) {
        (Some(c), Some(first)) => {
            let one = |x: crate::gpu::kernel::Compiles| serde_json::json!({ "count": x.count, "seconds": x.seconds });
            serde_json::json!({ "to_first_token": one(first), "decode": one(c.read().since(first)) })
        }
        _ => serde_json::Value::Null,
    };
    // the seed of a sampled run, printed so that it can be repeated; none for greedy decoding
    let seed = (params.sampling.temperature > 0.0).then_some(params.seed);
    let (backend_name, adapter) = (backend.backend(), backend.adapter());
    let report = match gpu_model.as_mut() {
        Some(m) if args.profile => {
            let profile = m.take_profile()?;
            let (copy_gbs, copy_source) =
                super::bench_decode::copy_bandwidth(m.gpu(), args.peak_gbs, None)?;
            Some(crate::model::profile::DecodeReport {
                adapter: adapter.clone(),
                model: dir.display().to_string(),
                decode_tok_s: out.stats.decode_tok_s,
                tok_s_profiled: true,
                profile,
                copy_gbs,
                copy_source,
                stream: m.stream_stats(),
            })
        }
        _ => None,
    };
    let experts = gpu_model.as_ref().and_then(|m| m.stream_stats());
    if let Some(s) = stream.as_mut() {
        let tail = s.finish()?;
        text.push_str(&tail);
        if !json {
            out!("{tail}")?;
        }
    }
    let s = &out.stats;
    if json {
        let mut v = serde_json::json!({
            "prompt_ids": prompt,
            "generated_ids": out.generated_ids,
            "text": text,
            "finish_reason": out.finish_reason.as_str(),
            "stats": {
                "prompt_tokens": s.prompt_tokens,
                "generated_tokens": s.generated_tokens,
                "prefill_s": s.prefill_s,
                "ttft_s": s.ttft_s,
                "decode_tok_s": s.decode_tok_s,
                "token_times_s": token_times,
                "seed": seed,
                "pipelines_built": pipelines,
                "backend": backend_name,
                "adapter": adapter,
                "experts": match &experts {
                    Some(x) => x.to_json(),
                    None => serde_json::json!({ "resident": true }),
                },
            }
        });
        if let Some(r) = &report {
            v["profile"] = r.to_json();
        }
        outln!("{v}")?;
    } else {
        outln!()?;
    }
    // after the text's final newline, so a warning starts its own line
    if let Some(m) = gpu_model.as_ref() {
        usage.save(m);
    }
    // the first token comes from the prompt's forward: a rate needs a decode step after it
    let decode = if s.generated_tokens > 1 {
        format!("decode {:.1} tok/s", s.decode_tok_s)
    } else {
        "no decode step".to_string()
    };
    eprintln!(
        "prompt tokens {} | prefill {:.3} s | TTFT {:.3} s | {} generated, {decode} | finish {}{} | {} ({})",
        s.prompt_tokens,
        s.prefill_s,
        s.ttft_s,
        s.generated_tokens,
        out.finish_reason.as_str(),
        seed.map(|n| format!(" | seed {n}")).unwrap_or_default(),
        backend_name,
        adapter
    );
    if let Some(x) = &experts {
        eprintln!("{}", x.line());
    }
    if let Some(r) = &report {
        eprintln!("{}", r.text());
    }
    Ok(ExitCode::SUCCESS)
}
