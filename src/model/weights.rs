//! Checkpoint loading: memory-mapped safetensors (single file or index + shards), both tensor-name
//! layouts, every linear weight as a [`QMatrix`] borrowed zero-copy from the map where possible.
//!
//! Two steps, so that the weights can borrow the maps without self-reference:
//! ```no_run
//! # use inkling_wgpu::model::{Checkpoint, Weights};
//! let ck = Checkpoint::open(std::path::Path::new("tests/fixtures/tiny-causal-f32")).unwrap();
//! let w: Weights<'_> = Weights::load(&ck).unwrap();
//! ```
//! All linear weights go through [`Checkpoint::load_linear`]. A converted container (shard
//! metadata `inkling.container` / `inkling.fmt`: U8 blobs plus `NAME.qs` f32 scales, see
//! `docs/CONTAINER.md`) is opened as a [`Container`], which verifies every stamp at open; its
//! linears are then the container's verified zero-copy views of the mapped bytes, so the CPU
//! forward decodes exactly the bytes the GPU path uploads.
use super::config::{AttnGeom, GenerationConfig, MlpKind, TextConfig};
use super::error::{ModelError, Result};
use crate::container::header::check_header;
use crate::container::names::causal_to_released;
use crate::container::reader::{check_shard_name, model_dir_problem};
use crate::container::{expert_name, shared_expert_name, Container, Proj, STAMP_KEY, VERSION_KEY};
use crate::formats::finite::{describe, first_non_finite};
use crate::formats::{Encoding, QMatrix};
use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata};
use safetensors::SafeTensors;
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One mapped safetensors file with its parsed header.
pub struct Shard {
    pub path: PathBuf,
    map: Mmap,
    header_len: usize,
    meta: Metadata,
}

impl Shard {
    fn open(path: &Path) -> Result<Shard> {
        let file = std::fs::File::open(path).map_err(|e| ModelError::Io {
            file: path.into(),
            source: e,
        })?;
        // SAFETY: the file is mapped read-only; we never hand out a mutable view. A concurrent
        // writer truncating the file is outside what any mmap-based loader can guard against.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::Io {
            file: path.into(),
            source: e,
        })?;
        check_header(&map).map_err(|msg| ModelError::Safetensors {
            file: path.into(),
            msg,
        })?;
        let (n, meta) = SafeTensors::read_metadata(&map).map_err(|e| ModelError::Safetensors {
            file: path.into(),
            msg: match cut_tensor(&map) {
                Some(t) => format!("{e} (tensor `{t}` extends past the end of the file)"),
                None => e.to_string(),
            },
        })?;
        Ok(Shard {
            path: path.to_path_buf(),
            map,
            header_len: n,
            meta,
        })
    }

    /// The mapped bytes of the whole file ([`super::page_cache`] reads and drops their pages).
    pub(crate) fn map(&self) -> &Mmap {
        &self.map
    }

    /// `__metadata__` of the file (e.g. `format: pt`, later `inkling.fmt`).
    pub fn user_metadata(&self) -> Option<&HashMap<String, String>> {
        self.meta.metadata().as_ref()
    }
}

/// For a file that fails to parse: the first tensor (by offset) whose data lies past the end,
/// read from the header directly, so a truncation error can name it.
fn cut_tensor(bytes: &[u8]) -> Option<String> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as usize;
    let header: serde_json::Value =
        serde_json::from_slice(bytes.get(8..8usize.checked_add(n)?)?).ok()?;
    let avail = bytes.len() - 8 - n;
    let mut ends: Vec<(u64, &String)> = header
        .as_object()?
        .iter()
        .filter_map(|(k, v)| Some((v.get("data_offsets")?.get(1)?.as_u64()?, k)))
        .collect();
    ends.sort();
    ends.into_iter()
        .find(|(end, _)| *end as usize > avail)
        .map(|(_, k)| k.clone())
}

/// A raw tensor in a mapped file.
#[derive(Clone, Copy)]
pub struct RawTensor<'a> {
    pub file: &'a Path,
    pub dtype: Dtype,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

