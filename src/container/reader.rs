//! Reading checkpoint directories (source checkpoints and converted containers) through memory
//! maps, with every stamp verified at open time.

use super::header::check_header;
use super::stamp::{
    check_unique, parse_shape_map, parse_string_map, verify_tensor, ContainerError, TensorBytes,
    SCALES_SUFFIX, SHAPE_KEY, STAMP_KEY,
};
use super::{expert_name, Proj, EXPERT_PROJS};
use crate::formats::finite::{describe, first_non_finite_bytes};
use crate::formats::{Encoding, Format, QMatrix};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One tensor's place in a shard.
#[derive(Clone, Debug)]
pub struct TensorEntry {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Absolute byte range in the file.
    pub start: usize,
    pub end: usize,
}

impl TensorEntry {
    pub fn len(&self) -> usize {
        self.end - self.start
    }
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A memory-mapped safetensors shard.
pub struct Shard {
    pub path: PathBuf,
    pub mmap: Mmap,
    /// Tensors sorted by offset.
    pub tensors: Vec<TensorEntry>,
    pub index: HashMap<String, usize>,
    /// `__metadata__` (string → string).
    pub metadata: HashMap<String, String>,
    /// Absolute offset of the data buffer (8 + header length).
    pub data_start: usize,
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> ContainerError {
    ContainerError::Io {
        path: path.display().to_string(),
        detail: e.to_string(),
    }
}

impl Shard {
    /// Map and parse a shard; a file shorter than its header says is [`ContainerError::Truncated`].
    pub fn open(path: &Path) -> Result<Shard, ContainerError> {
        let shard = path.display().to_string();
        let file = std::fs::File::open(path).map_err(|e| io_err(path, e))?;
        // SAFETY: the file is mapped read-only; the engine never writes through it. A file changed
        // underneath by another process is outside what any mmap-based loader can defend against.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| io_err(path, e))?;
        let len = mmap.len();
        if len < 8 {
            return Err(ContainerError::Truncated {
                shard,
                detail: format!("the file has {len} bytes, fewer than the 8-byte header length"),
            });
        }
        let n = u64::from_le_bytes(mmap[..8].try_into().unwrap()) as usize;
        if n > 100_000_000 {
            return Err(ContainerError::BadFile {
                shard,
                detail: format!("header length {n} exceeds 100 MB"),
            });
        }
        if len < 8 + n {
            return Err(ContainerError::Truncated {
                shard,
                detail: format!("the header needs {} bytes, the file has {len}", 8 + n),
            });
        }
        let header: serde_json::Value =
            serde_json::from_slice(&mmap[8..8 + n]).map_err(|e| ContainerError::BadFile {
                shard: shard.clone(),
                detail: format!("header JSON: {e}"),
            })?;
        let data_end = header
            .as_object()
            .map(|o| {
                o.iter()
                    .filter(|(k, _)| *k != "__metadata__")
                    .filter_map(|(_, v)| v.get("data_offsets")?.get(1)?.as_u64())
                    .max()
                    .unwrap_or(0) as usize
            })
            .unwrap_or(0);
        let data_last = (8 + n as u64).saturating_add(data_end as u64);
        if data_last > len as u64 {
            return Err(ContainerError::Truncated {
                shard,
                detail: format!("tensor data ends at byte {data_last}, the file has {len} bytes"),
            });
        }
        check_header(&mmap).map_err(|detail| ContainerError::BadFile {
            shard: shard.clone(),
            detail,
        })?;
        let (_, meta) = SafeTensors::read_metadata(&mmap).map_err(|e| ContainerError::BadFile {
            shard: shard.clone(),
            detail: format!("{e:?}"),
        })?;
        let data_start = 8 + n;
        let mut tensors: Vec<TensorEntry> = meta
            .tensors()
            .into_iter()
            .map(|(name, info)| TensorEntry {
                name,
                dtype: info.dtype,
                shape: info.shape.clone(),
                start: data_start + info.data_offsets.0,
                end: data_start + info.data_offsets.1,
            })
            .collect();
        tensors.sort_by_key(|t| (t.start, t.end));
        let index = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        let metadata = meta.metadata().clone().unwrap_or_default();
        Ok(Shard {
            path: path.to_path_buf(),
            mmap,
            tensors,
            index,
            metadata,
            data_start,
        })
    }

