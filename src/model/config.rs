//! `config.json` (flat `InklingForCausalLM` or multimodal with `text_config`) and
//! `generation_config.json`, parsed like transformers 5.24.0 `InklingTextConfig`.
//!
//! Required fields (an error naming config.json and the field when absent): `vocab_size`,
//! `hidden_size`, `num_hidden_layers`, `num_attention_heads`, `num_key_value_heads`, `head_dim`,
//! `intermediate_size`. Every other field falls back to the transformers default; the tensor shape
//! checks of the loader then catch a default that does not fit the checkpoint.
use super::error::{ModelError, Result};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// Attention type of a layer (`layer_types`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnKind {
    /// `"hybrid"`: full causal attention, rel_extent bias, τ scaling when enabled.
    Full,
    /// `"hybrid_sliding"`: sliding window of `sliding_window_size` keys (counting the query itself).
    Sliding,
}

/// MLP type of a layer (`mlp_layer_types`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlpKind {
    Dense,
    Sparse,
}

/// Per-layer attention geometry, resolved from the config.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnGeom {
    pub kind: AttnKind,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// `Some(W)` on sliding layers: query i sees keys i-W < j <= i.
    pub window: Option<usize>,
    /// Relative-bias extent: W on sliding layers, `rel_extent` on full layers.
    pub rel_extent: usize,
    pub d_rel: usize,
    /// τ log scaling `(n_floor, alpha)`, only on full layers and when `log_scaling_n_floor` is set.
    pub log_scaling: Option<(f64, f64)>,
}

impl AttnGeom {
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }
    /// τ(i) for 0-based absolute query position i (1 when scaling is off).
    pub fn tau(&self, pos: usize) -> f32 {
        match self.log_scaling {
            None => 1.0,
            Some((floor, alpha)) => {
                let n = (pos as f32 + 1.0) / floor as f32;
                1.0 + alpha as f32 * n.max(1.0).ln()
            }
        }
    }
}

/// Largest width accepted in config.json (hidden, head and MLP widths): 2^20.
pub const MAX_WIDTH: usize = 1 << 20;
/// Largest count accepted in config.json (layers, heads, experts, top-k, d_rel, conv kernel): 2^16.
pub const MAX_COUNT: usize = 1 << 16;
/// Largest length accepted in config.json (vocabulary, window, relative extent): 2^31 − 1.
pub const MAX_LENGTH: usize = (1 << 31) - 1;

/// The text model's settings (`InklingTextConfig`).
#[derive(Clone, Debug, PartialEq)]
pub struct TextConfig {
    pub vocab_size: usize,
    pub unpadded_vocab_size: Option<usize>,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub swa_num_attention_heads: usize,
    pub swa_num_key_value_heads: usize,
    pub swa_head_dim: usize,
    pub sliding_window_size: usize,
    pub d_rel: usize,
    pub rel_extent: usize,
    pub log_scaling_n_floor: Option<f64>,
    pub log_scaling_alpha: f64,
    pub layer_types: Vec<AttnKind>,
    pub mlp_layer_types: Vec<MlpKind>,
    pub rms_norm_eps: f64,
    pub conv_kernel_size: usize,
    /// Dense MLP width.
    pub intermediate_size: usize,
    /// Width of each routed/shared expert.
    pub moe_intermediate_size: usize,
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    pub n_shared_experts: usize,
    pub route_scale: f64,
    pub logits_mup_width_multiplier: f64,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
    /// The context length in positions (`max_position_embeddings`, alias `model_max_length`), when
    /// the file gives one: prompt plus generated tokens never exceed it.
    pub max_position_embeddings: Option<usize>,
    /// True when the file nested the text settings under `text_config` (multimodal checkpoint).
    pub multimodal: bool,
}

struct Fields<'a> {
    map: &'a Map<String, Value>,
    file: &'a Path,
}

