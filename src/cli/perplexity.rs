//! `inkling-wgpu perplexity`: perplexity and bits per byte of a model over a text file, and
//! optionally the mean KL divergence and top-1 agreement to a base model (`--kl-base`), the
//! counterpart of llama.cpp's `llama-perplexity` (method: [`crate::model::eval`]).
use super::context::{context_length, ensure_arg};
use super::load::{gpu_backend, Device};
use crate::model::eval::{evaluate, windows, EvalStats};
use crate::model::text::load_tokenizer;
use crate::model::{Checkpoint, CpuModel, Forward, GpuModel, GpuModelOptions, Weights};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Checkpoint or container directory (config.json, weights, tokenizer.json). Default: the
    /// bundled model.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// UTF-8 text to score (encoded without special tokens).
    #[arg(long)]
    pub file: PathBuf,
    /// Tokens per window (default: the model's `max_position_embeddings`, at most 4096; a larger
    /// value than the model's is refused).
    #[arg(allow_negative_numbers = true, long)]
    pub ctx: Option<usize>,
    /// Tokens between window starts; each window scores only the tokens the previous one did
    /// not (default: ctx/2, so every scored token after the first window sees ≥ ctx/2 tokens).
    #[arg(allow_negative_numbers = true, long)]
    pub stride: Option<usize>,
    /// Do not prepend the config's `bos_token_id` (then the text's first token is not scored).
    #[arg(long)]
    pub no_bos: bool,
    /// Score only the text's first N tokens (llama-perplexity's `--chunks` in tokens).
    #[arg(allow_negative_numbers = true, long)]
    pub max_tokens: Option<usize>,
    /// Base model (same tokenizer) run on the same windows: mean KL(base ‖ model) of the token
    /// distributions, top-1 agreement and the base's perplexity.
    #[arg(long)]
    pub kl_base: Option<PathBuf>,
    /// Where to run the models.
    #[arg(long, value_enum, default_value_t = Device::Gpu)]
    pub device: Device,
    /// Print one JSON object on stdout instead of the text summary.
    #[arg(long)]
    pub json: bool,
}

fn backend<'w>(
    device: Device,
    w: &'w Weights<'w>,
    ctx: usize,
    cpu: &'w mut Option<CpuModel<'w, 'w>>,
    gpu: &'w mut Option<GpuModel<'w>>,
) -> Result<&'w mut dyn Forward> {
    Ok(match device {
        Device::Cpu => cpu.insert(CpuModel::new(w)),
        Device::Gpu => gpu.insert(gpu_backend(
            w,
            GpuModelOptions::new(ctx),
            &indicatif::ProgressBar::hidden(),
        )?),
    })
}

/// The token ids of `text` under `dir`'s tokenizer (no special tokens) and each token's byte end.
fn encode(dir: &Path, text: &str) -> Result<(Vec<u32>, Vec<usize>)> {
    let tok = load_tokenizer(dir)?
        .with_context(|| format!("{}: no tokenizer.json to encode the text", dir.display()))?;
    let enc = tok
        .encode(text, false)
        .map_err(|e| anyhow::anyhow!("{}: encoding the text: {e}", dir.display()))?;
    let ends = enc.get_offsets().iter().map(|o| o.1).collect();
    Ok((enc.get_ids().to_vec(), ends))
}