/// Which tensor-name layout the checkpoint uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `InklingForCausalLM.save_pretrained`: `model.layers.N.self_attn.q_proj.weight`, …; `prefix`
    /// is `model.` (or `model.language_model.`).
    Transformers { prefix: String },
    /// Released checkpoint names: `model.llm.layers.N.attn.wq_du.weight`, interleaved w13, …
    Released,
}

/// The mapped files of a checkpoint directory, plus its configs.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub config: TextConfig,
    pub generation: Option<GenerationConfig>,
    pub shards: Vec<Shard>,
    /// tensor name → index into `shards`
    index: HashMap<String, usize>,
    /// `model.safetensors.index.json` when sharded (for error messages)
    index_file: Option<PathBuf>,
    /// The verified container, when the shards are a converted one.
    container: Option<Container>,
}

impl Checkpoint {
    /// Read config.json, generation_config.json and map the weights of `dir`
    /// ([`ModelError::NotAModelDir`] when `dir` is a file or does not exist).
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        if let Some(why) = model_dir_problem(dir) {
            return Err(ModelError::NotAModelDir {
                dir: dir.to_path_buf(),
                why,
            });
        }
        let config = TextConfig::from_dir(dir)?;
        let generation = GenerationConfig::from_dir(dir)?;
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        let mut shards = Vec::new();
        let mut index = HashMap::new();
        let mut index_file = None;
        if index_path.exists() {
            let text = crate::read_capped(&index_path, crate::MAX_SIDE_FILE).map_err(|e| {
                ModelError::Io {
                    file: index_path.clone(),
                    source: e,
                }
            })?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| ModelError::Json {
                    file: index_path.clone(),
                    source: e,
                })?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| ModelError::MissingField {
                    file: index_path.clone(),
                    field: "weight_map".into(),
                })?;
            let mut shard_of: HashMap<String, usize> = HashMap::new();
            // Deterministic order: sort by shard file name.
            let mut entries: Vec<(&String, &serde_json::Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.1.as_str().cmp(&b.1.as_str()).then(a.0.cmp(b.0)));
            for (tensor, file) in entries {
                let file = file.as_str().ok_or_else(|| ModelError::BadField {
                    file: index_path.clone(),
                    field: format!("weight_map.{tensor}"),
                    msg: "expected a file name".into(),
                })?;
                check_shard_name(file).map_err(|msg| ModelError::BadField {
                    file: index_path.clone(),
                    field: format!("weight_map.{tensor}"),
                    msg,
                })?;
                let si = match shard_of.get(file) {
                    Some(&i) => i,
                    None => {
                        let p = dir.join(file);
                        if !p.exists() {
                            return Err(ModelError::MissingShard {
                                index: index_path.clone(),
                                shard: file.into(),
                                tensor: tensor.clone(),
                                source: std::io::Error::new(
                                    std::io::ErrorKind::NotFound,
                                    format!("{} not found", p.display()),
                                ),
                            });
                        }
                        shards.push(Shard::open(&p)?);
                        shard_of.insert(file.to_string(), shards.len() - 1);
                        shards.len() - 1
                    }
                };
                index.insert(tensor.clone(), si);
            }
            index_file = Some(index_path);
        } else if single.exists() {
            let s = Shard::open(&single)?;
            for name in s.meta.tensors().keys() {
                index.insert(name.clone(), 0);
            }
            shards.push(s);
        } else {
            return Err(ModelError::NoWeights { dir: dir.into() });
        }
        // A converted container: open it through the container reader, which verifies every
        // stamp (and refuses, naming shard and tensor) before anything is trusted.
        let converted = shards.iter().any(|s| {
            s.user_metadata()
                .is_some_and(|m| m.contains_key(VERSION_KEY) || m.contains_key(STAMP_KEY))
        });
        let container = if converted {
            Some(Container::open(dir)?)
        } else {
            None
        };
        Ok(Checkpoint {
            dir: dir.into(),
            config,
            generation,
            shards,
            index,
            index_file,
            container,
        })
    }

    /// The verified container when this checkpoint is a converted one (expert slabs, stamps).
    pub fn container(&self) -> Option<&Container> {
        self.container.as_ref()
    }

    /// Whether a tensor of this name is listed.
    pub fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// File a missing tensor would be expected in (for messages).
    fn expected_file(&self) -> PathBuf {
        match (&self.index_file, self.shards.first()) {
            (Some(p), _) => p.clone(),
            (None, Some(s)) => s.path.clone(),
            (None, None) => self.dir.clone(),
        }
    }

    /// Look a tensor up by name.
    pub fn raw(&self, name: &str) -> Result<RawTensor<'_>> {
        let missing = || ModelError::MissingTensor {
            file: self.expected_file(),
            tensor: name.into(),
        };
        let &si = self.index.get(name).ok_or_else(missing)?;
        // A converted container serves every tensor from its own (verified) maps, so that all the
        // bytes the model reads come from one mapping of each file.
        if let Some(c) = &self.container {
            let (shard, t) = c.tensor(name).ok_or_else(missing)?;
            return Ok(RawTensor {
                file: &shard.path,
                dtype: t.dtype,
                shape: &t.shape,
                bytes: shard.bytes(t),
            });
        }
        let shard = &self.shards[si];
        let info = shard
            .meta
            .info(name)
            .ok_or_else(|| ModelError::MissingTensor {
                file: shard.path.clone(),
                tensor: name.into(),
            })?;
        let start = 8 + shard.header_len + info.data_offsets.0;
        let end = 8 + shard.header_len + info.data_offsets.1;
        let bytes = shard
            .map
            .get(start..end)
            .ok_or_else(|| ModelError::Safetensors {
                file: shard.path.clone(),
                msg: format!("tensor `{name}` data lies outside the file"),
            })?;
        Ok(RawTensor {
            file: &shard.path,
            dtype: info.dtype,
            shape: &info.shape,
            bytes,
        })
    }

    fn raw_shaped(&self, name: &str, expected: &[usize]) -> Result<RawTensor<'_>> {
        let t = self.raw(name)?;
        if t.shape != expected {
            return Err(ModelError::Shape {
                file: t.file.into(),
                tensor: name.into(),
                got: t.shape.to_vec(),
                expected: expected.to_vec(),
            });
        }
        Ok(t)
    }

    /// The one entry point for linear weights: the tensor `name` of shape `expected`
    /// (`[rows, cols]`, or `[E, rows, cols]` for stacked experts) as one [`QMatrix`] of
    /// `product(expected[..-1])` rows and `expected[-1]` columns.
    /// F32 and BF16 are borrowed zero-copy from the map; F16 is converted to owned F32.
    /// In a converted container every linear comes from [`Container::linear`]: the verified
    /// stamp's encoding over the mapped bytes (U8 blob and `.qs` scales), zero-copy.
    pub fn load_linear(&self, name: &str, expected: &[usize]) -> Result<QMatrix<'_>> {
        if let Some(c) = &self.container {
            let cols = *expected.last().unwrap_or(&1);
            let rows: usize = expected[..expected.len().saturating_sub(1)]
                .iter()
                .product();
            return Ok(c.linear(name, rows, cols)?);
        }
        let t = self.raw_shaped(name, expected)?;
        let cols = *expected.last().unwrap_or(&1);
        let rows: usize = expected[..expected.len().saturating_sub(1)]
            .iter()
            .product();
        let tensor_err = |msg: String| ModelError::Tensor {
            file: t.file.into(),
            tensor: name.into(),
            msg,
        };
        let (enc, data): (Encoding, Cow<'_, [u8]>) = match t.dtype {
            Dtype::F32 => (Encoding::F32, Cow::Borrowed(t.bytes)),
            Dtype::BF16 => (Encoding::BF16, Cow::Borrowed(t.bytes)),
            Dtype::F16 => (
                Encoding::F32,
                Cow::Owned(
                    t.bytes
                        .chunks_exact(2)
                        .flat_map(|b| {
                            f16::from_bits(u16::from_le_bytes([b[0], b[1]]))
                                .to_f32()
                                .to_le_bytes()
                        })
                        .collect(),
                ),
            ),
            other => {
                return Err(ModelError::Dtype {
                    file: t.file.into(),
                    tensor: name.into(),
                    dtype: format!("{other:?}"),
                })
            }
        };
        QMatrix::new(enc, rows, cols, data, Cow::Borrowed(&[]))
            .map_err(|e| tensor_err(e.to_string()))
    }

    /// A small tensor (norm weight, conv weight, bias, scale) as f32, checked against `expected`.
    pub fn load_f32(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        let t = self.raw_shaped(name, expected)?;
        let v: Vec<f32> = match t.dtype {
            Dtype::F32 => t
                .bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::BF16 => t
                .bytes
                .chunks_exact(2)
                .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                .collect(),
            Dtype::F16 => t
                .bytes
                .chunks_exact(2)
                .map(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                .collect(),
            other => {
                return Err(ModelError::Dtype {
                    file: t.file.into(),
                    tensor: name.into(),
                    dtype: format!("{other:?}"),
                })
            }
        };
        let n: usize = expected.iter().product();
        if v.len() != n {
            return Err(ModelError::Tensor {
                file: t.file.into(),
                tensor: name.into(),
                msg: format!("{} values for shape {expected:?}", v.len()),
            });
        }
        // norms, convolutions, router biases and scales are copied here anyway: check them once
        if let Some((i, x)) = first_non_finite(&v) {
            return Err(ModelError::Tensor {
                file: t.file.into(),
                tensor: name.into(),
                msg: format!(
                    "element {i} (flat index) is {}; non-finite weights are refused",
                    describe(x)
                ),
            });
        }
        Ok(v)
    }

    /// Detect the name layout from the tensors present.
    pub fn layout(&self) -> Result<Layout> {
        if self.has("model.llm.embed.weight") {
            Ok(Layout::Released)
        } else if self.has("model.embed_tokens.weight") {
            Ok(Layout::Transformers {
                prefix: "model.".into(),
            })
        } else if self.has("model.language_model.embed_tokens.weight") {
            Ok(Layout::Transformers {
                prefix: "model.language_model.".into(),
            })
        } else {
            Err(ModelError::MissingTensor {
                file: self.expected_file(),
                tensor: "model.embed_tokens.weight (or released model.llm.embed.weight)".into(),
            })
        }
    }
}

