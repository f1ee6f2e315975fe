//! `inkling-wgpu convert`: a source checkpoint (either layout) → a stamped container.
//!
//! Released-layout source names (layout b) are renamed to transformers names (layout a) through
//! the loader's one mapping, [`super::names::released_to_causal`].

use super::names::released_to_causal;
use super::reader::{to_f32, Container, TensorEntry};
use super::stamp::{SCALES_SUFFIX, STAMP_KEY};
use super::write::{
    check_destination, write_container, ItemSource, OutGroup, OutItem, WriteOptions,
};
pub use super::write::{ConvertSummary, WeightError};
use super::writer::{FailPlan, PlannedTensor};
use super::{expert_name, shared_expert_name, Proj, PART_ALIGN, SLAB_ALIGN, TENSOR_ALIGN};
use crate::formats::finite::{describe, first_non_finite, first_non_finite_bytes};
use crate::formats::{quantize_with, Encoding, Format, ScaleRule};
use anyhow::{bail, Context, Result};
use safetensors::Dtype;
use std::path::{Path, PathBuf};

/// Conversion settings. An encoding of `None` keeps the source precision (f32 stays f32, bf16
/// stays bf16, f16 becomes f32).
#[derive(Clone, Debug)]
pub struct ConvertOptions {
    pub experts: Option<Encoding>,
    pub shared: Option<Encoding>,
    pub dense: Option<Encoding>,
    pub head: Option<Encoding>,
    /// How the int4 and int3 scales are chosen (FORMATS.md, Quantisation).
    pub scales: ScaleRule,
    /// Overwrite a previous conversion in the destination.
    pub force: bool,
    /// Start a new shard once one holds this many bytes (a slab is never split).
    pub max_shard_bytes: usize,
    /// Faults to inject into the write (tests of the clean-up paths; none by default).
    pub fail: FailPlan,
    /// Draw a progress bar on stderr (only when stderr is a terminal).
    pub progress: bool,
    /// The check of the written container before it is kept ([`WriteOptions::check`]).
    pub check: Option<super::write::Check>,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            experts: Some(Encoding {
                format: Format::Int4Grouped,
                group_size: 64,
            }),
            shared: Some(Encoding::BF16),
            dense: Some(Encoding::BF16),
            head: None,
            scales: ScaleRule::default(),
            force: false,
            max_shard_bytes: 4 << 30,
            fail: FailPlan::default(),
            progress: false,
            check: None,
        }
    }
}

/// The weight-error class of a matrix job.
fn error_class(j: &Job) -> &'static str {
    if j.in_slab {
        "routed experts"
    } else if j.out.contains(".shared_experts.") {
        "shared experts"
    } else if j.out == "lm_head.weight" {
        "head"
    } else {
        "dense"
    }
}

/// Rows `base + k·step`, k < count, of a source tensor viewed as `[numel / cols, cols]`.
#[derive(Clone, Copy, Debug)]
struct RowSel {
    base: usize,
    step: usize,
    count: usize,
}

#[derive(Clone, Debug)]
enum JobKind {
    /// Copy the source bytes (f16 → f32).
    Copy,
    /// A matrix `[sel.count, cols]`; `enc: None` keeps the source precision.
    Matrix {
        sel: RowSel,
        cols: usize,
        enc: Option<Encoding>,
    },
}

#[derive(Clone, Debug)]
struct Job {
    out: String,
    src: String,
    kind: JobKind,
    /// First job of an expert: aligned to the slab alignment.
    expert_start: bool,
    in_slab: bool,
}