impl<'a> Fields<'a> {
    /// Value of `name` or of one of its aliases (transformers `attribute_map`).
    fn get(&self, name: &str) -> Option<&'a Value> {
        let aliases: &[&str] = match name {
            "conv_kernel_size" => &["sconv_kernel_size"],
            "max_position_embeddings" => &["model_max_length"],
            "sliding_window_size" => &["sliding_window"],
            "n_routed_experts" => &["num_local_experts"],
            "logits_mup_width_multiplier" => &["embedding_multiplier"],
            _ => &[],
        };
        std::iter::once(name)
            .chain(aliases.iter().copied())
            .filter_map(|n| self.map.get(n))
            .find(|v| !v.is_null())
    }
    fn bad(&self, field: &str, msg: impl Into<String>) -> ModelError {
        ModelError::BadField {
            file: self.file.to_path_buf(),
            field: field.into(),
            msg: msg.into(),
        }
    }
    fn usize_opt(&self, name: &str) -> Result<Option<usize>> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| self.bad(name, format!("{}, got {v}", integer_expected(v)))),
        }
    }
    /// A token id (bos, pad): a non-negative integer that fits in 32 bits.
    fn id_opt(&self, name: &str) -> Result<Option<u32>> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => parse_id(v).map(Some).map_err(|m| self.bad(name, m)),
        }
    }
    fn usize_req(&self, name: &str) -> Result<usize> {
        self.usize_opt(name)?
            .ok_or_else(|| ModelError::MissingField {
                file: self.file.to_path_buf(),
                field: name.into(),
            })
    }
    fn usize_or(&self, name: &str, default: usize) -> Result<usize> {
        Ok(self.usize_opt(name)?.unwrap_or(default))
    }
    fn f64_opt(&self, name: &str) -> Result<Option<f64>> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.abs() <= f32::MAX as f64)
                .map(Some)
                .ok_or_else(|| {
                    self.bad(
                        name,
                        format!("expected a number within the f32 range, got {v}"),
                    )
                }),
        }
    }
    fn f64_or(&self, name: &str, default: f64) -> Result<f64> {
        Ok(self.f64_opt(name)?.unwrap_or(default))
    }
    fn ids(&self, name: &str) -> Result<Vec<u32>> {
        parse_ids(self.get(name)).map_err(|m| self.bad(name, m))
    }
    fn str_list(&self, name: &str) -> Result<Option<Vec<String>>> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| self.bad(name, "expected a list of strings"))
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(v) => Err(self.bad(name, format!("expected a list, got {v}"))),
        }
    }
}

/// A token id: a non-negative integer that fits in 32 bits (never wrapped).
fn parse_id(v: &Value) -> std::result::Result<u32, String> {
    match v.as_u64() {
        Some(x) => u32::try_from(x).map_err(|_| {
            format!("token id {x} is out of range (token ids are below 2^32 = 4294967296)")
        }),
        None => Err(format!(
            "bad token id {v} (expected a non-negative integer)"
        )),
    }
}

/// An id or list of ids (`eos_token_id: 2` or `[2, 221]`); null/absent → empty.
fn parse_ids(v: Option<&Value>) -> std::result::Result<Vec<u32>, String> {
    match v {
        None | Some(Value::Null) => Ok(vec![]),
        Some(n @ Value::Number(_)) => Ok(vec![parse_id(n)?]),
        Some(Value::Array(a)) => a.iter().map(parse_id).collect(),
        Some(v) => Err(format!("expected an id or a list of ids, got {v}")),
    }
}

/// Split EOS ids into those the model can generate (below `logits_width`) and those it never can.
/// transformers compares each generated id with every EOS id, so an id past the logits is never
/// matched: it is ignored (the caller warns), not an error.
pub fn reachable_eos(ids: &[u32], logits_width: usize) -> (Vec<u32>, Vec<u32>) {
    ids.iter().partition(|&&id| (id as usize) < logits_width)
}

/// What an integer field of config.json expects, given the value `v` it refused: a whole number
/// in float form (`64.0`, `1e3`) is named as such, since transformers' layers refuse it too.
fn integer_expected(v: &Value) -> &'static str {
    if v.as_f64().is_some_and(|f| f.fract() == 0.0 && f >= 0.0) {
        "expected an integer written without a decimal point or exponent (transformers' layers \
         refuse a float size)"
    } else {
        "expected a non-negative integer"
    }
}

/// The JSON object in `file` (errors name the file: unreadable, not JSON, not an object).
fn read_json(file: &Path) -> Result<Value> {
    let text = crate::read_capped(file, crate::MAX_SIDE_FILE).map_err(|e| ModelError::Io {
        file: file.to_path_buf(),
        source: e,
    })?;
    let v: Value = serde_json::from_str(&text).map_err(|e| ModelError::Json {
        file: file.to_path_buf(),
        source: e,
    })?;
    if !v.is_object() {
        let mut got = v.to_string();
        if got.len() > 40 {
            got = format!("{}…", &got[..got.floor_char_boundary(40)]);
        }
        return Err(ModelError::NotAnObject {
            file: file.to_path_buf(),
            got,
        });
    }
    Ok(v)
}

