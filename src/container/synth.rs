//! `inkling-wgpu synth`: a stamped container with random weights at the real Inkling shapes,
//! written through the same writer as `convert` ([`super::write::write_container`]), so that
//! benchmarks and the expert cache see real shapes, slabs and shards without a real checkpoint.
//!
//! Weights are drawn directly in their stored form, never quantised from f32: for `int4`/`int4-gN`
//! uniform nibbles 1..=15 (levels −7..7) and for `int3-g64` uniform levels 1..=7 (−3..3), with
//! positive scales in 0.75..1.25 × the scale that gives values a standard deviation of 0.02; `bf16`
//! and `f32` matrices are near-gaussian N(0, 0.02) (a sum of four uniforms). Norms are about 1,
//! convolutions small, router rows N(0, 1/hidden) so that its logits have unit spread and routing is
//! spread over the experts, global scales 1. Every tensor is generated in fixed chunks of rows,
//! each seeded from (seed, tensor name, chunk index), the chunks of a batch of tensors shared
//! among all cores: the bytes depend on the seed only, never on the thread count.
//!
//! Presets (`--preset`):
//! - `inkling`: the released Inkling geometry (hidden 6144; full layers 64 heads / 8 KV heads,
//!   sliding layers 64 / 16, head_dim 128; 256 routed experts of width 3072, top-6, 2 shared;
//!   vocab 201024, unpadded 200058).
//! - `inkling-small`: hidden 4096, 32 heads / 8 KV heads on every layer, head_dim 128, 256 routed
//!   experts of width 2048, top-6, 2 shared, the same vocab. **The expert width 2048, the sliding
//!   head counts and the dense width 16384 are our assumption**, not published figures.
//! - `tiny`: a few-kilobyte model for tests.
use super::convert::matrix_tensors;
pub use super::synth_values::Dist;
use super::synth_values::{dist, generate_batch, Gen, BATCH_BYTES};
use super::write::{
    shard_file_sizes, write_container, ConvertSummary, ItemSource, OutGroup, OutItem, WriteOptions,
};
use super::writer::{FailPlan, PlannedTensor};
use super::{
    expert_name, shared_expert_name, Proj, EXPERT_PROJS, PART_ALIGN, SLAB_ALIGN, TENSOR_ALIGN,
};
use crate::formats::finite::{describe, first_non_finite_bytes};
use crate::formats::{Encoding, Format};
use anyhow::{bail, Result};
use safetensors::Dtype;
use std::borrow::Cow;
use std::path::Path;

/// The bundled tokenizer written into every synthetic container (the tiny chat fixture's BPE with
/// Inkling's chat specials, so `serve` and `chat` run on a probe; ids past its vocabulary decode
/// to nothing, which is fine for benchmarks).
pub const TOKENIZER_JSON: &[u8] =
    include_bytes!("../../tests/fixtures/tiny-chat-f32/tokenizer.json");
const TOKENIZER_CONFIG_JSON: &[u8] =
    include_bytes!("../../tests/fixtures/tiny-chat-f32/tokenizer_config.json");

/// Standard deviation of the values of every projection matrix.
pub const WEIGHT_STD: f32 = 0.02;

/// The model geometry and encodings of a synthetic container.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthSpec {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub swa_heads: usize,
    pub swa_kv_heads: usize,
    pub swa_head_dim: usize,
    pub window: usize,
    pub rel_extent: usize,
    pub d_rel: usize,
    pub conv_kernel: usize,
    pub n_experts: usize,
    pub expert_width: usize,
    pub top_k: usize,
    pub n_shared: usize,
    pub vocab: usize,
    pub unpadded_vocab: usize,
    /// Width of a dense MLP.
    pub dense_width: usize,
    /// The first `dense_layers` layers have a dense MLP, the rest are sparse.
    pub dense_layers: usize,
    pub route_scale: f64,
    pub mup: f64,
    /// Routed experts.
    pub experts: Encoding,
    /// Shared experts.
    pub shared: Encoding,
    /// Attention projections and dense MLPs.
    pub dense: Encoding,
    /// `lm_head`.
    pub head: Encoding,
    pub seed: u64,
}