/// A unit that is never split across shards: one tensor, or one layer's routed experts.
struct Group {
    jobs: Vec<Job>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Class {
    Dense,
    Head,
}

fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("model.layers.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

fn dense_class(name: &str) -> Option<Class> {
    if name == "lm_head.weight" {
        return Some(Class::Head);
    }
    let l = layer_of(name)?;
    let t = name.strip_prefix(&format!("model.layers.{l}."))?;
    matches!(
        t,
        "self_attn.q_proj.weight"
            | "self_attn.k_proj.weight"
            | "self_attn.v_proj.weight"
            | "self_attn.r_proj.weight"
            | "self_attn.o_proj.weight"
            | "mlp.gate_proj.weight"
            | "mlp.up_proj.weight"
            | "mlp.down_proj.weight"
    )
    .then_some(Class::Dense)
}

fn mat(out: String, src: &str, sel: RowSel, cols: usize, enc: Option<Encoding>) -> Job {
    Job {
        out,
        src: src.to_string(),
        kind: JobKind::Matrix { sel, cols, enc },
        expert_start: false,
        in_slab: false,
    }
}

/// Per sparse layer: (gate/up source tensor, whether interleaved), down source tensor.
type SlabSources = (Option<(String, bool)>, Option<String>);

/// Build the conversion plan: groups of jobs in output order.
fn plan(src: &Container, opts: &ConvertOptions) -> Result<Vec<Group>> {
    let released = src.names().iter().any(|n| n.starts_with("model.llm."));
    // (sort key, group)
    let mut keyed: Vec<((u8, usize, u8, String), Group)> = Vec::new();
    let mut slabs: std::collections::BTreeMap<usize, SlabSources> = Default::default();
    for name in src.names() {
        if name.starts_with("model.visual.")
            || name.starts_with("model.audio.")
            || name.starts_with("model.mtp.")
        {
            continue;
        }
        let canon = if released {
            match name.strip_prefix("model.llm.").and_then(released_to_causal) {
                Some(c) => c,
                None => bail!(
                    "{}: tensor {name} is not in the released-layout name mapping",
                    src.dir.display()
                ),
            }
        } else {
            name.to_string()
        };
        let (_, t) = src.tensor(name).unwrap();
        let shape = t.shape.clone();
        let layer = layer_of(&canon);
        let section = if canon.starts_with("model.embed_tokens") {
            0
        } else if layer.is_some() {
            1
        } else {
            2
        };
        let key = |sub: u8| (section, layer.unwrap_or(0), sub, canon.clone());
        let l = layer.unwrap_or(0);
        let tail = canon
            .split_once(&format!("model.layers.{l}."))
            .map(|x| x.1)
            .unwrap_or("");
        let single = |job: Job| Group { jobs: vec![job] };
        match tail {
            "mlp.experts.gate_up_proj" | "mlp.experts.w13_weight" => {
                slabs.entry(l).or_default().0 =
                    Some((name.to_string(), tail.ends_with("w13_weight")));
            }
            "mlp.experts.down_proj" => {
                slabs.entry(l).or_default().1 = Some(name.to_string());
            }
            "mlp.shared_experts.gate_proj"
            | "mlp.shared_experts.up_proj"
            | "mlp.shared_experts.down_proj"
            | "mlp.shared_experts.w13_weight" => {
                let [s_n, r, c] = shape[..] else {
                    bail!(
                        "{}: tensor {name}: expected 3 dims, shape {shape:?}",
                        src.dir.display()
                    )
                };
                for s in 0..s_n {
                    let mut jobs = Vec::new();
                    let one = |p: Proj, base: usize, step: usize, count: usize| {
                        mat(
                            shared_expert_name(l, s, p),
                            name,
                            RowSel { base, step, count },
                            c,
                            opts.shared,
                        )
                    };
                    match tail {
                        "mlp.shared_experts.w13_weight" => {
                            jobs.push(one(Proj::Gate, s * r, 2, r / 2));
                            jobs.push(one(Proj::Up, s * r + 1, 2, r / 2));
                        }
                        "mlp.shared_experts.gate_proj" => jobs.push(one(Proj::Gate, s * r, 1, r)),
                        "mlp.shared_experts.up_proj" => jobs.push(one(Proj::Up, s * r, 1, r)),
                        _ => jobs.push(one(Proj::Down, s * r, 1, r)),
                    }
                    for j in jobs {
                        keyed.push(((section, l, 0, j.out.clone()), single(j)));
                    }
                }
            }
            "mlp.w13_dn.weight" => {
                let [r, c] = shape[..] else {
                    bail!("{}: tensor {name}: expected 2 dims", src.dir.display())
                };
                for (p, base) in [("gate", 0), ("up", 1)] {
                    let out = format!("model.layers.{l}.mlp.{p}_proj.weight");
                    let j = mat(
                        out.clone(),
                        name,
                        RowSel {
                            base,
                            step: 2,
                            count: r / 2,
                        },
                        c,
                        opts.dense,
                    );
                    keyed.push(((section, l, 0, out), single(j)));
                }
            }
            _ => {
                let job = match (dense_class(&canon), shape.as_slice()) {
                    (Some(class), &[r, c]) => {
                        let enc = if class == Class::Head {
                            opts.head
                        } else {
                            opts.dense
                        };
                        mat(
                            canon.clone(),
                            name,
                            RowSel {
                                base: 0,
                                step: 1,
                                count: r,
                            },
                            c,
                            enc,
                        )
                    }
                    _ => Job {
                        out: canon.clone(),
                        src: name.to_string(),
                        kind: JobKind::Copy,
                        expert_start: false,
                        in_slab: false,
                    },
                };
                keyed.push((key(0), single(job)));
            }
        }
    }
    for (l, (gu, down)) in slabs {
        let (Some((gu, interleaved)), Some(down)) = (gu, down) else {
            bail!(
                "{}: layer {l}: routed experts need both gate/up and down tensors",
                src.dir.display()
            );
        };
        let gshape = &src.tensor(&gu).unwrap().1.shape;
        let dshape = &src.tensor(&down).unwrap().1.shape;
        let (&[e_n, r2, h], &[e_d, dh, di]) = (gshape.as_slice(), dshape.as_slice()) else {
            bail!(
                "{}: layer {l}: expert tensors must have 3 dims ({gshape:?}, {dshape:?})",
                src.dir.display()
            );
        };
        if e_n != e_d || r2 % 2 != 0 || dh != h || di != r2 / 2 {
            bail!(
                "{}: layer {l}: expert shapes disagree: gate/up {gshape:?}, down {dshape:?}",
                src.dir.display()
            );
        }
        let i = r2 / 2;
        let mut jobs = Vec::new();
        for e in 0..e_n {
            let (g, u) = if interleaved {
                (
                    RowSel {
                        base: e * r2,
                        step: 2,
                        count: i,
                    },
                    RowSel {
                        base: e * r2 + 1,
                        step: 2,
                        count: i,
                    },
                )
            } else {
                (
                    RowSel {
                        base: e * r2,
                        step: 1,
                        count: i,
                    },
                    RowSel {
                        base: e * r2 + i,
                        step: 1,
                        count: i,
                    },
                )
            };
            let mut gj = mat(expert_name(l, e, Proj::Gate), &gu, g, h, opts.experts);
            gj.expert_start = true;
            jobs.push(gj);
            jobs.push(mat(expert_name(l, e, Proj::Up), &gu, u, h, opts.experts));
            jobs.push(mat(
                expert_name(l, e, Proj::Down),
                &down,
                RowSel {
                    base: e * h,
                    step: 1,
                    count: h,
                },
                i,
                opts.experts,
            ));
        }
        for j in &mut jobs {
            j.in_slab = true;
        }
        keyed.push(((1, l, 1, String::new()), Group { jobs }));
    }
    keyed.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(keyed.into_iter().map(|(_, g)| g).collect())
}

/// The encoding a matrix job writes, resolving "keep source precision".
fn resolve(enc: Option<Encoding>, src_dtype: Dtype) -> Encoding {
    enc.unwrap_or(if src_dtype == Dtype::BF16 {
        Encoding::BF16
    } else {
        Encoding::F32
    })
}

/// Planned output tensors of one job (weight, then scales when the encoding has them).
fn planned(job: &Job, src: &Container) -> (Vec<PlannedTensor>, Option<(Encoding, [usize; 2])>) {
    let t = src.tensor(&job.src).unwrap().1;
    let align_first = if job.expert_start {
        SLAB_ALIGN
    } else if job.in_slab {
        PART_ALIGN
    } else {
        TENSOR_ALIGN
    };
    let align_rest = if job.in_slab {
        PART_ALIGN
    } else {
        TENSOR_ALIGN
    };
    match &job.kind {
        JobKind::Copy => {
            let dtype = if t.dtype == Dtype::F16 {
                Dtype::F32
            } else {
                t.dtype
            };
            (
                vec![PlannedTensor {
                    name: job.out.clone(),
                    dtype,
                    shape: t.shape.clone(),
                    align: align_first,
                }],
                None,
            )
        }
        JobKind::Matrix { sel, cols, enc } => {
            let enc = resolve(*enc, t.dtype);
            let v = matrix_tensors(&job.out, sel.count, *cols, enc, align_first, align_rest);
            (v, Some((enc, [sel.count, *cols])))
        }
    }
}

/// The planned tensors of a matrix `[rows, cols]` written in `enc` under `name`: the plain
/// `F32`/`BF16` tensor, or the `U8` blob plus its `.qs` companion (FORMATS.md, section Container).
/// `align_first` applies to the weight, `align_rest` to the scales.
pub fn matrix_tensors(
    name: &str,
    rows: usize,
    cols: usize,
    enc: Encoding,
    align_first: usize,
    align_rest: usize,
) -> Vec<PlannedTensor> {
    let mut v = Vec::new();
    match enc.format {
        Format::F32 | Format::Bf16 => v.push(PlannedTensor {
            name: name.to_string(),
            dtype: if enc.format == Format::F32 {
                Dtype::F32
            } else {
                Dtype::BF16
            },
            shape: vec![rows, cols],
            align: align_first,
        }),
        _ => {
            v.push(PlannedTensor {
                name: name.to_string(),
                dtype: Dtype::U8,
                shape: vec![rows, enc.bytes_per_row(cols)],
                align: align_first,
            });
            let spr = enc.scales_per_row(cols);
            if spr > 0 {
                v.push(PlannedTensor {
                    name: format!("{name}{SCALES_SUFFIX}"),
                    dtype: Dtype::F32,
                    shape: vec![rows, spr],
                    align: align_rest,
                });
            }
        }
    }
    v
}

/// Read the selected rows of a source tensor as f32.
fn read_rows(bytes: &[u8], t: &TensorEntry, sel: RowSel, cols: usize) -> Result<Vec<f32>> {
    let es = t.dtype.bitsize() / 8;
    let mut out = Vec::with_capacity(sel.count * cols);
    for k in 0..sel.count {
        let r = sel.base + k * sel.step;
        let row = bytes
            .get(r * cols * es..(r + 1) * cols * es)
            .context("row out of range")?;
        out.extend(to_f32(row, t.dtype).with_context(|| {
            format!("tensor {}: dtype {:?} is not f32/bf16/f16", t.name, t.dtype)
        })?);
    }
    Ok(out)
}

/// The files beside the weights that `convert` copies from the source when present.
const SIDE_FILES: [&str; 4] = [
    "config.json",
    "tokenizer.json",
    "generation_config.json",
    "tokenizer_config.json",
];

/// The conversion's [`ItemSource`]: copies or re-encodes source tensors.
struct ConvertSource<'a> {
    src: &'a Container,
    /// The job behind each item, per group.
    jobs: Vec<Vec<&'a Job>>,
    scales: ScaleRule,
    /// Accumulated per class, in first-seen order.
    errors: Vec<WeightError>,
}

impl ItemSource for ConvertSource<'_> {
    fn produce(&mut self, group: usize, item: usize) -> Result<Vec<std::borrow::Cow<'_, [u8]>>> {
        use std::borrow::Cow;
        let j = self.jobs[group][item];
        let (shard, t) = self.src.tensor(&j.src).unwrap();
        let bytes = shard.bytes(t);
        let refuse = |i: usize, v: f32| {
            anyhow::anyhow!(
                "{}: tensor `{}`: element {i} (flat index) is {}; convert refuses a non-finite \
                 source value (the checkpoint is damaged)",
                shard.display(),
                j.src,
                describe(v)
            )
        };
        Ok(match &j.kind {
            JobKind::Copy => {
                if let Some((i, v)) = first_non_finite_bytes(bytes, t.dtype) {
                    return Err(refuse(i, v));
                }
                if t.dtype == Dtype::F16 {
                    let v = to_f32(bytes, t.dtype).unwrap();
                    vec![Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect())]
                } else {
                    vec![Cow::Borrowed(bytes)]
                }
            }
            JobKind::Matrix { sel, cols, enc } => {
                let enc = resolve(*enc, t.dtype);
                let vals = read_rows(bytes, t, *sel, *cols)
                    .with_context(|| format!("reading {}", j.src))?;
                if let Some((i, v)) = first_non_finite(&vals) {
                    // value i is column i % cols of selected row i / cols
                    let row = sel.base + (i / cols) * sel.step;
                    return Err(refuse(row * cols + i % cols, v));
                }
                let q = quantize_with(enc, &vals, sel.count, *cols, self.scales)?;
                let class = error_class(j);
                let at = match self.errors.iter().position(|e| e.class == class) {
                    Some(i) => i,
                    None => {
                        self.errors.push(WeightError {
                            class,
                            encoding: enc.spelling(),
                            matrices: 0,
                            err_sq: 0.0,
                            norm_sq: 0.0,
                        });
                        self.errors.len() - 1
                    }
                };
                let e = &mut self.errors[at];
                if e.encoding != enc.spelling() {
                    e.encoding = "mixed".into();
                }
                e.matrices += 1;
                for (&w, d) in vals.iter().zip(q.dequantize()) {
                    e.err_sq += (w as f64 - d as f64).powi(2);
                    e.norm_sq += (w as f64).powi(2);
                }
                let mut v = vec![Cow::Owned(q.data.into_owned())];
                if !q.scales.is_empty() {
                    v.push(Cow::Owned(q.scales.into_owned()));
                }
                v
            }
        })
    }
}