impl TextConfig {
    /// Read `DIR/config.json`.
    pub fn from_dir(dir: &Path) -> Result<TextConfig> {
        let file = dir.join("config.json");
        let v = read_json(&file)?;
        TextConfig::from_value(&v, &file)
    }

    /// Parse a config.json value; `file` is used in error messages.
    pub fn from_value(v: &Value, file: &Path) -> Result<TextConfig> {
        let top = v.as_object().ok_or_else(|| ModelError::BadField {
            file: file.into(),
            field: "(root)".into(),
            msg: "not an object".into(),
        })?;
        let (map, multimodal) = match top.get("text_config") {
            Some(Value::Object(m)) => (m, true),
            Some(Value::Null) | None => (top, false),
            Some(_) => {
                return Err(ModelError::BadField {
                    file: file.into(),
                    field: "text_config".into(),
                    msg: "not an object".into(),
                })
            }
        };
        let f = Fields { map, file };
        let n_layers = f.usize_req("num_hidden_layers")?;
        if n_layers > MAX_COUNT {
            return Err(f.bad(
                "num_hidden_layers",
                format!("{n_layers} is past the engine's limit of {MAX_COUNT}"),
            ));
        }
        let mut intermediate_size = f.usize_req("intermediate_size")?;
        let mut moe_intermediate_size = f.usize_or("moe_intermediate_size", 3072)?;
        if let Some(dense) = f.usize_opt("dense_intermediate_size")? {
            moe_intermediate_size = intermediate_size;
            intermediate_size = dense;
        }
        let layer_types = match f.str_list("layer_types")? {
            Some(list) => list
                .iter()
                .map(|s| match s.as_str() {
                    "hybrid" => Ok(AttnKind::Full),
                    "hybrid_sliding" => Ok(AttnKind::Sliding),
                    other => Err(f.bad("layer_types", format!("unknown layer type `{other}`"))),
                })
                .collect::<Result<Vec<_>>>()?,
            None => {
                let local: Option<Vec<usize>> = match f.get("local_layer_ids") {
                    None => None,
                    Some(Value::Array(a)) => Some(
                        a.iter()
                            .map(|x| {
                                x.as_u64()
                                    .and_then(|x| usize::try_from(x).ok())
                                    .ok_or_else(|| f.bad("local_layer_ids", "bad id"))
                            })
                            .collect::<Result<Vec<_>>>()?,
                    ),
                    Some(_) => return Err(f.bad("local_layer_ids", "expected a list")),
                };
                (0..n_layers)
                    .map(|i| {
                        let sliding = match &local {
                            Some(ids) => ids.contains(&i),
                            None => (i + 1) % 6 != 0,
                        };
                        if sliding {
                            AttnKind::Sliding
                        } else {
                            AttnKind::Full
                        }
                    })
                    .collect()
            }
        };
        let mlp_layer_types = match f.str_list("mlp_layer_types")? {
            Some(list) => list
                .iter()
                .map(|s| match s.as_str() {
                    "dense" => Ok(MlpKind::Dense),
                    "sparse" => Ok(MlpKind::Sparse),
                    other => Err(f.bad("mlp_layer_types", format!("unknown MLP type `{other}`"))),
                })
                .collect::<Result<Vec<_>>>()?,
            None => {
                let dense_idx = f.usize_or("dense_mlp_idx", 0)?;
                (0..n_layers)
                    .map(|i| {
                        if i < dense_idx {
                            MlpKind::Dense
                        } else {
                            MlpKind::Sparse
                        }
                    })
                    .collect()
            }
        };
        if layer_types.len() != n_layers {
            return Err(f.bad(
                "layer_types",
                format!("{} entries for {n_layers} layers", layer_types.len()),
            ));
        }
        if mlp_layer_types.len() != n_layers {
            return Err(f.bad(
                "mlp_layer_types",
                format!("{} entries for {n_layers} layers", mlp_layer_types.len()),
            ));
        }
        let cfg = TextConfig {
            vocab_size: f.usize_req("vocab_size")?,
            unpadded_vocab_size: f.usize_opt("unpadded_vocab_size")?,
            hidden_size: f.usize_req("hidden_size")?,
            num_hidden_layers: n_layers,
            num_attention_heads: f.usize_req("num_attention_heads")?,
            num_key_value_heads: f.usize_req("num_key_value_heads")?,
            head_dim: f.usize_req("head_dim")?,
            swa_num_attention_heads: f.usize_or("swa_num_attention_heads", 64)?,
            swa_num_key_value_heads: f.usize_or("swa_num_key_value_heads", 16)?,
            swa_head_dim: f.usize_or("swa_head_dim", 128)?,
            sliding_window_size: f.usize_or("sliding_window_size", 512)?,
            d_rel: f.usize_or("d_rel", 16)?,
            rel_extent: f.usize_or("rel_extent", 1024)?,
            log_scaling_n_floor: f.f64_opt("log_scaling_n_floor")?,
            log_scaling_alpha: f.f64_or("log_scaling_alpha", 0.1)?,
            layer_types,
            mlp_layer_types,
            rms_norm_eps: f.f64_or("rms_norm_eps", 1e-6)?,
            conv_kernel_size: f.usize_or("conv_kernel_size", 4)?,
            intermediate_size,
            moe_intermediate_size,
            n_routed_experts: f.usize_or("n_routed_experts", 256)?,
            num_experts_per_tok: f.usize_or("num_experts_per_tok", 6)?,
            n_shared_experts: f.usize_or("n_shared_experts", 2)?,
            route_scale: f.f64_or("route_scale", 8.0)?,
            logits_mup_width_multiplier: f.f64_or("logits_mup_width_multiplier", 24.0)?,
            bos_token_id: f.id_opt("bos_token_id")?,
            eos_token_ids: f.ids("eos_token_id")?,
            pad_token_id: f.id_opt("pad_token_id")?,
            max_position_embeddings: match f.usize_opt("max_position_embeddings")? {
                Some(0) => return Err(f.bad("max_position_embeddings", "must be positive")),
                n => n,
            },
            multimodal,
        };
        cfg.validate(file)?;
        Ok(cfg)
    }