impl SynthSpec {
    /// A preset: `inkling`, `inkling-small` or `tiny`, with `layers` layers, all sparse, routed
    /// experts `int4-g64`, everything else bf16, seed 0.
    pub fn preset(name: &str, layers: usize) -> Result<SynthSpec> {
        let int4g64 = Encoding {
            format: Format::Int4Grouped,
            group_size: 64,
        };
        let base = SynthSpec {
            hidden: 6144,
            layers,
            heads: 64,
            kv_heads: 8,
            head_dim: 128,
            swa_heads: 64,
            swa_kv_heads: 16,
            swa_head_dim: 128,
            window: 512,
            rel_extent: 1024,
            d_rel: 16,
            conv_kernel: 4,
            n_experts: 256,
            expert_width: 3072,
            top_k: 6,
            n_shared: 2,
            vocab: 201024,
            unpadded_vocab: 200058,
            dense_width: 24576,
            dense_layers: 0,
            route_scale: 8.0,
            mup: 24.0,
            experts: int4g64,
            shared: Encoding::BF16,
            dense: Encoding::BF16,
            head: Encoding::BF16,
            seed: 0,
        };
        Ok(match name {
            "inkling" => base,
            "inkling-small" => SynthSpec {
                hidden: 4096,
                heads: 32,
                kv_heads: 8,
                swa_heads: 32,
                swa_kv_heads: 8,
                expert_width: 2048,
                dense_width: 16384,
                ..base
            },
            "tiny" => SynthSpec {
                hidden: 64,
                heads: 4,
                kv_heads: 2,
                head_dim: 16,
                swa_heads: 4,
                swa_kv_heads: 2,
                swa_head_dim: 16,
                window: 8,
                rel_extent: 16,
                d_rel: 4,
                n_experts: 8,
                expert_width: 32,
                top_k: 2,
                n_shared: 1,
                vocab: 512,
                unpadded_vocab: 500,
                dense_width: 96,
                mup: 4.0,
                ..base
            },
            other => bail!("unknown preset `{other}` (inkling, inkling-small, tiny)"),
        })
    }

    /// Set the vocabulary size (and the unpadded size to the same value when it would exceed it).
    pub fn with_vocab(mut self, vocab: usize) -> Self {
        self.vocab = vocab;
        self.unpadded_vocab = self.unpadded_vocab.min(vocab);
        self
    }

    /// Set the number of routed experts per sparse layer to `n`, keeping top-k and every shape:
    /// each decode token still reads `top_k` routed experts per sparse layer, so a container of
    /// full depth fits a small disk (the router's `[n + n_shared, hidden]` rows are the only
    /// per-token bytes that shrink). `Err` names `flag` when `n` is below top-k.
    pub fn with_routed_experts(mut self, n: usize, flag: &str) -> Result<Self> {
        if n < self.top_k {
            bail!(
                "{flag} {n}: fewer routed experts than the {} a token routes to (top-k); use at \
                 least {}",
                self.top_k,
                self.top_k
            );
        }
        if n > self.n_experts {
            bail!(
                "{flag} {n}: more routed experts than the preset's {} (the flag keeps the shapes \
                 with fewer experts); use at most {}",
                self.n_experts,
                self.n_experts
            );
        }
        self.n_experts = n;
        Ok(self)
    }

    fn sliding(&self, layer: usize) -> bool {
        !(layer + 1).is_multiple_of(6)
    }

    fn dense_layer(&self, layer: usize) -> bool {
        layer < self.dense_layers
    }

    /// (heads, kv_heads, head_dim, rel_extent) of a layer.
    fn attn(&self, layer: usize) -> (usize, usize, usize, usize) {
        if self.sliding(layer) {
            (
                self.swa_heads,
                self.swa_kv_heads,
                self.swa_head_dim,
                self.window,
            )
        } else {
            (self.heads, self.kv_heads, self.head_dim, self.rel_extent)
        }
    }

    fn validate(&self) -> Result<()> {
        if self.layers == 0 || self.hidden == 0 || self.vocab == 0 {
            bail!("layers, hidden size and vocab must be positive");
        }
        if self.dense_layers < self.layers
            && (self.n_shared == 0 || self.top_k == 0 || self.top_k > self.n_experts)
        {
            bail!("sparse layers need ≥ 1 shared expert and 1 ≤ top-k ≤ experts");
        }
        if self.kv_heads == 0
            || self.swa_kv_heads == 0
            || !self.heads.is_multiple_of(self.kv_heads)
            || !self.swa_heads.is_multiple_of(self.swa_kv_heads)
        {
            bail!("KV heads must divide heads");
        }
        Ok(())
    }

