//! `inkling-wgpu shaders --out DIR`: write every WGSL module the engine can build
//! (`gpu::variants::all`), one file per pipeline, named by its pipeline key, plus `index.json`
//! (key, file, entry point, bindings, whether it needs subgroups) for translating them with other
//! tools (naga, Tint, DXC, the Metal compiler). No device is opened.
//!
//! A run into the folder of an earlier run replaces that output completely: the files its
//! `index.json` lists (and the index) are deleted first, so the folder holds exactly what the
//! new index lists. Anything else in the folder is a user's file: the run refuses, naming it,
//! and deletes nothing ([`previous_output`]).
use crate::gpu::kernel::{Bind, KernelSpec};
use crate::gpu::limits::LimitProfile;
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Directory to write into (created if missing; must be empty or hold only a previous
    /// `shaders` output, i.e. an `index.json` written by this command and the files it lists,
    /// which are replaced).
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

/// The files of an earlier output in `dir` (its `index.json` and the modules it lists that
/// exist), to delete before writing anew; empty when `dir` is missing or empty.
///
/// Errors, before anything is deleted: `dir` is not a directory; it is not empty and holds no
/// `index.json`, or one that is not this command's (not JSON, no `kernels` list, or an entry
/// whose `file` is not [`file_name`] of its `key`); it holds an entry the index does not list
/// (a user's file or folder, named in the error).
pub fn previous_output(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    if !dir.is_dir() {
        bail!("--out {}: exists and is not a directory", dir.display());
    }
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e.with_context(|| format!("reading {}", dir.display()))?;
        names.push(e.file_name());
    }
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let ip = dir.join(INDEX);
    let foreign = |what: String| {
        anyhow::anyhow!(
            "--out {}: {what}, so it is not only an earlier output of `inkling-wgpu shaders`; \
             nothing was deleted or written: move that away or choose an empty or new directory",
            dir.display()
        )
    };
    if !ip.is_file() {
        return Err(foreign(format!(
            "not empty and holds no {INDEX} of an earlier run"
        )));
    }
    let text = std::fs::read_to_string(&ip).with_context(|| format!("reading {}", ip.display()))?;
    let doc: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| foreign(format!("{} is not JSON ({e})", ip.display())))?;
    let kernels = doc["kernels"]
        .as_array()
        .ok_or_else(|| foreign(format!("{} has no \"kernels\" list", ip.display())))?;
    let mut listed = std::collections::HashSet::new();
    for k in kernels {
        match (k["key"].as_str(), k["file"].as_str()) {
            (Some(key), Some(file)) if file == file_name(key) => {
                listed.insert(std::ffi::OsString::from(file));
            }
            _ => {
                return Err(foreign(format!(
                    "{} lists an entry that is not a module of this command: {k}",
                    ip.display()
                )))
            }
        }
    }
    let mut ours = Vec::new();
    for n in names {
        let p = dir.join(&n);
        if n == INDEX {
            continue;
        }
        if !listed.contains(&n) || !p.is_file() {
            return Err(foreign(format!("{} is not listed in {INDEX}", p.display())));
        }
        ours.push(p);
    }
    ours.push(ip);
    Ok(ours)
}

/// Write every kernel of `profile` (see [`Args::limits`]) into `dir`, replacing an earlier
/// output there ([`previous_output`]); returns `(spec, path)` for each file written, in
/// [`crate::gpu::variants::all`]'s order.
///
/// Errors: those of [`previous_output`]; a delete or write fails (named by path).
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
    for p in previous_output(dir)? {
        std::fs::remove_file(&p).with_context(|| format!("deleting {}", p.display()))?;
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
        "wrote {} ({gemv} GEMV, {} other) and {INDEX} to {}",
        super::bench_calls::plural(written.len(), "WGSL module", "WGSL modules"),
        written.len() - gemv,
        a.out.display()
    );
    Ok(ExitCode::SUCCESS)
}
