//! `inkling-wgpu shaders --out DIR`: write every WGSL module the engine can build
//! (`gpu::variants::all`), one file per pipeline, named by its pipeline key, plus `index.json`
//! (key, file, entry point, bindings, whether it needs subgroups) for translating them with other
//! tools (naga, Tint, DXC, the Metal compiler). No device is opened.
use crate::gpu::kernel::{Bind, KernelSpec};
use crate::gpu::limits::LimitProfile;
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Directory to write into (created if missing; must be empty or hold a previous `shaders`
    /// output, i.e. an `index.json` written by this command).
    #[arg(long)]
    pub out: PathBuf,
    /// Only the kernels a device clamped to this limit profile builds (`apple-m1`, `webgpu`,
    /// `no-subgroups`: x tiles that fit its workgroup memory, no subgroup variants without
    /// subgroups). Default: every kernel on any device.
    #[arg(long, value_parser = LimitProfile::parse)]
    pub limits: Option<LimitProfile>,
    /// Only the kernels a model over this checkpoint or container can build (its matrices'
    /// encodings and column counts; `gpu::variants::for_model`). The weights are read, no device
    /// is opened.
    #[arg(long)]
    pub model: Option<PathBuf>,
}

/// Name of the index file.
pub const INDEX: &str = "index.json";

/// The file name of a pipeline key: every character other than `A-Za-z0-9._-` becomes `_`,
/// then `.wgsl`.
pub fn file_name(key: &str) -> String {
    let stem: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{stem}.wgsl")
}

/// The text written for `spec`: a comment naming key and entry point, then the WGSL.
fn file_text(spec: &KernelSpec) -> String {
    format!(
        "// inkling-wgpu pipeline {} (entry point {})\n{}",
        spec.key, spec.entry, spec.source
    )
}

/// Write every kernel of `profile` (see [`Args::limits`]) into `dir`; returns `(spec, path)`
/// for each file written, in [`crate::gpu::variants::all`]'s order.
///
/// Errors: `dir` is a file, or a non-empty directory without a previous `index.json`; a write
/// fails (named by path).
pub fn write(
    dir: &Path,
    profile: Option<LimitProfile>,
) -> anyhow::Result<Vec<(KernelSpec, PathBuf)>> {
    write_specs(dir, profile, crate::gpu::variants::all(profile))
}

/// [`write`] of the kernels `specs` (built for `profile`, which the index records).
pub fn write_specs(
    dir: &Path,
    profile: Option<LimitProfile>,
    specs: Vec<KernelSpec>,
) -> anyhow::Result<Vec<(KernelSpec, PathBuf)>> {
    if dir.exists() {
        if !dir.is_dir() {
            bail!("--out {}: exists and is not a directory", dir.display());
        }
        let mut entries =
            std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
        if entries.next().is_some() && !dir.join(INDEX).is_file() {
            bail!(
                "--out {}: a non-empty directory that holds no {INDEX} of a previous \
                 `inkling-wgpu shaders`; refusing to write into it",
                dir.display()
            );
        }
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut seen = std::collections::HashSet::new();
    let mut index = Vec::with_capacity(specs.len());
    let mut out = Vec::with_capacity(specs.len());
    for s in specs {
        let name = file_name(&s.key);
        if !seen.insert(name.clone()) {
            bail!("two pipeline keys map to the file name {name}");
        }
        let path = dir.join(&name);
        std::fs::write(&path, file_text(&s))
            .with_context(|| format!("writing {}", path.display()))?;
        let binds: Vec<_> = s
            .binds
            .iter()
            .map(|&(b, kind)| {
                let kind = match kind {
                    Bind::Uniform => "uniform",
                    Bind::Read => "storage, read",
                    Bind::Write => "storage, read_write",
                };
                serde_json::json!({ "binding": b, "type": kind })
            })
            .collect();
        index.push(serde_json::json!({
            "key": s.key, "file": name, "entry_point": s.entry, "bindings": binds,
            "subgroups": s.subgroups,
        }));
        out.push((s, path));
    }
    let doc = serde_json::json!({
        "limits": profile.map(|p| p.name()),
        "kernels": index,
    });
    let ip = dir.join(INDEX);
    std::fs::write(&ip, serde_json::to_string_pretty(&doc)? + "\n")
        .with_context(|| format!("writing {}", ip.display()))?;
    Ok(out)
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let written = match &a.model {
        None => write(&a.out, a.limits)?,
        Some(dir) => {
            let ck = crate::model::Checkpoint::open(dir)
                .with_context(|| format!("--model {}", dir.display()))?;
            let w = crate::model::Weights::load(&ck)
                .with_context(|| format!("--model {}", dir.display()))?;
            let specs = crate::gpu::variants::for_model(&w.linear_shapes(), a.limits);
            write_specs(&a.out, a.limits, specs)?
        }
    };
    let gemv = written
        .iter()
        .filter(|w| w.0.key.starts_with("gemv:"))
        .count();
    println!(
        "wrote {} WGSL modules ({gemv} GEMV, {} other) and {INDEX} to {}",
        written.len(),
        written.len() - gemv,
        a.out.display()
    );
    Ok(ExitCode::SUCCESS)
}