    /// `config.json`: a flat `InklingForCausalLM` config (explicit `layer_types` and
    /// `mlp_layer_types`) that `crate::model::TextConfig` parses.
    pub fn config_json(&self) -> serde_json::Value {
        let layer_types: Vec<&str> = (0..self.layers)
            .map(|i| {
                if self.sliding(i) {
                    "hybrid_sliding"
                } else {
                    "hybrid"
                }
            })
            .collect();
        let mlp_types: Vec<&str> = (0..self.layers)
            .map(|i| {
                if self.dense_layer(i) {
                    "dense"
                } else {
                    "sparse"
                }
            })
            .collect();
        serde_json::json!({
            "architectures": ["InklingForCausalLM"],
            "model_type": "inkling_text",
            "_synthetic": format!(
                "inkling-wgpu synth: random weights (seed {}), experts {}, shared {}, dense {}, head {}",
                self.seed,
                self.experts.spelling(),
                self.shared.spelling(),
                self.dense.spelling(),
                self.head.spelling()
            ),
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
            "conv_kernel_size": self.conv_kernel,
            "d_rel": self.d_rel,
            "dtype": "bfloat16",
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden,
            "intermediate_size": self.dense_width,
            "moe_intermediate_size": self.expert_width,
            "layer_types": layer_types,
            "mlp_layer_types": mlp_types,
            "logits_mup_width_multiplier": self.mup,
            "max_position_embeddings": 131072,
            "n_routed_experts": self.n_experts,
            "n_shared_experts": self.n_shared,
            "num_experts_per_tok": self.top_k,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "num_hidden_layers": self.layers,
            "rel_extent": self.rel_extent,
            "rms_norm_eps": 1e-6,
            "route_scale": self.route_scale,
            "shared_expert_sink": true,
            "sliding_window_size": self.window,
            "swa_head_dim": self.swa_head_dim,
            "swa_num_attention_heads": self.swa_heads,
            "swa_num_key_value_heads": self.swa_kv_heads,
            "transformers_version": "5.24.0",
            "unpadded_vocab_size": self.unpadded_vocab,
            "vocab_size": self.vocab,
        })
    }

    /// `generation_config.json`: greedy.
    pub fn generation_config_json(&self) -> serde_json::Value {
        serde_json::json!({
            "bos_token_id": 1,
            "eos_token_id": [2],
            "pad_token_id": 0,
            "do_sample": false,
            "transformers_version": "5.24.0",
        })
    }
}

/// The planned output of a synthetic container: groups of items in file order, and what to draw.
pub struct SynthPlan {
    pub groups: Vec<OutGroup>,
    gens: Vec<Vec<Gen>>,
    token_bytes: u64,
}

impl SynthPlan {
    /// Every planned tensor (weights and `.qs` scales; no padding).
    pub fn tensors(&self) -> impl Iterator<Item = &PlannedTensor> {
        self.groups
            .iter()
            .flat_map(|g| &g.items)
            .flat_map(|i| &i.tensors)
    }
    /// Sum of the tensor bytes (no header, no padding).
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors().map(|t| t.nbytes() as u64).sum()
    }
    /// Weight bytes one decode token reads: one embedding row, `top_k` routed experts (weights
    /// and scales) per sparse layer and every other tensor whole; KV caches and conv states are
    /// not weights and not counted.
    pub fn token_bytes(&self) -> u64 {
        self.token_bytes
    }
}

/// (sort key, group, generators) of a unit of the plan; the key orders units like `convert`.
type Keyed = ((u8, usize, u8, String), OutGroup, Vec<Gen>);

fn single(keyed: &mut Vec<Keyed>, (s, l, sub): (u8, usize, u8), item: OutItem, g: Gen) {
    keyed.push((
        (s, l, sub, g.name.clone()),
        OutGroup { items: vec![item] },
        vec![g],
    ));
}