/// Rows `r0..r1` of a matrix, keeping the borrow of the map when the matrix is borrowed.
pub fn slice_rows<'a>(m: &QMatrix<'a>, r0: usize, r1: usize) -> QMatrix<'a> {
    let rb = m.row_bytes();
    let spr = m.enc.scales_per_row(m.cols);
    let cut = |c: &Cow<'a, [u8]>, a: usize, b: usize| -> Cow<'a, [u8]> {
        match c {
            Cow::Borrowed(s) => Cow::Borrowed(&s[a..b]),
            Cow::Owned(v) => Cow::Owned(v[a..b].to_vec()),
        }
    };
    QMatrix {
        enc: m.enc,
        rows: r1 - r0,
        cols: m.cols,
        data: cut(&m.data, r0 * rb, r1 * rb),
        scales: cut(&m.scales, 4 * r0 * spr, 4 * r1 * spr),
    }
}

/// A new owned matrix made of the given rows of `m` in that order (a row permutation of the
/// row bytes and scales; works for every encoding). Used to de-interleave w13.
pub fn gather_rows<'a>(m: &QMatrix<'_>, rows: impl Iterator<Item = usize>) -> QMatrix<'a> {
    let rb = m.row_bytes();
    let spr = m.enc.scales_per_row(m.cols);
    let mut data = Vec::new();
    let mut scales = Vec::new();
    let mut n = 0;
    for r in rows {
        data.extend_from_slice(&m.data[r * rb..(r + 1) * rb]);
        scales.extend_from_slice(&m.scales[4 * r * spr..4 * (r + 1) * spr]);
        n += 1;
    }
    QMatrix {
        enc: m.enc,
        rows: n,
        cols: m.cols,
        data: Cow::Owned(data),
        scales: Cow::Owned(scales),
    }
}