/// The stamped formats of a converted container with how many tensors carry each, e.g.
/// `int3-g64 ×24, bf16 ×30` (most frequent first).
fn converted_formats(c: &Container) -> String {
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for s in &c.shards {
        let Some(stamps) = s.metadata.get(STAMP_KEY) else {
            continue;
        };
        let Ok(map) = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(stamps)
        else {
            continue;
        };
        for v in map.values() {
            *counts
                .entry(v.as_str().unwrap_or("?").to_string())
                .or_default() += 1;
        }
    }
    let mut v: Vec<(String, usize)> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let list: Vec<String> = v.iter().map(|(f, n)| format!("{f} ×{n}")).collect();
    format!("stamped formats: {}", list.join(", "))
}

/// `p` made absolute with every existing prefix canonicalised (symbolic links resolved), so that a
/// destination that does not exist yet can be compared with the source.
fn resolve_path(p: &Path) -> Result<PathBuf> {
    let mut existing = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    };
    let mut rest = Vec::new();
    while !existing.exists() {
        match (
            existing.file_name().map(|n| n.to_os_string()),
            existing.parent(),
        ) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                existing = parent.to_path_buf();
            }
            _ => break,
        }
    }
    let mut out = existing.canonicalize()?;
    for name in rest.into_iter().rev() {
        out.push(name);
    }
    Ok(out)
}