/// Build the plan: tensor names, shapes, encodings and alignments exactly as `convert` lays out a
/// converted checkpoint (embeddings, then each layer's tensors by name followed by its expert
/// slab, then `lm_head` and the final norm).
pub fn plan(spec: &SynthSpec) -> Result<SynthPlan> {
    spec.validate()?;
    let h = spec.hidden;
    let mut keyed: Vec<Keyed> = Vec::new();
    let plain = |name: String, shape: Vec<usize>, dtype: Dtype, d: Dist| {
        let cols = *shape.last().unwrap();
        let rows = shape.iter().product::<usize>() / cols;
        let enc = if dtype == Dtype::BF16 {
            Encoding::BF16
        } else {
            Encoding::F32
        };
        let item = OutItem {
            tensors: vec![PlannedTensor {
                name: name.clone(),
                dtype,
                shape,
                align: TENSOR_ALIGN,
            }],
            stamp: None,
        };
        (
            item,
            Gen {
                name,
                rows,
                cols,
                enc,
                dist: d,
            },
        )
    };
    let matrix = |name: String, rows: usize, cols: usize, enc: Encoding, d: Dist| {
        let item = OutItem {
            tensors: matrix_tensors(&name, rows, cols, enc, TENSOR_ALIGN, TENSOR_ALIGN),
            stamp: Some((enc, [rows, cols])),
        };
        (
            item,
            Gen {
                name,
                rows,
                cols,
                enc,
                dist: d,
            },
        )
    };
    let w = dist(0.0, WEIGHT_STD);
    let norm = dist(1.0, 0.02);
    let mut push = |section: u8, layer: usize, sub: u8, (item, g): (OutItem, Gen)| {
        single(&mut keyed, (section, layer, sub), item, g)
    };
    push(
        0,
        0,
        0,
        plain(
            "model.embed_tokens.weight".into(),
            vec![spec.vocab, h],
            Dtype::BF16,
            w,
        ),
    );
    push(
        0,
        0,
        0,
        plain(
            "model.embed_tokens.embed_norm.weight".into(),
            vec![h],
            Dtype::F32,
            norm,
        ),
    );
    push(
        2,
        0,
        0,
        matrix("lm_head.weight".into(), spec.vocab, h, spec.head, w),
    );
    push(
        2,
        0,
        0,
        plain("model.norm.weight".into(), vec![h], Dtype::F32, norm),
    );
    let conv = dist(0.0, 0.05);
    let mut slabs: Vec<Keyed> = Vec::new();
    for l in 0..spec.layers {
        let (heads, kvh, hd, rel) = spec.attn(l);
        let (qd, kvd) = (heads * hd, kvh * hd);
        let n = |t: &str| format!("model.layers.{l}.{t}");
        let d = spec.dense;
        push(1, l, 0, matrix(n("self_attn.q_proj.weight"), qd, h, d, w));
        push(1, l, 0, matrix(n("self_attn.k_proj.weight"), kvd, h, d, w));
        push(1, l, 0, matrix(n("self_attn.v_proj.weight"), kvd, h, d, w));
        push(
            1,
            l,
            0,
            matrix(n("self_attn.r_proj.weight"), heads * spec.d_rel, h, d, w),
        );
        push(1, l, 0, matrix(n("self_attn.o_proj.weight"), h, qd, d, w));
        for t in ["self_attn.q_norm.weight", "self_attn.k_norm.weight"] {
            push(1, l, 0, plain(n(t), vec![hd], Dtype::F32, norm));
        }
        for t in [
            "self_attn.k_sconv.conv1d.weight",
            "self_attn.v_sconv.conv1d.weight",
        ] {
            push(
                1,
                l,
                0,
                plain(n(t), vec![kvd, 1, spec.conv_kernel], Dtype::F32, conv),
            );
        }
        push(
            1,
            l,
            0,
            plain(
                n("self_attn.rel_logits_proj.proj"),
                vec![spec.d_rel, rel],
                Dtype::F32,
                w,
            ),
        );
        for t in ["input_layernorm.weight", "post_attention_layernorm.weight"] {
            push(1, l, 0, plain(n(t), vec![h], Dtype::F32, norm));
        }
        for t in ["attn_sconv.conv1d.weight", "mlp_sconv.conv1d.weight"] {
            push(
                1,
                l,
                0,
                plain(n(t), vec![h, 1, spec.conv_kernel], Dtype::F32, conv),
            );
        }
        if spec.dense_layer(l) {
            let i = spec.dense_width;
            push(1, l, 0, matrix(n("mlp.gate_proj.weight"), i, h, d, w));
            push(1, l, 0, matrix(n("mlp.up_proj.weight"), i, h, d, w));
            push(1, l, 0, matrix(n("mlp.down_proj.weight"), h, i, d, w));
            push(
                1,
                l,
                0,
                plain(n("mlp.global_scale"), vec![1], Dtype::F32, dist(1.0, 0.0)),
            );
            continue;
        }
        let (e_n, s_n, i) = (spec.n_experts, spec.n_shared, spec.expert_width);
        push(
            1,
            l,
            0,
            plain(
                n("mlp.gate.weight"),
                vec![e_n + s_n, h],
                Dtype::BF16,
                dist(0.0, 1.0 / (h as f32).sqrt()),
            ),
        );
        push(
            1,
            l,
            0,
            plain(
                n("mlp.gate.e_score_correction_bias"),
                vec![e_n],
                Dtype::F32,
                dist(0.0, 0.01),
            ),
        );
        push(
            1,
            l,
            0,
            plain(
                n("mlp.gate.global_scale"),
                vec![1],
                Dtype::F32,
                dist(1.0, 0.0),
            ),
        );
        let shape = |p: Proj| match p {
            Proj::Down => (h, i),
            _ => (i, h),
        };
        for s in 0..s_n {
            for p in EXPERT_PROJS {
                let (r, c) = shape(p);
                push(
                    1,
                    l,
                    0,
                    matrix(shared_expert_name(l, s, p), r, c, spec.shared, w),
                );
            }
        }
        // The slab: each expert page-aligned, its parts on 256 bytes.
        let mut group = OutGroup::default();
        let mut gens = Vec::new();
        for e in 0..e_n {
            for (k, p) in EXPERT_PROJS.into_iter().enumerate() {
                let (r, c) = shape(p);
                let name = expert_name(l, e, p);
                let first = if k == 0 { SLAB_ALIGN } else { PART_ALIGN };
                group.items.push(OutItem {
                    tensors: matrix_tensors(&name, r, c, spec.experts, first, PART_ALIGN),
                    stamp: Some((spec.experts, [r, c])),
                });
                gens.push(Gen {
                    name,
                    rows: r,
                    cols: c,
                    enc: spec.experts,
                    dist: w,
                });
            }
        }
        slabs.push(((1, l, 1, String::new()), group, gens));
    }
    let group_bytes = |g: &OutGroup| -> u64 {
        g.items
            .iter()
            .flat_map(|i| &i.tensors)
            .map(|t| t.nbytes() as u64)
            .sum()
    };
    let embed_row = 2 * h as u64;
    let token_bytes = keyed
        .iter()
        .map(|(k, g, _)| match k.3.as_str() {
            "model.embed_tokens.weight" => embed_row,
            _ => group_bytes(g),
        })
        .sum::<u64>()
        + slabs
            .iter()
            .map(|(_, g, _)| group_bytes(g) / spec.n_experts as u64 * spec.top_k as u64)
            .sum::<u64>();
    keyed.extend(slabs);
    keyed.sort_by(|a, b| a.0.cmp(&b.0));
    let (groups, gens) = keyed.into_iter().map(|(_, g, v)| (g, v)).unzip();
    Ok(SynthPlan {
        groups,
        gens,
        token_bytes,
    })
}

