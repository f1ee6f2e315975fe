//! Writing a whole container, shared by `convert` and `synth`: the shard plan (which groups go
//! into which shard file, their names and exact sizes), the destination check (only a previous
//! conversion of ours is ever replaced, [`super::replace`]), and [`write_container`], which streams the groups through
//! [`ShardWriter`] (one shard file each) and renames everything into place once complete.

use super::reader::Container;
use super::replace::{
    is_container_file, is_our_temporary, previous_conversion, recover_interrupted_swap,
    staging_dir, swap_into_place,
};
use super::stamp::{SHAPE_KEY, STAMP_KEY};
use super::writer::{tmp_path, FailPlan, PlannedTensor, ShardWriter, WriteBudget};
use super::{VERSION, VERSION_KEY};
use crate::formats::{Encoding, Format};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// What a conversion wrote.
#[derive(Clone, Debug)]
pub struct ConvertSummary {
    pub shards: Vec<PathBuf>,
    pub tensors: usize,
    /// Bytes of the shard files as written (headers, tensor data and alignment padding).
    pub bytes: u64,
    /// Re-encoding error per class of matrix (empty for writers that re-encode nothing).
    pub weight_error: Vec<WeightError>,
}

/// Squared re-encoding error of one class of matrices (routed experts, shared experts, dense,
/// head): `Σ ‖W − deq(W)‖²` and `Σ ‖W‖²` over the class's matrices (f64).
#[derive(Clone, Debug, PartialEq)]
pub struct WeightError {
    pub class: &'static str,
    pub encoding: String,
    pub matrices: usize,
    pub err_sq: f64,
    pub norm_sq: f64,
}

impl WeightError {
    /// Relative Frobenius error `sqrt(Σ‖W − deq(W)‖² / Σ‖W‖²)` of the class.
    pub fn relative(&self) -> f64 {
        (self.err_sq / self.norm_sq.max(f64::MIN_POSITIVE)).sqrt()
    }
}

/// One output unit of a container: its planned tensors (a weight and, for quantised encodings,
/// its `.qs` companion; or one copied tensor) and the stamp of a converted matrix.
#[derive(Clone, Debug)]
pub struct OutItem {
    pub tensors: Vec<PlannedTensor>,
    /// `(encoding, [rows, cols])` of a matrix the writer stamps; `None` for copied tensors.
    pub stamp: Option<(Encoding, [usize; 2])>,
}

/// Items never split across shards: one tensor, or one layer's routed experts (the slab).
#[derive(Clone, Debug, Default)]
pub struct OutGroup {
    pub items: Vec<OutItem>,
}

/// Produces the bytes of each item, one at a time, in plan order.
pub trait ItemSource {
    /// The bytes of item `item` of group `group`, one buffer per planned tensor of the item.
    fn produce(&mut self, group: usize, item: usize) -> Result<Vec<std::borrow::Cow<'_, [u8]>>>;
}

/// Settings of [`write_container`] shared by `convert` and `synth`.
#[derive(Clone, Debug)]
pub struct WriteOptions {
    /// Replace a previous container in the destination.
    pub force: bool,
    /// Start a new shard once one holds this many bytes (a group is never split).
    pub max_shard_bytes: usize,
    /// Faults to inject into the write (tests of the clean-up paths; none by default).
    pub fail: FailPlan,
    /// Draw a progress bar on stderr (only when stderr is a terminal).
    pub progress: bool,
    /// A check of the complete container (its directory: the destination, or the staging
    /// directory of a replacement) before it is kept; when it fails, what this write made is
    /// removed (a replaced container stays) and its error returned. `convert` loads the model
    /// there as `generate` does.
    pub check: Option<Check>,
}

/// [`WriteOptions::check`]'s type.
pub type Check = fn(&Path) -> Result<()>;

