//! Decode profiling: per-phase GPU time per token from timestamp queries, the bytes a decode step
//! must read, and the roofline those bytes give against the copy bandwidth.
//!
//! [`crate::model::GpuModel::start_profile`] switches the model into profile mode: every decode
//! step (one token) is then recorded as one compute pass per phase run, each pass writing a
//! timestamp at its beginning and end (plain `TIMESTAMP_QUERY`, no timestamps inside passes). Each
//! step resolves its queries into a GPU buffer; the host reads them back only when that buffer is
//! full and at [`crate::model::GpuModel::take_profile`]. The kernels and their order are the same as
//! in the normal single-pass step, so the tokens are the same.
/// A phase of the decode step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Input norm, q/k/v/r GEMVs, k/v convs, q/k norms, attention, o_proj, attn_sconv.
    Attention,
    /// Router GEMV and the top-k / gamma kernel.
    Router,
    /// Routed experts: gate_up GEMV, silu·up, down GEMV.
    Routed,
    /// Shared experts: gate_up GEMV, silu·up, down GEMV.
    Shared,
    /// The dense MLP of a dense layer (which has no router or experts).
    Dense,
    /// Final norm, ÷ mup, lm_head GEMV, argmax.
    Head,
    /// Everything else: embedding + norm, post-attention norm, MoE combine, mlp_sconv.
    Other,
}

impl Phase {
    pub const ALL: [Phase; 7] = [
        Phase::Attention,
        Phase::Router,
        Phase::Routed,
        Phase::Shared,
        Phase::Dense,
        Phase::Head,
        Phase::Other,
    ];

    pub fn index(self) -> usize {
        Phase::ALL.iter().position(|&p| p == self).expect("listed")
    }

    /// JSON key.
    pub fn key(self) -> &'static str {
        match self {
            Phase::Attention => "attention",
            Phase::Router => "router",
            Phase::Routed => "routed_experts",
            Phase::Shared => "shared_experts",
            Phase::Dense => "dense_mlp",
            Phase::Head => "head",
            Phase::Other => "other",
        }
    }
}

/// What a profiled run accumulated over its decode steps (one token each).
#[derive(Clone, Debug, Default)]
pub struct DecodeProfile {
    /// Decode steps counted.
    pub steps: usize,
    /// Sum over the steps of the bytes each had to read ([`crate::model::GpuModel::decode_bytes`]).
    pub bytes_sum: f64,
    /// Per-phase GPU seconds summed over the steps, in [`Phase::ALL`] order; `None` without
    /// `TIMESTAMP_QUERY`.
    pub phase_s: Option<[f64; 7]>,
    /// GPU seconds from the first pass's beginning to the last pass's end, summed over the steps.
    pub span_s: Option<f64>,
}

impl DecodeProfile {
    /// Mean bytes read per decode step.
    pub fn bytes_per_token(&self) -> f64 {
        if self.steps == 0 {
            0.0
        } else {
            self.bytes_sum / self.steps as f64
        }
    }

    /// Per-phase milliseconds per decode token.
    pub fn phase_ms(&self) -> Option<[f64; 7]> {
        let n = self.steps.max(1) as f64;
        self.phase_s.map(|p| p.map(|s| 1e3 * s / n))
    }

    /// GPU milliseconds per decode token (first pass begin → last pass end).
    pub fn total_ms(&self) -> Option<f64> {
        let n = self.steps.max(1) as f64;
        self.span_s.map(|s| 1e3 * s / n)
    }
}

/// Compute dispatches of one recorded one-token step
/// ([`crate::model::GpuModel::step_dispatches`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepDispatches {
    /// Dispatches of the whole step.
    pub step: usize,
    /// Dispatches outside the layers: the embedding before the first layer and the head.
    pub fixed: usize,
    /// Layers of the model.
    pub layers: usize,
}

impl StepDispatches {
    /// Mean dispatches per layer: (step − fixed) / layers.
    pub fn per_layer(&self) -> f64 {
        (self.step - self.fixed) as f64 / self.layers.max(1) as f64
    }

    /// JSON: `{"per_step", "fixed", "layers", "per_layer"}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "per_step": self.step,
            "fixed": self.fixed,
            "layers": self.layers,
            "per_layer": self.per_layer(),
        })
    }

    /// One text line.
    pub fn text(&self) -> String {
        format!(
            "  dispatches per decode step: {} ({} fixed: embedding and head) | per layer {:.2} ({} layers)",
            self.step,
            self.fixed,
            self.per_layer(),
            self.layers
        )
    }
}