/// One generated item: its (group, item) position, weight bytes and scale bytes.
type Generated = ((usize, usize), Vec<u8>, Vec<u8>);

/// Hands out the items that the generator thread produces in plan order, a batch of items
/// ([`BATCH_BYTES`]) ahead of the writer, so that generation overlaps writing. Refuses an item
/// holding a NaN or an Inf (weights or scales), naming the tensor and the flat index.
struct SynthSource<'p> {
    rx: std::sync::mpsc::Receiver<Vec<Generated>>,
    pending: std::collections::VecDeque<Generated>,
    groups: &'p [OutGroup],
}

impl ItemSource for SynthSource<'_> {
    fn produce(&mut self, group: usize, item: usize) -> Result<Vec<Cow<'_, [u8]>>> {
        if self.pending.is_empty() {
            if let Ok(batch) = self.rx.recv() {
                self.pending.extend(batch);
            }
        }
        let Some((at, data, scales)) = self.pending.pop_front() else {
            bail!("synth: the generator thread stopped");
        };
        if at != (group, item) {
            bail!(
                "synth: generated item {at:?}, the writer asks for {:?}",
                (group, item)
            );
        }
        let planned = &self.groups[group].items[item].tensors;
        for (bytes, t) in [&data, &scales].into_iter().zip(planned) {
            if let Some((i, v)) = first_non_finite_bytes(bytes, t.dtype) {
                bail!(
                    "synth: tensor `{}`: generated element {i} (flat index) is {}; synth refuses \
                     a non-finite value",
                    t.name,
                    describe(v)
                );
            }
        }
        let mut v = vec![Cow::Owned(data)];
        if !scales.is_empty() {
            v.push(Cow::Owned(scales));
        }
        Ok(v)
    }
}