/// Split groups into shards: a new shard starts when the current one would pass `max_shard_bytes`.
/// Returns the group indices of each shard.
pub fn plan_shards(groups: &[OutGroup], max_shard_bytes: usize) -> Vec<Vec<usize>> {
    let mut shards: Vec<Vec<usize>> = vec![vec![]];
    let mut cur = 0usize;
    for (gi, g) in groups.iter().enumerate() {
        let bytes: usize = g
            .items
            .iter()
            .flat_map(|it| &it.tensors)
            .map(|t| t.nbytes() + t.align)
            .sum();
        if cur > 0 && cur + bytes > max_shard_bytes {
            shards.push(vec![]);
            cur = 0;
        }
        shards.last_mut().unwrap().push(gi);
        cur += bytes;
    }
    shards
}

/// Shard file names for `n` shards.
pub fn shard_names(n: usize) -> Vec<String> {
    if n == 1 {
        vec!["model.safetensors".into()]
    } else {
        (1..=n)
            .map(|i| format!("model-{i:05}-of-{n:05}.safetensors"))
            .collect()
    }
}

/// Metadata of one shard: format, container version, stamps and logical shapes of its items.
fn shard_metadata<'a>(items: impl Iterator<Item = &'a OutItem>) -> Vec<(String, String)> {
    let mut stamps = Vec::new();
    let mut shapes = Vec::new();
    for it in items {
        if let Some((enc, shape)) = it.stamp {
            let name = it.tensors[0].name.clone();
            stamps.push((name.clone(), enc.format.name().to_string()));
            if !matches!(enc.format, Format::F32 | Format::Bf16) {
                shapes.push((name, shape));
            }
        }
    }
    vec![
        ("format".to_string(), "pt".to_string()),
        (VERSION_KEY.to_string(), VERSION.to_string()),
        (
            STAMP_KEY.to_string(),
            json_map(
                stamps
                    .iter()
                    .map(|(k, v)| (k, serde_json::to_string(v).unwrap())),
            ),
        ),
        (
            SHAPE_KEY.to_string(),
            json_map(
                shapes
                    .iter()
                    .map(|(k, v)| (k, serde_json::to_string(v).unwrap())),
            ),
        ),
    ]
}

/// Exact sizes in bytes of the shard files [`write_container`] would write (header included).
pub fn shard_file_sizes(groups: &[OutGroup], max_shard_bytes: usize) -> Vec<u64> {
    plan_shards(groups, max_shard_bytes)
        .iter()
        .map(|gs| {
            let items: Vec<&OutItem> = gs.iter().flat_map(|&g| &groups[g].items).collect();
            let tensors: Vec<PlannedTensor> =
                items.iter().flat_map(|it| it.tensors.clone()).collect();
            let (lay, len) = super::writer::layout(&tensors);
            let hdr = super::writer::header(&lay, &shard_metadata(items.into_iter()));
            (8 + hdr.len() + len) as u64
        })
        .collect()
}

/// Create `dst_dir` and check that writing a container there replaces nothing but a previous
/// conversion of ours ([`previous_conversion`]: every file proved ours, else an error naming the
/// one that is not, `force` or not), and that only with `force`; without a previous conversion,
/// none of `files` (the side files the writer adds, e.g. `config.json`) may exist yet. Returns the
/// previous conversion's files (empty: a fresh write).
pub fn check_destination(dst_dir: &Path, force: bool, files: &[&str]) -> Result<Vec<PathBuf>> {
    // a replacement killed between its two renames (systems without an atomic exchange)
    recover_interrupted_swap(dst_dir)?;
    std::fs::create_dir_all(dst_dir).with_context(|| format!("creating {}", dst_dir.display()))?;
    let previous = previous_conversion(dst_dir, files)?;
    if !previous.is_empty() && !force {
        let names: Vec<String> = previous
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .filter(|n| is_container_file(n))
            .collect();
        bail!(
            "{} already holds a conversion ({}); pass --force to replace it",
            dst_dir.display(),
            names.join(", ")
        );
    }
    if previous.is_empty() {
        if let Some(f) = files.iter().find(|f| dst_dir.join(f).exists()) {
            bail!(
                "{} already exists and is not part of a conversion; refusing to replace it, even \
                 with --force (choose another --out)",
                dst_dir.join(f).display()
            );
        }
        // a fresh write goes into an empty directory (beside nothing a later --force would
        // refuse to replace); temporaries of our own are removed below
        if let Some(other) = foreign_entry(dst_dir, files) {
            bail!(
                "{} is not empty (it holds {}); a container is written into a new or empty \
                 directory, or replaces a conversion of its own (choose another --out)",
                dst_dir.display(),
                other
            );
        }
    }
    // temporaries of an earlier run that was killed before it could remove them: only once the
    // write is going ahead, so a refused run deletes nothing
    crate::tempfiles::remove_stale(dst_dir, |f| is_container_file(f) || files.contains(&f));
    Ok(previous)
}