    pub fn get(&self, name: &str) -> Option<&TensorEntry> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }
    pub fn bytes(&self, t: &TensorEntry) -> &[u8] {
        &self.mmap[t.start..t.end]
    }
    pub fn display(&self) -> String {
        self.path.display().to_string()
    }
}

/// Where a verified linear lives.
#[derive(Clone, Debug)]
struct Verified {
    enc: Encoding,
    rows: usize,
    cols: usize,
}

/// One routed expert's piece inside a slab: `proj` weight bytes or (`scales`) its `.qs` values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlabPart {
    pub proj: Proj,
    pub scales: bool,
    /// Offset from the expert's first byte.
    pub offset: usize,
    pub len: usize,
}

/// The routed experts of one sparse layer: `n_experts` contiguous ranges of `expert_len` bytes,
/// `stride` apart, starting at absolute file offset `offset` of shard `shard`.
#[derive(Clone, Debug)]
pub struct ExpertSlab {
    pub layer: usize,
    pub shard: usize,
    pub offset: usize,
    pub stride: usize,
    pub n_experts: usize,
    pub expert_len: usize,
    /// The same for every expert of the slab.
    pub parts: Vec<SlabPart>,
}

/// A checkpoint directory: `model.safetensors` or shards listed by `model.safetensors.index.json`.
pub struct Container {
    pub dir: PathBuf,
    pub shards: Vec<Shard>,
    map: HashMap<String, (usize, usize)>,
    verified: HashMap<String, Verified>,
}

/// Why `name`, a shard named by `model.safetensors.index.json`, is not a plain file name in the
/// model directory (a path separator, `.`, `..`, empty, absolute or a drive prefix), or `Ok`.
/// Symbolic links are not looked at: a plain name that is a link (the Hugging Face cache links
/// shards into a blob store) is fine.
pub fn check_shard_name(name: &str) -> Result<(), String> {
    let mut parts = Path::new(name).components();
    let plain = !name.contains(['/', '\\', '\0'])
        && matches!(parts.next(), Some(std::path::Component::Normal(n)) if n == name)
        && parts.next().is_none();
    if plain {
        Ok(())
    } else {
        Err(format!(
            "shard name {name:?} is not a plain file name in the model directory (no path \
             separators, no `.` or `..`, not absolute)"
        ))
    }
}

/// What is wrong with `dir` as a model directory (`--model`): `None` for a directory, else the
/// words that follow its path in the error (a file, or nothing at that path). The one check of
/// every command that opens a model.
pub fn model_dir_problem(dir: &Path) -> Option<&'static str> {
    match (dir.is_dir(), dir.exists()) {
        (true, _) => None,
        (false, true) => Some(
            "not a directory (a model is a checkpoint or container directory, holding config.json)",
        ),
        (false, false) => Some(
            "no such model directory (a checkpoint or container directory, holding config.json)",
        ),
    }
}

/// Shard files of a checkpoint directory, in index order (or `model.safetensors`); an error
/// naming `dir` when it is not a directory ([`model_dir_problem`]).
pub fn shard_files(dir: &Path) -> Result<Vec<PathBuf>, ContainerError> {
    if let Some(why) = model_dir_problem(dir) {
        return Err(io_err(dir, why));
    }
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text =
            crate::read_capped(&index, crate::MAX_SIDE_FILE).map_err(|e| io_err(&index, e))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| io_err(&index, e))?;
        let wm = v
            .get("weight_map")
            .and_then(|w| w.as_object())
            .ok_or_else(|| io_err(&index, "no weight_map object"))?;
        let mut files: Vec<String> = Vec::new();
        for (tensor, f) in wm {
            let Some(f) = f.as_str() else { continue };
            check_shard_name(f)
                .map_err(|why| io_err(&index, format!("field `weight_map.{tensor}`: {why}")))?;
            files.push(f.to_string());
        }
        files.sort();
        files.dedup();
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    Err(io_err(
        dir,
        "no model.safetensors and no model.safetensors.index.json",
    ))
}