/// Depthwise causal short-convolution weight `[channels, 1, kernel]`, stored `[c * kernel + k]`;
/// `k = kernel-1` multiplies the current token.
#[derive(Clone, Debug)]
pub struct ConvWeight {
    pub channels: usize,
    pub kernel: usize,
    pub w: Vec<f32>,
}

/// A SwiGLU feed-forward: `down(silu(gate x) * up x)`.
#[derive(Clone, Debug)]
pub struct Ffn<'a> {
    /// [I, H]
    pub gate: QMatrix<'a>,
    /// [I, H]
    pub up: QMatrix<'a>,
    /// [H, I]
    pub down: QMatrix<'a>,
}

#[derive(Clone, Debug)]
pub struct AttnWeights<'a> {
    pub geom: AttnGeom,
    /// [H*D, hidden]
    pub q: QMatrix<'a>,
    /// [KVH*D, hidden]
    pub k: QMatrix<'a>,
    /// [KVH*D, hidden]
    pub v: QMatrix<'a>,
    /// [H*d_rel, hidden]
    pub r: QMatrix<'a>,
    /// [hidden, H*D]
    pub o: QMatrix<'a>,
    /// [D]
    pub q_norm: Vec<f32>,
    /// [D]
    pub k_norm: Vec<f32>,
    pub k_sconv: ConvWeight,
    pub v_sconv: ConvWeight,
    /// `rel_logits_proj.proj` [d_rel, rel_extent], row-major.
    pub rel_proj: Vec<f32>,
}