/// The figures `generate --profile` and `bench decode` print.
#[derive(Clone, Debug)]
pub struct DecodeReport {
    pub adapter: String,
    pub model: String,
    /// Decode tokens per second (wall clock).
    pub decode_tok_s: f64,
    /// Whether `decode_tok_s` comes from the profiled run (one pass per phase) itself.
    pub tok_s_profiled: bool,
    pub profile: DecodeProfile,
    /// Copy bandwidth (bytes read + written per second, as `bench copy` counts), GB/s.
    pub copy_gbs: f64,
    /// Where `copy_gbs` comes from.
    pub copy_source: String,
    /// Expert streaming counters (`None` when the routed experts are resident).
    pub stream: Option<crate::model::StreamStats>,
}

impl DecodeReport {
    /// Milliseconds per decode token of upload stall as the host sees it: the host copy time of
    /// the decode steps' misses ([`StreamStats::decode_upload_s`]) over the decode steps (see that
    /// field for what it leaves out); `None` when resident.
    ///
    /// [`StreamStats::decode_upload_s`]: crate::model::StreamStats::decode_upload_s
    pub fn upload_stall_ms(&self) -> Option<f64> {
        self.stream
            .map(|x| 1e3 * x.decode_upload_s / self.profile.steps.max(1) as f64)
    }

    /// Tokens per second if every step ran at the copy bandwidth.
    pub fn roofline_tok_s(&self) -> f64 {
        let b = self.profile.bytes_per_token();
        if b > 0.0 {
            self.copy_gbs * 1e9 / b
        } else {
            0.0
        }
    }