/// Convert `src_dir` into a stamped container in `dst_dir`.
pub fn convert(src_dir: &Path, dst_dir: &Path, opts: &ConvertOptions) -> Result<ConvertSummary> {
    let src = Container::open(src_dir).map_err(anyhow::Error::from)?;
    if !src_dir.join("config.json").exists() {
        bail!("{}: no config.json", src_dir.display());
    }
    if src.is_converted() {
        bail!(
            "{} is already a converted container ({}); convert reads source checkpoints \
             (f32/bf16/f16 safetensors as transformers saves them): convert the original \
             checkpoint again with the --experts you want",
            src_dir.display(),
            converted_formats(&src)
        );
    }
    let (cs, cd) = (src_dir.canonicalize()?, resolve_path(dst_dir)?);
    if cd != cs && cd.starts_with(&cs) {
        bail!(
            "the destination {} lies inside the source directory {}; the source is never modified",
            dst_dir.display(),
            src_dir.display()
        );
    }
    if !src_dir.join("tokenizer.json").exists() {
        eprintln!(
            "warning: {} has no tokenizer.json; the converted model will need --prompt-ids",
            src_dir.display()
        );
    }
    std::fs::create_dir_all(dst_dir).with_context(|| format!("creating {}", dst_dir.display()))?;
    if cs == cd {
        bail!(
            "the destination {} is the source directory; the source is never modified",
            dst_dir.display()
        );
    }
    check_destination(dst_dir, opts.force, &SIDE_FILES)?;
    let plan = plan(&src, opts)?;
    let groups: Vec<OutGroup> = plan
        .iter()
        .map(|g| OutGroup {
            items: g
                .jobs
                .iter()
                .map(|j| {
                    let (tensors, stamp) = planned(j, &src);
                    OutItem { tensors, stamp }
                })
                .collect(),
        })
        .collect();
    let mut files = Vec::new();
    for f in SIDE_FILES {
        let p = src_dir.join(f);
        if p.exists() {
            let cap = if f == "tokenizer.json" {
                crate::MAX_TOKENIZER_FILE
            } else {
                crate::MAX_SIDE_FILE
            };
            let text =
                crate::read_capped(&p, cap).with_context(|| format!("reading {}", p.display()))?;
            files.push((f, text.into_bytes()));
        }
    }
    let mut source = ConvertSource {
        src: &src,
        jobs: plan.iter().map(|g| g.jobs.iter().collect()).collect(),
        scales: opts.scales,
        errors: Vec::new(),
    };
    let wopts = WriteOptions {
        force: opts.force,
        max_shard_bytes: opts.max_shard_bytes,
        fail: opts.fail,
        progress: opts.progress,
        check: opts.check,
    };
    let mut summary =
        write_container(dst_dir, &groups, &mut source, &files, &wopts).map_err(|e| {
            e.context(format!(
                "converting {} into {}",
                src_dir.display(),
                dst_dir.display()
            ))
        })?;
    summary.weight_error = source.errors;
    Ok(summary)
}