#[derive(Clone, Debug)]
pub struct DenseMlp<'a> {
    pub ffn: Ffn<'a>,
    pub global_scale: f32,
}

#[derive(Clone, Debug)]
pub struct MoeWeights<'a> {
    /// Router [n_routed + n_shared, hidden]: routed rows first, then shared.
    pub router: QMatrix<'a>,
    /// `e_score_correction_bias` [n_routed] (selection only).
    pub router_bias: Vec<f32>,
    /// `gate.global_scale`.
    pub router_scale: f32,
    pub top_k: usize,
    pub route_scale: f32,
    /// Routed experts, each gate/up [I, H], down [H, I].
    pub experts: Vec<Ffn<'a>>,
    pub shared: Vec<Ffn<'a>>,
}

#[derive(Clone, Debug)]
pub enum Mlp<'a> {
    Dense(DenseMlp<'a>),
    Moe(MoeWeights<'a>),
}

#[derive(Clone, Debug)]
pub struct LayerWeights<'a> {
    pub input_norm: Vec<f32>,
    pub attn: AttnWeights<'a>,
    pub attn_sconv: ConvWeight,
    pub post_attn_norm: Vec<f32>,
    pub mlp: Mlp<'a>,
    pub mlp_sconv: ConvWeight,
}

/// All weights of the text model, shared by the CPU and GPU forwards.
#[derive(Clone, Debug)]
pub struct Weights<'a> {
    pub config: TextConfig,
    pub layout: Layout,
    /// [vocab_size, hidden]
    pub embed: QMatrix<'a>,
    pub embed_norm: Vec<f32>,
    pub layers: Vec<LayerWeights<'a>>,
    pub norm: Vec<f32>,
    /// [vocab_size, hidden] (padded rows included; use the first `config.logits_width()` rows).
    pub lm_head: QMatrix<'a>,
}

/// Tensor names in the detected layout. The loader asks for every tensor by its transformers name
/// (`model.layers.N.…`, `lm_head.weight`); released names come from the one mapping in
/// [`super::names`].
struct Names {
    layout: Layout,
}

impl Names {
    /// The name of the transformers tensor `causal` in this checkpoint.
    fn get(&self, causal: &str) -> String {
        match &self.layout {
            Layout::Transformers { prefix } => match causal.strip_prefix("model.") {
                Some(rest) => format!("{prefix}{rest}"),
                None => causal.to_string(),
            },
            // A name outside the mapping has no released spelling; asking for it as is makes a
            // lookup fail with that name.
            Layout::Released => causal_to_released(causal).unwrap_or_else(|| causal.to_string()),
        }
    }
    /// The name of `model.layers.{i}.{tail}`.
    fn layer(&self, i: usize, tail: &str) -> String {
        self.get(&format!("model.layers.{i}.{tail}"))
    }
}

/// How one layer stores a group of experts (routed or shared), decided by the names present.
enum ExpertStore {
    /// Converted container: one `[I, H]` / `[H, I]` matrix per expert and projection.
    PerExpert,
    /// Stacked `[n, 2I, H]` gate/up rows interleaved (released `w13`), down `[n, H, I]`.
    StackedInterleaved { w13: String, down: String },
    /// Stacked transformers tensors (routed `gate_up_proj` [n, 2I, H] with gate rows first per
    /// expert; shared `gate_proj`, `up_proj` [n, I, H]), down `[n, H, I]`.
    Stacked,
}