    pub fn frac_roofline(&self) -> f64 {
        let r = self.roofline_tok_s();
        if r > 0.0 {
            self.decode_tok_s / r
        } else {
            0.0
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        let phases = self.profile.phase_ms().map(|p| {
            let mut m = serde_json::Map::new();
            for ph in Phase::ALL {
                m.insert(ph.key().into(), p[ph.index()].into());
            }
            serde_json::Value::Object(m)
        });
        serde_json::json!({
            "adapter": self.adapter,
            "model": self.model,
            "decode_tok_s": self.decode_tok_s,
            "decode_steps": self.profile.steps,
            "roofline_tok_s": self.roofline_tok_s(),
            "frac_roofline": self.frac_roofline(),
            "bytes_per_token": self.profile.bytes_per_token(),
            "phases_ms": phases,
            "gpu_ms_per_token": self.profile.total_ms(),
            "wall_ms_per_token": if self.decode_tok_s > 0.0 { 1e3 / self.decode_tok_s } else { 0.0 },
            "copy_gbs": self.copy_gbs,
            "copy_source": self.copy_source,
            "upload_stall_ms_per_token": self.upload_stall_ms(),
            "experts": self.stream.map(|x| x.to_json()),
        })
    }

    /// The human-readable report (several lines, no trailing newline).
    pub fn text(&self) -> String {
        let mut s = String::new();
        let p = &self.profile;
        if p.steps == 0 {
            return format!(
                "decode profile: {} ({}): no decode step ran (the only generated token came \
                 from the prompt's forward: --max-tokens 1, or an end-of-sequence token first)",
                self.model, self.adapter
            );
        }
        s.push_str(&format!(
            "decode profile: {} ({}), {} decode steps\n",
            self.model, self.adapter, p.steps
        ));
        match (p.phase_ms(), p.total_ms()) {
            (Some(ph), Some(total)) => {
                s.push_str("  phase            GPU ms/token   share\n");
                for x in Phase::ALL {
                    let v = ph[x.index()];
                    let share = if total > 0.0 { 100.0 * v / total } else { 0.0 };
                    s.push_str(&format!("  {:<16} {:>12.4} {:>6.1}%\n", x.key(), v, share));
                }
                let gaps = (total - ph.iter().sum::<f64>()).max(0.0);
                s.push_str(&format!(
                    "  {:<16} {:>12.4} {:>6.1}%\n",
                    "(between passes)",
                    gaps,
                    if total > 0.0 {
                        100.0 * gaps / total
                    } else {
                        0.0
                    }
                ));
                s.push_str(&format!(
                    "  {:<16} {:>12.4}   (GPU tok/s {:.1})\n",
                    "total",
                    total,
                    if total > 0.0 { 1e3 / total } else { 0.0 }
                ));
            }
            _ if self.stream.is_some() => s.push_str(
                "  per-phase GPU times unavailable while experts stream (each layer is its own submission)\n",
            ),
            _ => s.push_str("  per-phase times unavailable: this adapter lacks TIMESTAMP_QUERY\n"),
        }
        if let Some(ms) = self.upload_stall_ms() {
            s.push_str(&format!(
                "  {:<16} {:>12.4}   ms/token (host copying misses; the GPU waits on it)\n",
                "upload stall", ms
            ));
        }
        if let (Some(total), true) = (p.total_ms(), self.decode_tok_s > 0.0) {
            let wall = 1e3 / self.decode_tok_s;
            if wall >= total {
                s.push_str(&format!(
                    "  wall {wall:.4} ms/token: {:.4} ms/token outside the GPU's passes (submission, readback, host)\n",
                    wall - total
                ));
            } else {
                // the timed run is one pass per step; the phase passes above add their own gaps
                s.push_str(&format!(
                    "  wall {wall:.4} ms/token: less than the phase passes' total (one pass per phase \
                     adds gaps the timed single-pass step does not have)\n"
                ));
            }
        }
        s.push_str(&format!(
            "  decode {:.1} tok/s{} | {:.0} bytes/token | copy {:.1} GB/s ({}) | roofline {:.1} tok/s | {:.1}% of roofline",
            self.decode_tok_s,
            if self.tok_s_profiled { " (profiled run)" } else { "" },
            p.bytes_per_token(),
            self.copy_gbs,
            self.copy_source,
            self.roofline_tok_s(),
            100.0 * self.frac_roofline()
        ));
        s
    }
}

/// GPU time per kernel name from the per-op profile ([`crate::model::GpuModel::start_op_profile`]):
/// each kernel of a one-token step timed as its own compute pass, names without their layer
/// (`"q_proj"`, `"shared gate_up"`, `"rms_norm"`), in order of first appearance.
#[derive(Clone, Debug, Default)]
pub struct OpTimes {
    /// Profiled steps.
    pub steps: usize,
    /// `(name, GPU seconds summed over steps and layers, dispatch count)`.
    pub ops: Vec<(String, f64, u64)>,
    /// GPU seconds from the first kernel's start to the last one's end, summed over the steps.
    pub span_s: f64,
}

impl OpTimes {
    /// Add one kernel's time.
    pub fn add(&mut self, name: &str, secs: f64) {
        match self.ops.iter_mut().find(|o| o.0 == name) {
            Some(o) => {
                o.1 += secs;
                o.2 += 1;
            }
            None => self.ops.push((name.to_string(), secs, 1)),
        }
    }

    /// Text table: per name, µs per step, calls per step, µs per call, share of the kernels' sum.
    pub fn text(&self) -> String {
        let n = self.steps.max(1) as f64;
        let total: f64 = self.ops.iter().map(|o| o.1).sum();
        let mut s = format!(
            "per-op GPU time ({} steps, each kernel its own timed pass):\n  {:<28} {:>10} {:>7} {:>9} {:>6}\n",
            self.steps, "kernel", "µs/step", "calls", "µs/call", "share"
        );
        for (name, secs, calls) in &self.ops {
            s += &format!(
                "  {:<28} {:>10.1} {:>7.0} {:>9.2} {:>5.1}%\n",
                name,
                secs / n * 1e6,
                *calls as f64 / n,
                secs / *calls as f64 * 1e6,
                100.0 * secs / total.max(1e-30)
            );
        }
        s += &format!(
            "  {:<28} {:>10.1}   (first start to last end: {:.1} µs/step)",
            "sum of kernels",
            total / n * 1e6,
            self.span_s / n * 1e6
        );
        s
    }

    /// JSON: `{"steps", "span_us_per_step", "ops": [{"name", "us_per_step", "calls_per_step"}]}`.
    pub fn to_json(&self) -> serde_json::Value {
        let n = self.steps.max(1) as f64;
        serde_json::json!({
            "steps": self.steps,
            "span_us_per_step": self.span_s / n * 1e6,
            "ops": self.ops.iter().map(|(name, secs, calls)| serde_json::json!({
                "name": name, "us_per_step": secs / n * 1e6, "calls_per_step": *calls as f64 / n,
            })).collect::<Vec<_>>(),
        })
    }
}