/// The name of the first entry of `dir` (sorted) that is not a temporary of ours for a
/// container file or one of `files`; `None` when there is none.
fn foreign_entry(dir: &Path, files: &[&str]) -> Option<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names.into_iter().find(|n| !is_our_temporary(n, files))
}

/// Write a stamped container into `dst_dir`: the groups in order through [`ShardWriter`] (temp
/// files renamed into place only when every shard is complete), the index when sharded, then
/// `files` (name, bytes) each through its own temp file; finally reopen and verify it.
/// Refuses a destination holding a previous container unless `opts.force`; a replacement is
/// written whole into a staging directory beside `dst_dir` and swapped in atomically
/// ([`super::replace`]), so the old container stays whole until the new one is.
pub fn write_container(
    dst_dir: &Path,
    groups: &[OutGroup],
    source: &mut dyn ItemSource,
    files: &[(&str, Vec<u8>)],
    opts: &WriteOptions,
) -> Result<ConvertSummary> {
    let names: Vec<&str> = files.iter().map(|f| f.0).collect();
    let previous = check_destination(dst_dir, opts.force, &names)?;
    if previous.is_empty() {
        let summary = write_files(dst_dir, groups, source, files, opts)?;
        if let Some(check) = opts.check {
            if let Err(e) = check(dst_dir) {
                // the destination held nothing of ours before: remove every file written
                let index = dst_dir.join("model.safetensors.index.json");
                for f in summary.shards.iter().chain(std::iter::once(&index)) {
                    let _ = std::fs::remove_file(f);
                }
                for (name, _) in files {
                    let _ = std::fs::remove_file(dst_dir.join(name));
                }
                return Err(e);
            }
        }
        return Ok(summary);
    }
    // a replacement is written whole beside the old container, then swapped in
    let st = staging_dir(dst_dir);
    // only this process names a staging directory with its pid: one left here is its own (a
    // test that stopped a replacement half way)
    crate::tempfiles::remove_tree(&st);
    crate::tempfiles::create_tree(&st)
        .with_context(|| format!("creating the staging directory {}", st.display()))?;
    let summary = write_files(&st, groups, source, files, opts)
        .inspect_err(|_| crate::tempfiles::remove_tree(&st))?;
    if let Some(check) = opts.check {
        check(&st).inspect_err(|_| crate::tempfiles::remove_tree(&st))?;
    }
    swap_into_place(&st, dst_dir, opts.fail.crash_at)?;
    Ok(ConvertSummary {
        shards: summary
            .shards
            .iter()
            .map(|p| dst_dir.join(p.file_name().expect("a shard name")))
            .collect(),
        ..summary
    })
}

