//! The recorded kernel invocation of a step and its label (layer, op): every GEMV and op call the
//! recipe builds, recorded the same way.
use crate::gpu::gemv::GemvCall;
use crate::gpu::ops::{conv::ConvCall, ArgmaxCall, AttentionCall, OpCall};

/// Which kernel of which layer a call is: the per-op profile's key is `op`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Label {
    pub layer: Option<usize>,
    pub op: String,
}

enum Kind {
    Op(OpCall),
    Conv(ConvCall),
    Attn(AttentionCall),
    Gemv(GemvCall),
    Argmax(ArgmaxCall),
}

/// One fully bound kernel invocation (one or more dispatches).
pub(super) struct Call {
    pub label: Label,
    kind: Kind,
}

impl Call {
    pub fn gemv(c: GemvCall, layer: Option<usize>, op: &str) -> Call {
        Call {
            label: Label {
                layer,
                op: op.to_string(),
            },
            kind: Kind::Gemv(c),
        }
    }

    /// The same call labelled as part of decoder layer `layer`.
    pub fn at_layer(mut self, layer: usize) -> Call {
        self.label.layer = Some(layer);
        self
    }

    pub fn record_in_pass(&self, pass: &mut wgpu::ComputePass<'_>) {
        match &self.kind {
            Kind::Op(c) => c.record_in_pass(pass),
            Kind::Conv(c) => c.record_in_pass(pass),
            Kind::Attn(c) => c.record_in_pass(pass),
            Kind::Gemv(c) => c.record_in_pass(pass),
            Kind::Argmax(c) => c.record_in_pass(pass),
        }
    }

    /// Dispatches this call records.
    pub fn dispatches(&self) -> usize {
        match &self.kind {
            Kind::Op(c) => c.dispatches.len(),
            Kind::Conv(c) => c.call.dispatches.len(),
            Kind::Attn(c) => c.call.dispatches.len(),
            Kind::Gemv(c) => c.dispatches(),
            Kind::Argmax(c) => c.call.dispatches.len(),
        }
    }
}

fn op_label(raw: &str) -> Label {
    Label {
        layer: None,
        op: raw.to_string(),
    }
}

impl From<OpCall> for Call {
    fn from(c: OpCall) -> Call {
        Call {
            label: op_label(&c.label),
            kind: Kind::Op(c),
        }
    }
}

impl From<ConvCall> for Call {
    fn from(c: ConvCall) -> Call {
        Call {
            label: op_label(&c.call.label),
            kind: Kind::Conv(c),
        }
    }
}

impl From<AttentionCall> for Call {
    fn from(c: AttentionCall) -> Call {
        Call {
            label: op_label(&c.call.label),
            kind: Kind::Attn(c),
        }
    }
}

impl From<ArgmaxCall> for Call {
    fn from(c: ArgmaxCall) -> Call {
        Call {
            label: op_label(&c.call.label),
            kind: Kind::Argmax(c),
        }
    }
}
