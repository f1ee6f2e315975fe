//! Decode state: per layer a KV cache (a ring of exactly W slots on sliding layers) and the four
//! short-convolution states (the last K−1 inputs of k_sconv, v_sconv, attn_sconv, mlp_sconv).
use super::config::TextConfig;

/// Keys (after k_sconv and k_norm) and values (after v_sconv) of one layer, `dim = kv_heads·head_dim`
/// floats per position. Sliding layers keep only the last `W` positions in a ring indexed by
/// `pos % W`; full layers keep everything.
#[derive(Clone, Debug)]
pub struct KvCache {
    pub dim: usize,
    /// `Some(W)`: ring of W slots.
    pub window: Option<usize>,
    keys: Vec<f32>,
    values: Vec<f32>,
    /// Number of positions pushed so far (the next position).
    len: usize,
}

impl KvCache {
    pub fn new(dim: usize, window: Option<usize>) -> KvCache {
        let cap = window.unwrap_or(0) * dim;
        KvCache {
            dim,
            window,
            keys: vec![0.0; cap],
            values: vec![0.0; cap],
            len: 0,
        }
    }

    /// Positions pushed so far.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Oldest position still held.
    pub fn first_retained(&self) -> usize {
        match self.window {
            Some(w) => self.len.saturating_sub(w),
            None => 0,
        }
    }

    fn slot(&self, pos: usize) -> usize {
        match self.window {
            Some(w) => pos % w,
            None => pos,
        }
    }

    /// Append the key/value of the next position.
    pub fn push(&mut self, k: &[f32], v: &[f32]) {
        assert_eq!(k.len(), self.dim);
        assert_eq!(v.len(), self.dim);
        if self.window.is_some() {
            let s = self.slot(self.len) * self.dim;
            self.keys[s..s + self.dim].copy_from_slice(k);
            self.values[s..s + self.dim].copy_from_slice(v);
        } else {
            self.keys.extend_from_slice(k);
            self.values.extend_from_slice(v);
        }
        self.len += 1;
    }

    /// Key and value of absolute position `pos` (must be in `first_retained()..len()`).
    pub fn get(&self, pos: usize) -> (&[f32], &[f32]) {
        assert!(
            pos >= self.first_retained() && pos < self.len,
            "position {pos} not retained"
        );
        let s = self.slot(pos) * self.dim;
        (&self.keys[s..s + self.dim], &self.values[s..s + self.dim])
    }

    pub fn reset(&mut self) {
        self.len = 0;
        if self.window.is_none() {
            self.keys.clear();
            self.values.clear();
        } else {
            self.keys.fill(0.0);
            self.values.fill(0.0);
        }
    }
}

/// State of one depthwise causal convolution: the last K−1 inputs, oldest first
/// (`[K-1][channels]`), zeros at the start of a sequence (x[s<0] = 0).
#[derive(Clone, Debug)]
pub struct ConvState {
    pub channels: usize,
    pub kernel: usize,
    pub state: Vec<f32>,
}

impl ConvState {
    pub fn new(channels: usize, kernel: usize) -> ConvState {
        ConvState {
            channels,
            kernel,
            state: vec![0.0; (kernel - 1) * channels],
        }
    }

    /// Run the conv with its residual over `x` ([T][channels]) and advance the state:
    /// `out[t,c] = x[t,c] + Σ_k w[c,k]·win[t+k, c]` with `win = [state; x]`.
    /// Works for any T, including T < K−1.
    pub fn apply(&mut self, w: &[f32], x: &[f32]) -> Vec<f32> {
        let c = self.channels;
        let k1 = self.kernel - 1;
        assert_eq!(x.len() % c, 0);
        assert_eq!(w.len(), c * self.kernel);
        let t_len = x.len() / c;
        let mut win = Vec::with_capacity(self.state.len() + x.len());
        win.extend_from_slice(&self.state);
        win.extend_from_slice(x);
        let mut out = vec![0f32; x.len()];
        for t in 0..t_len {
            for ch in 0..c {
                let mut acc = 0f32;
                for k in 0..self.kernel {
                    acc += w[ch * self.kernel + k] * win[(t + k) * c + ch];
                }
                out[t * c + ch] = x[t * c + ch] + acc;
            }
        }
        let total = k1 + t_len;
        self.state
            .copy_from_slice(&win[(total - k1) * c..total * c]);
        out
    }

    pub fn reset(&mut self) {
        self.state.fill(0.0);
    }
}

/// Conv indices inside [`LayerCache::conv`].
pub const K_SCONV: usize = 0;
pub const V_SCONV: usize = 1;
pub const ATTN_SCONV: usize = 2;
pub const MLP_SCONV: usize = 3;

#[derive(Clone, Debug)]
pub struct LayerCache {
    pub kv: KvCache,
    /// k_sconv, v_sconv, attn_sconv, mlp_sconv (see the `*_SCONV` constants).
    pub conv: [ConvState; 4],
}

/// Whole-model decode state for one sequence.
#[derive(Clone, Debug)]
pub struct Cache {
    pub layers: Vec<LayerCache>,
    /// Tokens consumed so far (= absolute position of the next token).
    pub pos: usize,
}

impl Cache {
    pub fn new(cfg: &TextConfig) -> Cache {
        let k = cfg.conv_kernel_size;
        let h = cfg.hidden_size;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| {
                let g = cfg.attn(i);
                let kvd = g.kv_dim();
                LayerCache {
                    kv: KvCache::new(kvd, g.window),
                    conv: [
                        ConvState::new(kvd, k),
                        ConvState::new(kvd, k),
                        ConvState::new(h, k),
                        ConvState::new(h, k),
                    ],
                }
            })
            .collect();
        Cache { layers, pos: 0 }
    }

    /// Forget the sequence (KV and conv states zeroed, position 0).
    pub fn reset(&mut self) {
        self.pos = 0;
        for l in &mut self.layers {
            l.kv.reset();
            for c in &mut l.conv {
                c.reset();
            }
        }
    }
}
