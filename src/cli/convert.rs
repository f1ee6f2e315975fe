//! `inkling-wgpu convert`: write a stamped quantised container (FORMATS.md, section Container).
use crate::container::{convert, ConvertOptions};
use crate::formats::{Encoding, ScaleRule};
use std::path::PathBuf;
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
    /// Largest shard size in MiB (a layer's expert slab is never split).
    #[arg(long, default_value_t = 4096)]
    pub max_shard_mib: usize,
}

/// `keep` → None (source precision), otherwise an [`Encoding`] spelling.
pub fn parse_encoding(s: &str) -> anyhow::Result<Option<Encoding>> {
    if s == "keep" {
        return Ok(None);
    }
    Ok(Some(Encoding::parse(s)?))
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let opts = ConvertOptions {
        experts: parse_encoding(&a.experts)?,
        shared: parse_encoding(&a.shared)?,
        dense: parse_encoding(&a.dense)?,
        head: parse_encoding(&a.head)?,
        scales: a.scales,
        force: a.force,
        max_shard_bytes: a.max_shard_mib.max(1) << 20,
        fail_after_bytes: std::env::var("INKLING_CONVERT_FAIL_AFTER")
            .ok()
            .and_then(|v| v.parse().ok()),
        progress: true,
    };
    let s = convert(&a.model, &a.out, &opts)?;
    eprintln!(
        "converted {} tensors, {} in {} shard(s) into {}",
        s.tensors,
        super::info::human(s.bytes),
        s.shards.len(),
        a.out.display()
    );
    for e in &s.weight_error {
        let scaled =
            crate::formats::Encoding::parse(&e.encoding).is_ok_and(|enc| enc.scale_count(1, 1) > 0);
        eprintln!(
            "{}: {}{}, {} matrices, relative weight error {:.6} (‖W − deq(W)‖/‖W‖)",
            e.class,
            e.encoding,
            if scaled {
                format!(" with {} scales", a.scales.name())
            } else {
                String::new()
            },
            e.matrices,
            e.relative()
        );
    }
    Ok(ExitCode::SUCCESS)
}