impl Container {
    /// Map every shard and verify every stamp (and every `inkling.shape` entry). Nothing is
    /// trusted that has not been checked against the byte arithmetic.
    pub fn open(dir: &Path) -> Result<Container, ContainerError> {
        let files = shard_files(dir)?;
        let mut shards = Vec::with_capacity(files.len());
        for f in &files {
            shards.push(Shard::open(f)?);
        }
        let mut map = HashMap::new();
        for (si, s) in shards.iter().enumerate() {
            for (ti, t) in s.tensors.iter().enumerate() {
                map.insert(t.name.clone(), (si, ti));
            }
        }
        // Every tensor the index promises must be in its shard.
        let index = dir.join("model.safetensors.index.json");
        if index.exists() {
            let v: serde_json::Value = serde_json::from_str(
                &crate::read_capped(&index, crate::MAX_SIDE_FILE).map_err(|e| io_err(&index, e))?,
            )
            .map_err(|e| io_err(&index, e))?;
            if let Some(wm) = v.get("weight_map").and_then(|w| w.as_object()) {
                for (name, file) in wm {
                    let file = file.as_str().unwrap_or_default();
                    let si = files
                        .iter()
                        .position(|p| p.file_name().and_then(|n| n.to_str()) == Some(file));
                    if si.is_none_or(|si| shards[si].get(name).is_none()) {
                        return Err(ContainerError::MissingTensor {
                            dir: dir.join(file).display().to_string(),
                            tensor: name.clone(),
                        });
                    }
                }
            }
        }
        let mut verified = HashMap::new();
        for s in &shards {
            verify_shard(s, &mut verified)?;
        }
        Ok(Container {
            dir: dir.to_path_buf(),
            shards,
            map,
            verified,
        })
    }

    /// Whether any shard carries a stamp map (a converted container).
    pub fn is_converted(&self) -> bool {
        self.shards
            .iter()
            .any(|s| s.metadata.contains_key(STAMP_KEY))
    }

    /// The tensor called `name` and its shard.
    pub fn tensor(&self, name: &str) -> Option<(&Shard, &TensorEntry)> {
        self.map
            .get(name)
            .map(|&(si, ti)| (&self.shards[si], &self.shards[si].tensors[ti]))
    }

    /// Tensor names in file order (shard by shard), without padding tensors.
    pub fn names(&self) -> Vec<&str> {
        self.shards
            .iter()
            .flat_map(|s| s.tensors.iter().map(|t| t.name.as_str()))
            .filter(|n| !super::is_pad(n))
            .collect()
    }

    /// The verified encoding of a stamped tensor.
    pub fn stamped(&self, name: &str) -> Option<(Encoding, usize, usize)> {
        self.verified.get(name).map(|v| (v.enc, v.rows, v.cols))
    }