pub fn run(a: Args) -> Result<ExitCode> {
    ensure_arg!(
        a.max_tokens != Some(0),
        "--max-tokens 0 scores no token; give at least 1 (or leave it out to score the whole text)"
    );
    let dir = match &a.model {
        Some(d) => d.clone(),
        None => crate::bundled::materialize()?,
    };
    let text = std::fs::read(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    let text = String::from_utf8(text)
        .map_err(|e| anyhow::anyhow!("{}: not UTF-8 text ({e})", a.file.display()))?;
    let ck = Checkpoint::open(&dir)?;
    let ctx = context_length(a.ctx, ck.config.max_position_embeddings)?;
    let weights = Weights::load(&ck)?;
    let (mut tokens, ends) = encode(&dir, &text)?;
    if let Some(n) = a.max_tokens {
        tokens.truncate(n);
    }
    let last_end = match tokens.len() {
        0 => 0,
        n if n == ends.len() => text.len(),
        n => ends[n - 1],
    };
    let bos = ck.config.bos_token_id.filter(|_| !a.no_bos);
    // With a BOS every token of the text is predicted; without, the first one is not.
    let bytes = match bos {
        Some(b) => {
            tokens.insert(0, b);
            last_end
        }
        None => last_end - ends.first().map_or(0, |&e| e.min(last_end)),
    };
    if tokens.len() < 2 {
        let text_tokens = tokens.len() - usize::from(bos.is_some());
        let cut = match a.max_tokens {
            Some(n) if n == text_tokens => format!(" (--max-tokens {n})"),
            _ => String::new(),
        };
        bail!(
            "{}: the text gives {text_tokens} token(s){cut}; {}",
            a.file.display(),
            if bos.is_some() {
                "perplexity scores each one after the prepended BOS, so it needs at least 1"
            } else if a.no_bos {
                "with --no-bos the first token is not scored, so perplexity needs at least 2"
            } else {
                "the model has no bos_token_id (config.json), so the first token is not scored and \
                 perplexity needs at least 2"
            }
        );
    }
    let stride = a.stride.unwrap_or((ctx / 2).max(1));
    // the window plan fails only on --stride (0, or past --ctx)
    let wins = windows(tokens.len(), ctx, stride)
        .map_err(|e| super::context::BadArgument(format!("--stride {stride}: {e}")))?;
    let to_score: usize = wins.iter().map(|w| w.end - w.first_target).sum();

    let base_ck = match &a.kl_base {
        Some(b) => Some(Checkpoint::open(b)?),
        None => None,
    };
    let base_w = match &base_ck {
        Some(c) => Some(Weights::load(c)?),
        None => None,
    };
    if let (Some(bdir), Some(bck)) = (&a.kl_base, &base_ck) {
        let (mw, bw) = (ck.config.logits_width(), bck.config.logits_width());
        if mw != bw {
            bail!(
                "--kl-base {}: the base has {bw} logits per token, the model {mw}; KL needs the same vocabulary",
                bdir.display()
            );
        }
        if bdir.join("tokenizer.json").exists() {
            let (mut bt, _) = encode(bdir, &text)?;
            if let Some(n) = a.max_tokens {
                bt.truncate(n);
            }
            if let Some(b) = bos {
                bt.insert(0, b);
            }
            if bt != tokens {
                bail!(
                    "--kl-base {}: its tokenizer encodes {} differently from the model's; KL needs the same tokens",
                    bdir.display(),
                    a.file.display()
                );
            }
        }
    }

    let (mut cpu, mut gpu) = (None, None);
    let model = backend(a.device, &weights, ctx, &mut cpu, &mut gpu)?;
    let (mut bcpu, mut bgpu) = (None, None);
    let base = match &base_w {
        Some(w) => Some(backend(a.device, w, ctx, &mut bcpu, &mut bgpu)?),
        None => None,
    };
    let (backend_name, adapter) = (model.backend(), model.adapter());

    let pb = crate::progress::bar(
        true,
        to_score as u64,
        "{bar:40} {pos}/{len} tokens scored [{elapsed_precise}, eta {eta}]",
    );
    let t0 = std::time::Instant::now();
    let st = evaluate(model, base, &tokens, &wins, &mut |n| pb.inc(n as u64))?;
    let secs = t0.elapsed().as_secs_f64();
    pb.finish_and_clear();

    let report = Report {
        model: &dir,
        file: &a.file,
        kl_base: a.kl_base.as_deref(),
        ctx,
        stride,
        bos: bos.is_some(),
        windows: wins.len(),
        bytes,
        secs,
        backend: backend_name,
        adapter: &adapter,
        st: &st,
    };
    if a.json {
        println!("{}", report.json());
    } else {
        println!("{}", report.text());
    }
    Ok(ExitCode::SUCCESS)
}

/// What one run measured, for printing.
struct Report<'a> {
    model: &'a Path,
    file: &'a Path,
    kl_base: Option<&'a Path>,
    ctx: usize,
    stride: usize,
    bos: bool,
    windows: usize,
    bytes: usize,
    secs: f64,
    backend: &'static str,
    adapter: &'a str,
    st: &'a EvalStats,
}

impl Report<'_> {
    fn json(&self) -> serde_json::Value {
        let st = self.st;
        let (ppl, ppl_se) = st.perplexity();
        let (nll, nll_se) = st.nll();
        let mut v = serde_json::json!({
            "model": self.model.display().to_string(),
            "file": self.file.display().to_string(),
            "backend": self.backend,
            "adapter": self.adapter,
            "ctx": self.ctx,
            "stride": self.stride,
            "bos": self.bos,
            "windows": self.windows,
            "tokens_scored": st.tokens,
            "bytes": self.bytes,
            "nll_mean": nll,
            "nll_stderr": nll_se,
            "perplexity": ppl,
            "perplexity_stderr": ppl_se,
            "bits_per_byte": st.bits_per_byte(self.bytes),
            "seconds": self.secs,
            "tokens_per_s": st.tokens as f64 / self.secs,
        });
        if let (Some(b), Some((kl, kl_se))) = (self.kl_base, st.kl()) {
            v["kl_base"] = serde_json::json!({
                "model": b.display().to_string(),
                "mean_kl": kl,
                "mean_kl_stderr": kl_se,
                "top1_agreement": st.top1_agreement(),
                "base_perplexity": st.base_perplexity(),
            });
        }
        v
    }

    fn text(&self) -> String {
        let st = self.st;
        let (ppl, ppl_se) = st.perplexity();
        let mut s = format!(
            "perplexity {ppl:.4} ± {} | {:.4} bits per byte | {} tokens scored in {} window{} \
             (ctx {}, stride {}{}) | {:.2} s, {:.1} tok/s | {} ({})",
            plus_minus(ppl_se, 4),
            st.bits_per_byte(self.bytes),
            st.tokens,
            self.windows,
            if self.windows == 1 { "" } else { "s" },
            self.ctx,
            self.stride,
            if self.bos { ", BOS" } else { "" },
            self.secs,
            st.tokens as f64 / self.secs,
            self.backend,
            self.adapter
        );
        if let (Some((kl, kl_se)), Some(top1), Some(bp)) =
            (st.kl(), st.top1_agreement(), st.base_perplexity())
        {
            s.push_str(&format!(
                "\nmean KL to base {kl:.6} ± {} nats | top-1 agreement {:.2} % | base perplexity {bp:.4}",
                plus_minus(kl_se, 6),
                100.0 * top1
            ));
        }
        s
    }
}

/// A standard error with `digits` decimals, or `n/a` where one scored token leaves it unknown.
fn plus_minus(se: f64, digits: usize) -> String {
    if se.is_nan() {
        "n/a (one token)".into()
    } else {
        format!("{se:.digits$}")
    }
}