impl<'a> Weights<'a> {
    /// The (encoding, columns) of every matrix a forward multiplies by (attention projections,
    /// dense, shared and routed experts, routers, the head; not the embedding, which is
    /// gathered), without repeats, in first-seen order: what the GEMV and GEMM variants a model
    /// reaches depend on (`crate::gpu::variants::for_model`).
    pub fn linear_shapes(&self) -> Vec<(Encoding, usize)> {
        let mut out: Vec<(Encoding, usize)> = Vec::new();
        let mut add = |m: &QMatrix<'_>| {
            if !out.contains(&(m.enc, m.cols)) {
                out.push((m.enc, m.cols));
            }
        };
        for l in &self.layers {
            let a = &l.attn;
            [&a.q, &a.k, &a.v, &a.r, &a.o]
                .into_iter()
                .for_each(&mut add);
            let ffns: Vec<&Ffn<'_>> = match &l.mlp {
                Mlp::Dense(d) => vec![&d.ffn],
                Mlp::Moe(m) => {
                    add(&m.router);
                    m.experts.iter().chain(&m.shared).collect()
                }
            };
            for f in ffns {
                [&f.gate, &f.up, &f.down].into_iter().for_each(&mut add);
            }
        }
        add(&self.lm_head);
        out
    }

    /// Load and shape-check every tensor the text model needs (vision/audio/MTP are ignored).
    ///
    /// The layout comes from the tensor names present: released (`model.llm.…`), transformers
    /// (`model.…` or `model.language_model.…`) with stacked experts, or a converted container
    /// (transformers names, experts one matrix each: [`crate::container::expert_name`]). In a
    /// converted container every linear is the verified, zero-copy view of the mapped bytes, and
    /// each sparse layer's expert slab is checked ([`crate::container::Container::expert_slab`]).
    pub fn load(ck: &'a Checkpoint) -> Result<Weights<'a>> {
        let cfg = ck.config.clone();
        let layout = ck.layout()?;
        let nm = Names {
            layout: layout.clone(),
        };
        let h = cfg.hidden_size;
        let kk = cfg.conv_kernel_size;
        let conv = |name: String, c: usize| -> Result<ConvWeight> {
            Ok(ConvWeight {
                channels: c,
                kernel: kk,
                w: ck.load_f32(&name, &[c, 1, kk])?,
            })
        };
        let embed = ck.load_linear(&nm.get("model.embed_tokens.weight"), &[cfg.vocab_size, h])?;
        let embed_norm = ck.load_f32(&nm.get("model.embed_tokens.embed_norm.weight"), &[h])?;
        let norm = ck.load_f32(&nm.get("model.norm.weight"), &[h])?;
        let lm_head = ck.load_linear(&nm.get("lm_head.weight"), &[cfg.vocab_size, h])?;

        if let Some(msg) = unused_layers_warning(ck, &nm) {
            eprintln!("{msg}");
        }
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let g = cfg.attn(i);
            let (qd, kvd) = (g.q_dim(), g.kv_dim());
            let an = |t: &str| nm.layer(i, &format!("self_attn.{t}"));
            let attn = AttnWeights {
                geom: g,
                q: ck.load_linear(&an("q_proj.weight"), &[qd, h])?,
                k: ck.load_linear(&an("k_proj.weight"), &[kvd, h])?,
                v: ck.load_linear(&an("v_proj.weight"), &[kvd, h])?,
                r: ck.load_linear(&an("r_proj.weight"), &[g.heads * g.d_rel, h])?,
                o: ck.load_linear(&an("o_proj.weight"), &[h, qd])?,
                q_norm: ck.load_f32(&an("q_norm.weight"), &[g.head_dim])?,
                k_norm: ck.load_f32(&an("k_norm.weight"), &[g.head_dim])?,
                k_sconv: conv(an("k_sconv.conv1d.weight"), kvd)?,
                v_sconv: conv(an("v_sconv.conv1d.weight"), kvd)?,
                rel_proj: ck.load_f32(&an("rel_logits_proj.proj"), &[g.d_rel, g.rel_extent])?,
            };
            let input_norm = ck.load_f32(&nm.layer(i, "input_layernorm.weight"), &[h])?;
            let post_attn_norm =
                ck.load_f32(&nm.layer(i, "post_attention_layernorm.weight"), &[h])?;
            let attn_sconv = conv(nm.layer(i, "attn_sconv.conv1d.weight"), h)?;
            let mlp_sconv = conv(nm.layer(i, "mlp_sconv.conv1d.weight"), h)?;
            let mlp = match cfg.mlp_layer_types[i] {
                MlpKind::Dense => {
                    let inter = cfg.intermediate_size;
                    let w13 = nm.layer(i, "mlp.w13_dn.weight");
                    let (gate, up) = if ck.has(&w13) {
                        deinterleave(&ck.load_linear(&w13, &[2 * inter, h])?, 0, inter)
                    } else {
                        (
                            ck.load_linear(&nm.layer(i, "mlp.gate_proj.weight"), &[inter, h])?,
                            ck.load_linear(&nm.layer(i, "mlp.up_proj.weight"), &[inter, h])?,
                        )
                    };
                    let down = ck.load_linear(&nm.layer(i, "mlp.down_proj.weight"), &[h, inter])?;
                    let gs = ck.load_f32(&nm.layer(i, "mlp.global_scale"), &[1])?;
                    Mlp::Dense(DenseMlp {
                        ffn: Ffn { gate, up, down },
                        global_scale: gs[0],
                    })
                }
                MlpKind::Sparse => {
                    let (e, s, inter) = (
                        cfg.n_routed_experts,
                        cfg.n_shared_experts,
                        cfg.moe_intermediate_size,
                    );
                    let router = ck.load_linear(&nm.layer(i, "mlp.gate.weight"), &[e + s, h])?;
                    let router_bias =
                        ck.load_f32(&nm.layer(i, "mlp.gate.e_score_correction_bias"), &[e])?;
                    let router_scale = ck.load_f32(&nm.layer(i, "mlp.gate.global_scale"), &[1])?[0];
                    let routed_store = if ck.has(&nm.get(&expert_name(i, 0, Proj::Gate))) {
                        ExpertStore::PerExpert
                    } else if ck.has(&nm.layer(i, "mlp.experts.w13_weight")) {
                        ExpertStore::StackedInterleaved {
                            w13: nm.layer(i, "mlp.experts.w13_weight"),
                            down: nm.layer(i, "mlp.experts.down_proj"),
                        }
                    } else {
                        ExpertStore::Stacked
                    };
                    let experts = match routed_store {
                        ExpertStore::PerExpert => {
                            if let Some(c) = ck.container() {
                                // One contiguous, page-aligned range per expert, or refuse.
                                c.expert_slab(i)?;
                            }
                            let name = |x: usize, p: Proj| nm.get(&expert_name(i, x, p));
                            per_expert(ck, e, inter, h, name)?
                        }
                        ExpertStore::StackedInterleaved { w13, down } => {
                            let w13 = ck.load_linear(&w13, &[e, 2 * inter, h])?;
                            let w2 = ck.load_linear(&down, &[e, h, inter])?;
                            stacked_interleaved(&w13, &w2, e, inter, h)
                        }
                        ExpertStore::Stacked => {
                            let gu = ck.load_linear(
                                &nm.layer(i, "mlp.experts.gate_up_proj"),
                                &[e, 2 * inter, h],
                            )?;
                            let dn = ck.load_linear(
                                &nm.layer(i, "mlp.experts.down_proj"),
                                &[e, h, inter],
                            )?;
                            (0..e)
                                .map(|x| Ffn {
                                    gate: slice_rows(&gu, x * 2 * inter, x * 2 * inter + inter),
                                    up: slice_rows(&gu, x * 2 * inter + inter, (x + 1) * 2 * inter),
                                    down: slice_rows(&dn, x * h, (x + 1) * h),
                                })
                                .collect()
                        }
                    };
                    let shared = if ck.has(&nm.get(&shared_expert_name(i, 0, Proj::Gate))) {
                        let name = |x: usize, p: Proj| nm.get(&shared_expert_name(i, x, p));
                        per_expert(ck, s, inter, h, name)?
                    } else if ck.has(&nm.layer(i, "mlp.shared_experts.w13_weight")) {
                        let w13 = ck.load_linear(
                            &nm.layer(i, "mlp.shared_experts.w13_weight"),
                            &[s, 2 * inter, h],
                        )?;
                        let w2 = ck.load_linear(
                            &nm.layer(i, "mlp.shared_experts.down_proj"),
                            &[s, h, inter],
                        )?;
                        stacked_interleaved(&w13, &w2, s, inter, h)
                    } else {
                        let gp = ck.load_linear(
                            &nm.layer(i, "mlp.shared_experts.gate_proj"),
                            &[s, inter, h],
                        )?;
                        let up = ck.load_linear(
                            &nm.layer(i, "mlp.shared_experts.up_proj"),
                            &[s, inter, h],
                        )?;
                        let dn = ck.load_linear(
                            &nm.layer(i, "mlp.shared_experts.down_proj"),
                            &[s, h, inter],
                        )?;
                        (0..s)
                            .map(|x| Ffn {
                                gate: slice_rows(&gp, x * inter, (x + 1) * inter),
                                up: slice_rows(&up, x * inter, (x + 1) * inter),
                                down: slice_rows(&dn, x * h, (x + 1) * h),
                            })
                            .collect()
                    };
                    Mlp::Moe(MoeWeights {
                        router,
                        router_bias,
                        router_scale,
                        top_k: cfg.num_experts_per_tok,
                        route_scale: cfg.route_scale as f32,
                        experts,
                        shared,
                    })
                }
            };
            layers.push(LayerWeights {
                input_norm,
                attn,
                attn_sconv,
                post_attn_norm,
                mlp,
                mlp_sconv,
            });
        }
        Ok(Weights {
            config: cfg,
            layout,
            embed,
            embed_norm,
            layers,
            norm,
            lm_head,
        })
    }
}