    /// A linear weight `[rows, cols]` as a [`QMatrix`] borrowing the mapped bytes (zero-copy).
    /// Stamped tensors use their verified stamp; unstamped ones are inferred from the byte
    /// arithmetic and refused when it allows more than one format.
    pub fn linear(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<QMatrix<'_>, ContainerError> {
        let (shard, t) = self.require(name)?;
        let bad = |detail: String| ContainerError::BadTensor {
            shard: shard.display(),
            tensor: name.to_string(),
            detail,
        };
        let enc = match self.verified.get(name) {
            Some(v) => {
                if (v.rows, v.cols) != (rows, cols) {
                    return Err(bad(format!(
                        "holds a [{}, {}] matrix, the model expects [{rows}, {cols}]",
                        v.rows, v.cols
                    )));
                }
                v.enc
            }
            None => {
                if t.dtype != Dtype::U8 && t.shape != [rows, cols] {
                    return Err(bad(format!(
                        "shape {:?}, the model expects [{rows}, {cols}]",
                        t.shape
                    )));
                }
                let tb = tensor_bytes(shard, t, Some([rows, cols]))?;
                verify_tensor(&shard.display(), name, None, &tb)?
            }
        };
        let data = Cow::Borrowed(shard.bytes(t));
        let scales: Cow<'_, [u8]> = match self.tensor(&format!("{name}{SCALES_SUFFIX}")) {
            Some((ss, st)) if enc.scale_count(rows, cols) > 0 => Cow::Borrowed(ss.bytes(st)),
            _ => Cow::Borrowed(&[]),
        };
        QMatrix::new(enc, rows, cols, data, scales).map_err(|e| bad(e.to_string()))
    }

    /// The slab of routed experts of sparse layer `layer` in a converted container (`None` when the
    /// layer has no per-expert tensors). Checks that each expert is one contiguous range holding
    /// only its own tensors (and padding), all experts equally long and `stride` apart.
    pub fn expert_slab(&self, layer: usize) -> Result<Option<ExpertSlab>, ContainerError> {
        let mut experts = Vec::new();
        let mut shard_idx = None;
        for e in 0.. {
            let mut parts = Vec::new();
            for proj in EXPERT_PROJS {
                let n = expert_name(layer, e, proj);
                for (scales, name) in [(false, n.clone()), (true, format!("{n}{SCALES_SUFFIX}"))] {
                    if let Some(&(si, ti)) = self.map.get(&name) {
                        parts.push((proj, scales, si, self.shards[si].tensors[ti].clone()));
                    }
                }
            }
            if parts.is_empty() {
                break;
            }
            experts.push(parts);
        }
        if experts.is_empty() {
            return Ok(None);
        }
        let err = |si: usize, detail: String| ContainerError::BadTensor {
            shard: self.shards[si].display(),
            tensor: format!("model.layers.{layer}.mlp.experts.*"),
            detail,
        };
        let mut slab: Option<ExpertSlab> = None;
        for (e, parts) in experts.iter().enumerate() {
            let si = parts[0].2;
            if parts.iter().any(|p| p.2 != si) || shard_idx.is_some_and(|s| s != si) {
                return Err(err(
                    si,
                    "routed experts of one layer are split across shards".into(),
                ));
            }
            shard_idx = Some(si);
            let start = parts.iter().map(|p| p.3.start).min().unwrap();
            let end = parts.iter().map(|p| p.3.end).max().unwrap();
            // Only this expert's tensors and padding may lie inside [start, end).
            let shard = &self.shards[si];
            let inside: usize = shard
                .tensors
                .iter()
                .filter(|t| t.start >= start && t.end <= end)
                .count();
            let pads = shard
                .tensors
                .iter()
                .filter(|t| t.start >= start && t.end <= end && super::is_pad(&t.name))
                .count();
            if inside != parts.len() + pads {
                return Err(err(
                    si,
                    format!("expert {e} is not one contiguous range of its own tensors"),
                ));
            }
            let mut sp: Vec<SlabPart> = parts
                .iter()
                .map(|p| SlabPart {
                    proj: p.0,
                    scales: p.1,
                    offset: p.3.start - start,
                    len: p.3.len(),
                })
                .collect();
            sp.sort_by_key(|p| p.offset);
            match &mut slab {
                None => {
                    slab = Some(ExpertSlab {
                        layer,
                        shard: si,
                        offset: start,
                        stride: 0,
                        n_experts: 1,
                        expert_len: end - start,
                        parts: sp,
                    })
                }
                Some(s) => {
                    let stride = start.saturating_sub(s.offset + (e - 1) * s.stride);
                    if e == 1 {
                        s.stride = stride;
                    }
                    if stride != s.stride
                        || stride < s.expert_len
                        || end - start != s.expert_len
                        || sp != s.parts
                    {
                        return Err(err(
                            si,
                            format!("expert {e} breaks the slab's regular layout"),
                        ));
                    }
                    s.n_experts += 1;
                }
            }
        }
        Ok(slab)
    }

    /// One routed expert's bytes, a single contiguous slice of the mapped file.
    pub fn expert_bytes(&self, slab: &ExpertSlab, expert: usize) -> &[u8] {
        let o = slab.offset + expert * slab.stride;
        &self.shards[slab.shard].mmap[o..o + slab.expert_len]
    }

    /// [`Container::tensor`], or the error that names the container and the missing tensor.
    fn require(&self, name: &str) -> Result<(&Shard, &TensorEntry), ContainerError> {
        self.tensor(name)
            .ok_or_else(|| ContainerError::MissingTensor {
                dir: self.dir.display().to_string(),
                tensor: name.to_string(),
            })
    }

    /// A non-linear tensor (norm, convolution, bias, scale, embedding) as f32 values.
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>, ContainerError> {
        let (shard, t) = self.require(name)?;
        to_f32(shard.bytes(t), t.dtype).ok_or_else(|| ContainerError::BadTensor {
            shard: shard.display(),
            tensor: name.into(),
            detail: format!("dtype {:?} cannot be read as f32", t.dtype),
        })
    }
}

