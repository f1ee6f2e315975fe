//! Where the routed experts live, as `generate`, `chat` and `serve` take it: `--gpu-mem`,
//! `--expert-slots` and the usage file that ranks the pinned hot set ([`PlacementArgs`]), and
//! where the model runs at all ([`Device`]).
use super::context::BadArgument;
use crate::model::usage::{self, Usage};
use crate::model::{Checkpoint, GpuModel, Placement};
use std::path::PathBuf;

/// Where a command runs the model (`--device`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Gpu,
    Cpu,
}

/// The expert placement flags (flattened into each command's arguments).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PlacementArgs {
    /// GPU memory budget in GiB, or `auto`. The dense part (attention, norms, convs, router,
    /// shared experts, embeddings, head) and the KV cache stay resident; the rest of the budget
    /// becomes expert slots and routed experts stream from the mapped container into them. A
    /// budget that holds every expert runs fully resident. `auto` (the default) runs fully
    /// resident: wgpu exposes no portable way to read the adapter's free memory.
    #[arg(allow_negative_numbers = true, long, value_parser = parse_gpu_mem)]
    pub gpu_mem: Option<GpuMem>,
    /// Exactly N expert slots instead of a budget in GiB (N ≥ every routed expert = resident).
    #[arg(allow_negative_numbers = true, long, conflicts_with = "gpu_mem", value_parser = super::values::parse_positive)]
    pub expert_slots: Option<u64>,
    /// The usage file: routing counts per (layer, expert) that rank the pinned hot set of expert
    /// slots at start-up and are updated after each streamed run. Default:
    /// `<model>/inkling-wgpu.usage.json`; `off` neither reads nor writes one. Delete it freely;
    /// one that is corrupt or belongs to another model is ignored with a warning.
    #[arg(long)]
    pub usage_file: Option<String>,
}

/// `--gpu-mem`: `auto` or a positive number of GiB.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GpuMem {
    Auto,
    GiB(f64),
}

fn parse_gpu_mem(s: &str) -> Result<GpuMem, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(GpuMem::Auto);
    }
    let num = ["GiB", "GB", "G", "gib", "gb", "g"]
        .iter()
        .find_map(|u| s.strip_suffix(u))
        .unwrap_or(s)
        .trim();
    match num.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(GpuMem::GiB(v)),
        _ => Err(format!(
            "expected `auto` or a positive number of GiB (e.g. 24, 7.5 or 24GiB), got {s:?}"
        )),
    }
}

/// The usage file of a run: where it is written after the run (`None`: nowhere) and the counts
/// read from it at start-up (the hot set to pin).
pub struct UsageFile {
    pub path: Option<PathBuf>,
    pub seed: Option<Usage>,
}

impl UsageFile {
    /// Merge what `model` routed into the file (a warning when it cannot be written). Nothing
    /// happens for a resident model or without a file.
    pub fn save(&self, model: &GpuModel<'_>) {
        let (Some(path), Some(base), Some(u)) = (&self.path, &self.seed, model.usage()) else {
            return;
        };
        if let Err(e) = u.save_merged(path, base) {
            eprintln!(
                "warning: the usage file was not written: {e} (choose another place with \
                 --usage-file PATH, or --usage-file off)"
            );
        }
    }
}

impl PlacementArgs {
    /// The placement the flags ask for on `device`. Errors: a budget or slot count with
    /// `--device cpu`.
    pub fn placement(&self, device: Device) -> Result<Placement, BadArgument> {
        let placement = match (self.expert_slots, self.gpu_mem) {
            (Some(n), _) => Placement::Slots(n as usize),
            (None, Some(GpuMem::GiB(g))) => Placement::GpuMem((g * (1u64 << 30) as f64) as u64),
            (None, Some(GpuMem::Auto) | None) => Placement::Resident,
        };
        if placement != Placement::Resident && device != Device::Gpu {
            return Err(BadArgument(
                "--gpu-mem / --expert-slots place experts on the GPU; use them with --device gpu"
                    .into(),
            ));
        }
        Ok(placement)
    }

    /// The usage file of a run on `ck` that streams experts when `streams` (a resident run
    /// neither reads nor writes one). Errors: an empty `--usage-file`.
    pub fn usage_file(&self, ck: &Checkpoint, streams: bool) -> anyhow::Result<UsageFile> {
        let dir = &ck.dir;
        let cfg = &ck.config;
        let path = match self.usage_file.as_deref() {
            _ if !streams => None,
            Some("off") => None,
            Some("") => {
                return Err(BadArgument("--usage-file needs a path, or `off`".into()).into());
            }
            Some(p) => Some(PathBuf::from(p)),
            None => Some(dir.join(usage::USAGE_FILE)),
        };
        let fingerprint = match path.as_ref().map(|_| usage::fingerprint(dir)) {
            Some(Ok(fp)) => Some(fp),
            Some(Err(e)) => {
                eprintln!("warning: no usage file this run: cannot fingerprint the model ({e})");
                None
            }
            None => None,
        };
        let path = path.filter(|_| fingerprint.is_some());
        let (n_layers, n_experts) = (cfg.num_hidden_layers, cfg.n_routed_experts);
        let seed = match (&path, &fingerprint) {
            (Some(p), Some(fp)) => Some(
                usage::load_or_warn(p, fp, n_layers, n_experts)
                    .unwrap_or_else(|| Usage::new(fp, n_layers, n_experts)),
            ),
            _ => None,
        };
        Ok(UsageFile { path, seed })
    }
}
