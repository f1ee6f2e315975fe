//! `inkling-wgpu info`: each tensor's format, bytes per format, total resident size; of the
//! bundled demo model without `--model`, as every other command.
use super::bench_calls::plural;
use super::output::{out, outln};
use crate::container::{is_pad, verify, Container, SCALES_SUFFIX};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Checkpoint or converted container directory (default: the bundled demo model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Only the totals.
    #[arg(long)]
    pub summary: bool,
    /// Also open the model as `generate` does (config.json, generation_config.json, every
    /// tensor's name and shape) and read every tensor, and refuse the model if anything is
    /// invalid or any value is NaN or ±Inf (a progress bar on a terminal; exit 1 with the field,
    /// the tensor or each damaged tensor named).
    #[arg(long)]
    pub verify: bool,
}

/// Bytes in human units (KiB, MiB, GiB).
pub use crate::human_bytes as human;

/// One line per tensor under a header row (tensor, format, bytes, shape; not with `summary`)
/// and the per-format totals, as text.
pub fn report(c: &Container, summary: bool) -> String {
    let mut out = String::new();
    if !summary {
        out.push_str(&format!(
            "{:<64} {:<10} {:>12} {}\n",
            "tensor", "format", "bytes", "shape"
        ));
    }
    let mut per: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    let mut total = 0u64;
    let mut padding = 0u64;
    let mut unstamped = Vec::new();
    for s in &c.shards {
        for t in &s.tensors {
            if is_pad(&t.name) {
                padding += t.len() as u64;
                continue;
            }
            if t.name.ends_with(SCALES_SUFFIX)
                && c.stamped(t.name.trim_end_matches(SCALES_SUFFIX)).is_some()
            {
                continue; // counted with its weight
            }
            let (fmt, bytes, shape) = match c.stamped(&t.name) {
                Some((enc, rows, cols)) => {
                    let qs = c
                        .tensor(&format!("{}{SCALES_SUFFIX}", t.name))
                        .map(|(_, q)| q.len())
                        .unwrap_or(0);
                    (enc.spelling(), (t.len() + qs) as u64, vec![rows, cols])
                }
                None if c.is_converted() && t.dtype == safetensors::Dtype::U8 => {
                    unstamped.push(t.name.clone());
                    (
                        "u8 (unstamped)".to_string(),
                        t.len() as u64,
                        t.shape.clone(),
                    )
                }
                None => (
                    format!("{:?}", t.dtype).to_lowercase(),
                    t.len() as u64,
                    t.shape.clone(),
                ),
            };
            if !summary {
                out.push_str(&format!(
                    "{:<64} {:<10} {:>12} {:?}\n",
                    t.name, fmt, bytes, shape
                ));
            }
            let e = per.entry(fmt).or_default();
            e.0 += 1;
            e.1 += bytes;
            total += bytes;
        }
    }
    out.push_str(&format!(
        "{}: {}, {}\n",
        c.dir.display(),
        plural(c.shards.len(), "shard", "shards"),
        if !c.is_converted() {
            "source checkpoint (no stamps)".to_string()
        } else if unstamped.is_empty() {
            "converted container (stamps verified)".to_string()
        } else {
            format!(
                "converted container: stamps verified, but {} U8 tensor(s) carry no stamp; their format is inferred at load from config.json's shapes and refused when the bytes allow several (first: {})",
                unstamped.len(),
                unstamped[0]
            )
        }
    ));
    for (f, (n, b)) in &per {
        let noun = if *n == 1 { "tensor " } else { "tensors" };
        out.push_str(&format!("  {f:<10} {n:>6} {noun} {:>12}\n", human(*b)));
    }
    if padding > 0 {
        out.push_str(&format!("  alignment padding {}\n", human(padding)));
    }
    out.push_str(&format!(
        "total resident size: {} ({total} bytes)\n",
        human(total)
    ));
    out
}

/// Print the report of `--model` (default: the bundled model), then `--verify` its values.
///
/// Errors: the model does not open; `--verify` finds an invalid config.json or
/// generation_config.json, or NaN or Inf.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let dir = match &a.model {
        Some(d) => d.clone(),
        None => crate::bundled::materialize()?,
    };
    let c = Container::open(&dir)?;
    out!("{}", report(&c, a.summary))?;
    if a.verify {
        // the configs first (quick), then every value (each damaged tensor listed), then the
        // tensors' names and shapes against the config as `generate` loads them
        let ck = crate::model::Checkpoint::open(&dir)?;
        super::penalties::check_generation_config(
            &ck.dir,
            &ck.generation.clone().unwrap_or_default(),
        )?;
        // tokenizer.json as `generate` loads it, and the EOS ids it warns about
        let tok = crate::model::text::load_tokenizer(&ck.dir)?;
        super::load::eos_ids(&ck, tok.as_ref());
        verify(&c)?;
        crate::model::Weights::load(&ck)?;
        outln!(
            "verify: config.json, generation_config.json, tokenizer.json and every tensor's name and \
             shape agree"
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `--verify`: scan every tensor for NaN and Inf, with a progress bar on a terminal.
fn verify(c: &Container) -> anyhow::Result<()> {
    let total = verify::scan_bytes(c);
    let pb = crate::progress::bar(
        true,
        total,
        "verify {bar:40} {bytes}/{total_bytes} [{elapsed_precise}, eta {eta}]",
    );
    let found = verify::scan(c, &mut |b| pb.inc(b));
    pb.finish_and_clear();
    if found.is_empty() {
        outln!("verify: {} read, no NaN or Inf", human(total))?;
        return Ok(());
    }
    for f in &found {
        outln!("{f}")?;
    }
    anyhow::bail!(
        "{}: {} tensor(s) hold NaN or Inf (listed above); the model is damaged",
        c.dir.display(),
        found.len()
    )
}