    fn validate(&self, file: &Path) -> Result<()> {
        let bad = |field: &str, msg: String| ModelError::BadField {
            file: file.into(),
            field: field.into(),
            msg,
        };
        // Limits far past any real model, so that products of shapes (and byte counts) never
        // overflow 64 bits.
        for (name, v, max) in [
            ("hidden_size", self.hidden_size, MAX_WIDTH),
            ("head_dim", self.head_dim, MAX_WIDTH),
            ("swa_head_dim", self.swa_head_dim, MAX_WIDTH),
            ("intermediate_size", self.intermediate_size, MAX_WIDTH),
            (
                "moe_intermediate_size",
                self.moe_intermediate_size,
                MAX_WIDTH,
            ),
            ("num_attention_heads", self.num_attention_heads, MAX_COUNT),
            ("num_key_value_heads", self.num_key_value_heads, MAX_COUNT),
            (
                "swa_num_attention_heads",
                self.swa_num_attention_heads,
                MAX_COUNT,
            ),
            (
                "swa_num_key_value_heads",
                self.swa_num_key_value_heads,
                MAX_COUNT,
            ),
            ("n_routed_experts", self.n_routed_experts, MAX_COUNT),
            ("n_shared_experts", self.n_shared_experts, MAX_COUNT),
            ("num_experts_per_tok", self.num_experts_per_tok, MAX_COUNT),
            ("d_rel", self.d_rel, MAX_COUNT),
            ("conv_kernel_size", self.conv_kernel_size, MAX_COUNT),
            ("vocab_size", self.vocab_size, MAX_LENGTH),
            ("sliding_window_size", self.sliding_window_size, MAX_LENGTH),
            ("rel_extent", self.rel_extent, MAX_LENGTH),
        ] {
            if v > max {
                return Err(bad(
                    name,
                    format!("{v} is past the engine's limit of {max}"),
                ));
            }
        }
        for (name, v) in [
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("swa_num_attention_heads", self.swa_num_attention_heads),
            ("swa_num_key_value_heads", self.swa_num_key_value_heads),
            ("swa_head_dim", self.swa_head_dim),
            ("sliding_window_size", self.sliding_window_size),
            ("rel_extent", self.rel_extent),
            ("conv_kernel_size", self.conv_kernel_size),
            ("vocab_size", self.vocab_size),
        ] {
            if v == 0 {
                return Err(bad(name, "must be positive".into()));
            }
        }
        // the BOS id is an input token (perplexity prepends it): a row of the embedding
        if let Some(id) = self
            .bos_token_id
            .filter(|&id| id as usize >= self.vocab_size)
        {
            return Err(bad(
                "bos_token_id",
                format!(
                    "{id} is outside the vocabulary of {} tokens (vocab_size)",
                    self.vocab_size
                ),
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(bad(
                "rms_norm_eps",
                format!("must be a positive number, got {}", self.rms_norm_eps),
            ));
        }
        // the router's weight scale and the head's divisor (modeling_inkling.py; the parse keeps
        // every f64 field within f32 range)
        for (name, v) in [
            ("route_scale", self.route_scale),
            (
                "logits_mup_width_multiplier",
                self.logits_mup_width_multiplier,
            ),
        ] {
            if v <= 0.0 {
                return Err(bad(name, format!("must be a positive number, got {v}")));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(bad(
                "num_key_value_heads",
                "must divide num_attention_heads".into(),
            ));
        }
        if !self
            .swa_num_attention_heads
            .is_multiple_of(self.swa_num_key_value_heads)
        {
            return Err(bad(
                "swa_num_key_value_heads",
                "must divide swa_num_attention_heads".into(),
            ));
        }
        if self.mlp_layer_types.contains(&MlpKind::Sparse) {
            if self.n_shared_experts == 0 {
                return Err(bad(
                    "n_shared_experts",
                    "the router needs at least one shared expert (sink)".into(),
                ));
            }
            if self.num_experts_per_tok == 0 || self.num_experts_per_tok > self.n_routed_experts {
                return Err(bad(
                    "num_experts_per_tok",
                    "must be in 1..=n_routed_experts".into(),
                ));
            }
        }
        if let Some(u) = self.unpadded_vocab_size {
            if u == 0 || u > self.vocab_size {
                return Err(bad(
                    "unpadded_vocab_size",
                    format!("{u} is not in 1..={}", self.vocab_size),
                ));
            }
        }
        if let Some(n) = self.log_scaling_n_floor {
            if n <= 0.0 {
                return Err(bad("log_scaling_n_floor", "must be positive".into()));
            }
        }
        Ok(())
    }

    /// Attention geometry of layer `i`.
    pub fn attn(&self, i: usize) -> AttnGeom {
        match self.layer_types[i] {
            AttnKind::Sliding => AttnGeom {
                kind: AttnKind::Sliding,
                heads: self.swa_num_attention_heads,
                kv_heads: self.swa_num_key_value_heads,
                head_dim: self.swa_head_dim,
                window: Some(self.sliding_window_size),
                rel_extent: self.sliding_window_size,
                d_rel: self.d_rel,
                log_scaling: None,
            },
            AttnKind::Full => AttnGeom {
                kind: AttnKind::Full,
                heads: self.num_attention_heads,
                kv_heads: self.num_key_value_heads,
                head_dim: self.head_dim,
                window: None,
                rel_extent: self.rel_extent,
                d_rel: self.d_rel,
                log_scaling: self
                    .log_scaling_n_floor
                    .map(|n| (n, self.log_scaling_alpha)),
            },
        }
    }

    /// Number of logits the head returns: `unpadded_vocab_size` when set, else `vocab_size`.
    pub fn logits_width(&self) -> usize {
        self.unpadded_vocab_size
            .unwrap_or(self.vocab_size)
            .min(self.vocab_size)
    }
}

/// `generation_config.json` (all optional).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationConfig {
    pub eos_token_ids: Vec<u32>,
    pub do_sample: bool,
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    /// transformers' `min_p` (`MinPLogitsWarper`): used when `do_sample` is set.
    pub min_p: Option<f32>,
    /// transformers' `repetition_penalty` (`RepetitionPenaltyLogitsProcessor`): over the whole
    /// sequence (prompt and generated), greedy or sampled.
    pub repetition_penalty: Option<f32>,
    pub max_new_tokens: Option<usize>,
    /// transformers' `max_length` (prompt + new tokens), used when `max_new_tokens` is not set.
    pub max_length: Option<usize>,
    /// Fields set to a value that changes transformers' output and that this engine does not
    /// implement, as `field = value` ([`IGNORED_FIELDS`]): the commands warn about each.
    pub ignored: Vec<String>,
}

/// Whether a field's value changes nothing.
pub type Inactive = fn(&serde_json::Value) -> bool;

/// generation_config.json fields transformers 5.24.0 acts on that this engine does not
/// implement, each with the test of a value that changes nothing (transformers' default, or
/// the value its `_get_logits_processor` skips).
pub const IGNORED_FIELDS: &[(&str, Inactive)] = &[
    ("min_length", |v| v.as_f64() == Some(0.0)),
    ("min_new_tokens", |v| v.as_f64() == Some(0.0)),
    ("no_repeat_ngram_size", |v| v.as_f64() == Some(0.0)),
    ("num_beams", |v| v.as_f64() == Some(1.0)),
    ("typical_p", |v| v.as_f64() == Some(1.0)),
    ("epsilon_cutoff", |v| v.as_f64() == Some(0.0)),
    ("eta_cutoff", |v| v.as_f64() == Some(0.0)),
    ("encoder_repetition_penalty", |v| v.as_f64() == Some(1.0)),
    ("guidance_scale", |v| v.as_f64() == Some(1.0)),
    ("bad_words_ids", empty_list),
    ("suppress_tokens", empty_list),
    ("begin_suppress_tokens", empty_list),
    ("sequence_bias", empty_list),
    ("forced_bos_token_id", |_| false),
    ("forced_eos_token_id", empty_list),
    ("exponential_decay_length_penalty", |_| false),
    ("renormalize_logits", |v| v.as_bool() == Some(false)),
    ("stop_strings", |v| empty_list(v) || v.as_str() == Some("")),
    ("max_time", |_| false),
    ("num_return_sequences", |v| v.as_f64() == Some(1.0)),
];

fn empty_list(v: &serde_json::Value) -> bool {
    v.as_array().is_some_and(|a| a.is_empty()) || v.as_object().is_some_and(|o| o.is_empty())
}

impl GenerationConfig {
    /// Read `DIR/generation_config.json`; `Ok(None)` when the file does not exist.
    pub fn from_dir(dir: &Path) -> Result<Option<GenerationConfig>> {
        let file: PathBuf = dir.join("generation_config.json");
        if !file.exists() {
            return Ok(None);
        }
        let v = read_json(&file)?;
        let bad = |field: &str, msg: String| ModelError::BadField {
            file: file.clone(),
            field: field.into(),
            msg,
        };
        let num = |k: &str| {
            v.get(k)
                .and_then(|x| if x.is_null() { None } else { Some(x) })
        };
        let f32_of = |k: &str| -> Result<Option<f32>> {
            num(k)
                .map(|x| {
                    x.as_f64()
                        .map(|f| f as f32)
                        .filter(|f| f.is_finite())
                        .ok_or_else(|| {
                            bad(
                                k,
                                format!("expected a number within the f32 range, got {x}"),
                            )
                        })
                })
                .transpose()
        };
        let usize_of = |k: &str| -> Result<Option<usize>> {
            num(k)
                .map(|x| {
                    // transformers computes lengths from the value as Python has it: 8.0 works
                    x.as_u64()
                        .or_else(|| {
                            x.as_f64()
                                .filter(|f| {
                                    f.fract() == 0.0 && (0.0..=9.007_199_254_740_992e15).contains(f)
                                })
                                .map(|f| f as u64)
                        })
                        .and_then(|u| usize::try_from(u).ok())
                        .ok_or_else(|| bad(k, format!("expected a whole number ≥ 0, got {x}")))
                })
                .transpose()
        };
        Ok(Some(GenerationConfig {
            eos_token_ids: parse_ids(v.get("eos_token_id")).map_err(|m| bad("eos_token_id", m))?,
            do_sample: match num("do_sample") {
                None => false,
                Some(x) => x
                    .as_bool()
                    .ok_or_else(|| bad("do_sample", format!("expected a bool, got {x}")))?,
            },
            temperature: f32_of("temperature")?,
            top_k: usize_of("top_k")?,
            top_p: f32_of("top_p")?,
            min_p: f32_of("min_p")?,
            repetition_penalty: f32_of("repetition_penalty")?,
            max_new_tokens: usize_of("max_new_tokens")?,
            max_length: usize_of("max_length")?,
            ignored: IGNORED_FIELDS
                .iter()
                .filter_map(|&(k, off)| num(k).filter(|x| !off(x)).map(|x| format!("{k} = {x}")))
                .collect(),
        }))
    }
}