/// The warning for weights that hold more decoder layers than `config.json` names (their tensors
/// are never read), or `None`. Layers are counted by their `input_layernorm` weight.
fn unused_layers_warning(ck: &Checkpoint, nm: &Names) -> Option<String> {
    let n = ck.config.num_hidden_layers;
    let extra = (n..)
        .take_while(|&i| ck.has(&nm.layer(i, "input_layernorm.weight")))
        .count();
    (extra > 0).then(|| {
        format!(
            "warning: {}: num_hidden_layers is {n}, but the weights hold {} layers; the tensors of \
             layers {n}..={} are unused",
            ck.dir.join("config.json").display(),
            n + extra,
            n + extra - 1
        )
    })
}

/// `n` experts stored one matrix per expert and projection (`name(expert, proj)`): gate and up
/// `[inter, h]`, down `[h, inter]`, each borrowed as it lies in the file.
fn per_expert<'a>(
    ck: &'a Checkpoint,
    n: usize,
    inter: usize,
    h: usize,
    name: impl Fn(usize, Proj) -> String,
) -> Result<Vec<Ffn<'a>>> {
    (0..n)
        .map(|x| {
            Ok(Ffn {
                gate: ck.load_linear(&name(x, Proj::Gate), &[inter, h])?,
                up: ck.load_linear(&name(x, Proj::Up), &[inter, h])?,
                down: ck.load_linear(&name(x, Proj::Down), &[h, inter])?,
            })
        })
        .collect()
}

/// Interleaved w13 rows `base + (g0, u0, g1, u1, …)` → (gate, up), each `inter` rows.
fn deinterleave<'a>(w13: &QMatrix<'_>, base: usize, inter: usize) -> (QMatrix<'a>, QMatrix<'a>) {
    (
        gather_rows(w13, (0..inter).map(|j| base + 2 * j)),
        gather_rows(w13, (0..inter).map(|j| base + 2 * j + 1)),
    )
}

/// Released stacked experts: w13 [n, 2I, H] interleaved on dim 1, w2 [n, H, I].
fn stacked_interleaved<'a>(
    w13: &QMatrix<'a>,
    w2: &QMatrix<'a>,
    n: usize,
    inter: usize,
    h: usize,
) -> Vec<Ffn<'a>> {
    (0..n)
        .map(|x| {
            let (gate, up) = deinterleave(w13, x * 2 * inter, inter);
            Ffn {
                gate,
                up,
                down: slice_rows(w2, x * h, (x + 1) * h),
            }
        })
        .collect()
}