/// Decode F32/BF16/F16 little-endian bytes to f32 (unaligned-safe).
pub fn to_f32(b: &[u8], dtype: Dtype) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::BF16 => b
            .chunks_exact(2)
            .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        Dtype::F16 => b
            .chunks_exact(2)
            .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        _ => return None,
    })
}

/// The byte facts of a tensor for the stamp check. `logical` overrides the stored shape (U8 blobs).
fn tensor_bytes(
    shard: &Shard,
    t: &TensorEntry,
    logical: Option<[usize; 2]>,
) -> Result<TensorBytes, ContainerError> {
    let bad = |detail: String| ContainerError::BadTensor {
        shard: shard.display(),
        tensor: t.name.clone(),
        detail,
    };
    let [rows, cols] = match logical {
        Some(s) => s,
        None => match (t.dtype, t.shape.as_slice()) {
            (Dtype::U8, _) => {
                return Err(bad(format!(
                    "a U8 blob needs a [rows, cols] entry in {SHAPE_KEY}"
                )));
            }
            (_, &[r, c]) => [r, c],
            (_, s) => {
                return Err(bad(format!(
                    "a stamped tensor must be a matrix, shape is {s:?}"
                )))
            }
        },
    };
    let dtype_format = match t.dtype {
        Dtype::U8 => None,
        Dtype::F32 => Some(Format::F32),
        Dtype::BF16 => Some(Format::Bf16),
        d => {
            return Err(bad(format!(
                "dtype {d:?} is neither a U8 blob nor f32/bf16"
            )))
        }
    };
    let qs = format!("{}{SCALES_SUFFIX}", t.name);
    let scale_count = match shard.get(&qs) {
        None => 0,
        Some(q) if q.dtype == Dtype::F32 => {
            // a non-finite scale turns its whole group into NaN or Inf at run time
            if let Some((i, v)) = first_non_finite_bytes(shard.bytes(q), Dtype::F32) {
                return Err(bad(format!(
                    "scale {i} of {qs} is {} (scales must be finite; the container is damaged)",
                    describe(v)
                )));
            }
            q.numel()
        }
        Some(q) => return Err(bad(format!("its scales {qs} are {:?}, not F32", q.dtype))),
    };
    Ok(TensorBytes {
        rows,
        cols,
        data_len: t.len(),
        scale_count,
        dtype_format,
    })
}

fn verify_shard(s: &Shard, verified: &mut HashMap<String, Verified>) -> Result<(), ContainerError> {
    let shard = s.display();
    let mut shapes: HashMap<String, [usize; 2]> = HashMap::new();
    if let Some(js) = s.metadata.get(SHAPE_KEY) {
        let pairs = parse_shape_map(js).map_err(|detail| ContainerError::MalformedMap {
            shard: shard.clone(),
            key: SHAPE_KEY,
            detail,
        })?;
        check_unique(&shard, SHAPE_KEY, &pairs)?;
        for (name, shape) in pairs {
            if s.get(&name).is_none() {
                return Err(ContainerError::ClaimForMissingTensor {
                    shard,
                    key: SHAPE_KEY,
                    tensor: name,
                });
            }
            shapes.insert(name, shape);
        }
    }
    let Some(js) = s.metadata.get(STAMP_KEY) else {
        return Ok(());
    };
    let pairs = parse_string_map(js).map_err(|detail| ContainerError::MalformedMap {
        shard: shard.clone(),
        key: STAMP_KEY,
        detail,
    })?;
    check_unique(&shard, STAMP_KEY, &pairs)?;
    for (name, stamp) in &pairs {
        let Some(t) = s.get(name) else {
            return Err(ContainerError::ClaimForMissingTensor {
                shard,
                key: STAMP_KEY,
                tensor: name.clone(),
            });
        };
        let tb = tensor_bytes(s, t, shapes.get(name).copied())?;
        let enc = verify_tensor(&shard, name, Some(stamp), &tb)?;
        verified.insert(
            name.clone(),
            Verified {
                enc,
                rows: tb.rows,
                cols: tb.cols,
            },
        );
    }
    Ok(())
}
