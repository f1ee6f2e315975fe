//! `inkling-wgpu convert`: write a stamped quantised container (FORMATS.md, section Container).
use crate::container::{convert, ConvertOptions};
use crate::formats::{Encoding, ScaleRule};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Source checkpoint directory (either tensor-name layout).
    #[arg(long)]
    pub model: PathBuf,
    /// Destination directory.
    #[arg(long)]
    pub out: PathBuf,
    /// Routed experts: int4, int4-g32, int4-g64, int4-g128, int3-g64, bf16, f32 or keep.
    #[arg(long, default_value = "int4-g64")]
    pub experts: String,
    /// Shared experts (same spellings).
    #[arg(long, default_value = "bf16")]
    pub shared: String,
    /// Attention projections and dense MLPs (same spellings).
    #[arg(long, default_value = "bf16")]
    pub dense: String,
    /// The output head `lm_head` (same spellings; default keeps the source precision).
    #[arg(long, default_value = "keep")]
    pub head: String,
    /// How each int4/int3 scale is chosen: `mse` searches the scale of least squared error per
    /// row or group, `absmax` takes absmax/qmax (FORMATS.md, Quantisation).
    #[arg(long, default_value = "mse")]
    pub scales: ScaleRule,
    /// Replace a previous conversion in the destination.
    #[arg(long)]
    pub force: bool,
    /// Largest shard size in MiB, at least 1 (a layer's expert slab is never split).
    #[arg(allow_negative_numbers = true, long, default_value_t = 4096, value_parser = parse_shard_mib)]
    pub max_shard_mib: usize,
}

/// `--max-shard-mib`: a whole number of MiB from 1 to 2^20 (1 TiB).
pub fn parse_shard_mib(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v) if (1..=1 << 20).contains(&v) => Ok(v),
        _ => Err(format!(
            "expected a shard size in MiB from 1 to 1048576, got {s:?}"
        )),
    }
}

/// `keep` → None (source precision), otherwise an [`Encoding`] spelling; an unknown spelling is a
/// [`super::context::BadArgument`] naming `flag` (exit status 2).
pub fn parse_encoding(flag: &str, s: &str) -> anyhow::Result<Option<Encoding>> {
    if s == "keep" {
        return Ok(None);
    }
    let enc = Encoding::parse(s)
        .map_err(|e| super::context::BadArgument(format!("--{flag} {s}: {e}")))?;
    Ok(Some(enc))
}

/// `--out` names a directory, or nothing yet (a usage error otherwise: exit 2).
pub(super) fn check_out(out: &Path) -> anyhow::Result<()> {
    super::context::ensure_arg!(
        !out.exists() || out.is_dir(),
        "--out {}: not a directory; --out names the container's directory (new, empty, or an \
         earlier conversion with --force)",
        out.display()
    );
    Ok(())
}

/// Run `work`, which writes into `out`: SIGINT / SIGTERM meanwhile remove its temporary files, and
/// when it fails (or is interrupted) the directories it created for `out` are removed again when
/// empty (never one that existed before).
pub fn writing_into<T>(out: &Path, work: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    check_out(out)?;
    crate::tempfiles::remove_on_signal().context("installing the SIGINT/SIGTERM handler")?;
    let created = crate::tempfiles::track_new_dirs(out);
    let r = work();
    match &r {
        Ok(_) => crate::tempfiles::keep_dirs(&created),
        Err(_) => crate::tempfiles::remove_dirs(&created),
    }
    r
}

/// The written container (`dir`) opens and loads as `generate` loads it: every tensor's name and
/// shape against its config.json.
fn loads_as_model(dir: &Path) -> anyhow::Result<()> {
    let ck = crate::model::Checkpoint::open(dir)?;
    crate::model::Weights::load(&ck)?;
    Ok(())
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let opts = ConvertOptions {
        experts: parse_encoding("experts", &a.experts)?,
        shared: parse_encoding("shared", &a.shared)?,
        dense: parse_encoding("dense", &a.dense)?,
        head: parse_encoding("head", &a.head)?,
        scales: a.scales,
        force: a.force,
        max_shard_bytes: a.max_shard_mib << 20,
        fail: Default::default(),
        progress: true,
        check: Some(loads_as_model),
    };
    // the source's configs as `generate` reads them, before hours of conversion
    if a.model.join("config.json").is_file() {
        crate::model::TextConfig::from_dir(&a.model)?;
        let g = crate::model::GenerationConfig::from_dir(&a.model)?.unwrap_or_default();
        super::penalties::check_generation_config(&a.model, &g)?;
    }
    let s = writing_into(&a.out, || convert(&a.model, &a.out, &opts)).map_err(|e| {
        // a ModelError can only come from `loads_as_model` (the container layer below the model
        // knows nothing of it)
        if e.downcast_ref::<crate::model::ModelError>().is_some() {
            e.context(format!(
                "the converted container does not load as a model (nothing was kept): the \
                 source's config.json ({}) disagrees with its tensors",
                a.model.join("config.json").display()
            ))
        } else {
            e
        }
    })?;
    eprintln!(
        "converted {} tensors, {} in {} into {}",
        s.tensors,
        super::info::human(s.bytes),
        super::bench_calls::plural(s.shards.len(), "shard", "shards"),
        a.out.display()
    );
    for e in &s.weight_error {
        let scaled =
            crate::formats::Encoding::parse(&e.encoding).is_ok_and(|enc| enc.scale_count(1, 1) > 0);
        eprintln!(
            "{}: {}{}, {} {}, relative weight error {:.6} (‖W − deq(W)‖/‖W‖)",
            e.class,
            e.encoding,
            if scaled {
                format!(" with {} scales", a.scales.name())
            } else {
                String::new()
            },
            e.matrices,
            if e.matrices == 1 {
                "matrix"
            } else {
                "matrices"
            },
            e.relative()
        );
    }
    Ok(ExitCode::SUCCESS)
}