/// [`write_container`]'s write proper into `dst_dir` (the destination, or the staging directory
/// of a replacement): shards through temporary files renamed into place once all are complete,
/// the index, the side files, then the self-check.
fn write_files(
    dst_dir: &Path,
    groups: &[OutGroup],
    source: &mut dyn ItemSource,
    files: &[(&str, Vec<u8>)],
    opts: &WriteOptions,
) -> Result<ConvertSummary> {
    let shard_groups = plan_shards(groups, opts.max_shard_bytes);
    let n = shard_groups.len();
    let names = shard_names(n);

    let total_bytes: u64 = groups
        .iter()
        .flat_map(|g| &g.items)
        .flat_map(|it| &it.tensors)
        .map(|t| t.nbytes() as u64)
        .sum();
    let total_tensors: usize = groups.iter().map(|g| g.items.len()).sum();
    let pb = crate::progress::bar(
        opts.progress,
        total_bytes,
        "{bar:40} {bytes}/{total_bytes} {msg} [{elapsed_precise}, eta {eta}]",
    );

    let mut budget = WriteBudget {
        written: 0,
        fail: opts.fail,
    };
    let mut tmps: Vec<PathBuf> = Vec::new();
    let mut weight_map: Vec<(String, String)> = Vec::new();
    let mut done_tensors = 0usize;
    let result = (|| -> Result<()> {
        for (si, gs) in shard_groups.iter().enumerate() {
            let items: Vec<(usize, usize)> = gs
                .iter()
                .flat_map(|&g| (0..groups[g].items.len()).map(move |i| (g, i)))
                .collect();
            let tensors: Vec<PlannedTensor> = items
                .iter()
                .flat_map(|&(g, i)| groups[g].items[i].tensors.clone())
                .collect();
            let meta = shard_metadata(items.iter().map(|&(g, i)| &groups[g].items[i]));
            let final_path = dst_dir.join(&names[si]);
            tmps.push(tmp_path(&final_path));
            let mut w = ShardWriter::create(&final_path, &tensors, &meta)?;
            for t in &tensors {
                weight_map.push((t.name.clone(), names[si].clone()));
            }
            for (g, i) in items {
                let item = &groups[g].items[i];
                let bufs = source.produce(g, i)?;
                if bufs.len() != item.tensors.len() {
                    bail!(
                        "{}: {} buffers for {} planned tensors",
                        item.tensors[0].name,
                        bufs.len(),
                        item.tensors.len()
                    );
                }
                for (t, b) in item.tensors.iter().zip(&bufs) {
                    w.write(&t.name, b, &mut budget)?;
                    pb.inc(b.len() as u64);
                }
                done_tensors += 1;
                pb.set_message(format!("{done_tensors}/{total_tensors} tensors"));
            }
            w.finish()?;
        }
        Ok(())
    })();
    if let Err(e) = result {
        for t in &tmps {
            crate::tempfiles::discard(t);
        }
        pb.abandon();
        return Err(e);
    }
    pb.finish_and_clear();

    // Every shard is complete: rename into place.
    let mut finals = Vec::new();
    for (t, name) in tmps.iter().zip(&names) {
        let f = dst_dir.join(name);
        crate::tempfiles::rename_into_place(t, &f)
            .with_context(|| format!("renaming {} to {}", t.display(), f.display()))?;
        finals.push(f);
    }
    if n > 1 {
        let wm: serde_json::Map<String, serde_json::Value> = weight_map
            .iter()
            .filter(|(k, _)| !super::is_pad(k))
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        let idx = serde_json::json!({"metadata": {"total_size": total_bytes}, "weight_map": wm});
        write_atomic(
            &dst_dir.join("model.safetensors.index.json"),
            serde_json::to_string_pretty(&idx)?.as_bytes(),
        )?;
    }
    for (f, bytes) in files {
        write_atomic(&dst_dir.join(f), bytes)?;
    }
    // Self-check: the new container opens and every stamp verifies.
    Container::open(dst_dir)
        .map_err(anyhow::Error::from)
        .context("verifying the written container")?;
    let bytes = finals
        .iter()
        .map(|f| std::fs::metadata(f).map_or(0, |m| m.len()))
        .sum();
    Ok(ConvertSummary {
        shards: finals,
        tensors: done_tensors,
        bytes,
        weight_error: Vec::new(),
    })
}

fn json_map<'a>(pairs: impl Iterator<Item = (&'a String, String)>) -> String {
    let mut s = String::from("{");
    for (i, (k, v)) in pairs.enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&serde_json::to_string(k).unwrap());
        s.push(':');
        s.push_str(&v);
    }
    s.push('}');
    s
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::tempfiles::write_atomic(path, bytes)
        .with_context(|| format!("writing {}", path.display()))
}