/// Settings of [`synth`] beyond the model spec.
#[derive(Clone, Debug)]
pub struct SynthOptions {
    pub force: bool,
    pub max_shard_bytes: usize,
    /// Faults to inject into the write (tests of the clean-up paths; none by default).
    pub fail: FailPlan,
    pub progress: bool,
    /// Generator threads (0: all cores).
    pub threads: usize,
}

impl Default for SynthOptions {
    fn default() -> Self {
        SynthOptions {
            force: false,
            max_shard_bytes: 4 << 30,
            fail: FailPlan::default(),
            progress: false,
            threads: 0,
        }
    }
}

/// Exact sizes of the files [`synth`] writes for `spec` (shards with headers and padding).
pub fn file_sizes(spec: &SynthSpec, max_shard_bytes: usize) -> Result<Vec<u64>> {
    Ok(shard_file_sizes(&plan(spec)?.groups, max_shard_bytes))
}

/// Write a synthetic container for `spec` into `dst` (config.json, generation_config.json,
/// tokenizer.json, tokenizer_config.json and the shards), verified after writing.
pub fn synth(spec: &SynthSpec, dst: &Path, opts: &SynthOptions) -> Result<ConvertSummary> {
    let p = plan(spec)?;
    let threads = if opts.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        opts.threads
    };
    let files: Vec<(&str, Vec<u8>)> = vec![
        (
            "config.json",
            serde_json::to_vec_pretty(&spec.config_json())?,
        ),
        (
            "generation_config.json",
            serde_json::to_vec_pretty(&spec.generation_config_json())?,
        ),
        ("tokenizer.json", TOKENIZER_JSON.to_vec()),
        ("tokenizer_config.json", TOKENIZER_CONFIG_JSON.to_vec()),
    ];
    let wopts = WriteOptions {
        force: opts.force,
        max_shard_bytes: opts.max_shard_bytes,
        fail: opts.fail,
        progress: opts.progress,
        check: None,
    };
    let gens = &p.gens;
    let seed = spec.seed;
    std::thread::scope(|sc| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Generated>>(1);
        sc.spawn(move || {
            let all: Vec<((usize, usize), &Gen)> = gens
                .iter()
                .enumerate()
                .flat_map(|(gi, group)| group.iter().enumerate().map(move |(ii, g)| ((gi, ii), g)))
                .collect();
            let mut rest = &all[..];
            while !rest.is_empty() {
                let mut n = 0;
                let mut bytes = 0;
                while n < rest.len() && (n == 0 || bytes < BATCH_BYTES) {
                    let g = rest[n].1;
                    bytes += g.rows * g.enc.bytes_per_row(g.cols);
                    n += 1;
                }
                let (batch, tail) = rest.split_at(n);
                rest = tail;
                let refs: Vec<&Gen> = batch.iter().map(|b| b.1).collect();
                let made = generate_batch(&refs, seed, threads);
                let items = batch
                    .iter()
                    .zip(made)
                    .map(|((at, _), (data, scales))| (*at, data, scales))
                    .collect();
                if tx.send(items).is_err() {
                    return; // the writer stopped
                }
            }
        });
        let mut source = SynthSource {
            rx,
            pending: Default::default(),
            groups: &p.groups,
        };
        let r = write_container(dst, &p.groups, &mut source, &files, &wopts);
        drop(source);
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_non_finite_value_is_refused_naming_the_tensor() {
        let t = |name: &str, dtype: Dtype, n: usize| PlannedTensor {
            name: name.into(),
            dtype,
            shape: vec![n],
            align: 64,
        };
        let groups = vec![OutGroup {
            items: vec![OutItem {
                tensors: vec![t("w", Dtype::U8, 4), t("w.qs", Dtype::F32, 2)],
                stamp: None,
            }],
        }];
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Generated>>(2);
        let scales: Vec<u8> = [1.0f32, f32::INFINITY]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        tx.send(vec![((0, 0), vec![0xff; 4], scales)]).unwrap();
        let mut src = SynthSource {
            rx,
            pending: Default::default(),
            groups: &groups,
        };
        let e = src.produce(0, 0).unwrap_err().to_string();
        assert_eq!(
            e,
            "synth: tensor `w.qs`: generated element 1 (flat index) is +inf; synth refuses a \
             non-finite value"
        );
    }
}
