//! The one mapping between the two checkpoint name layouts: released names (`model.llm.…`,
//! layout b) ↔ transformers `InklingForCausalLM` names (`model.layers.N.…`, layout a).
//!
//! Used by the loader ([`crate::model::weights::Weights::load`], which asks for tensors by their
//! transformers name) and by the converter ([`super::convert`], which renames released tensors). Released-only tensors whose rows are interleaved keep a distinct name on the
//! transformers side (`mlp.w13_dn.weight`, `mlp.experts.w13_weight`,
//! `mlp.shared_experts.w13_weight`), so that no reader mistakes them for de-interleaved ones.

/// Top-level tensors: (name after `model.llm.`, transformers name).
const TOP: [(&str, &str); 4] = [
    ("embed.weight", "model.embed_tokens.weight"),
    ("embed_norm.weight", "model.embed_tokens.embed_norm.weight"),
    ("norm.weight", "model.norm.weight"),
    ("unembed.weight", "lm_head.weight"),
];

/// Per-layer tensors: (name after `model.llm.layers.N.`, name after `model.layers.N.`).
const LAYER: [(&str, &str); 24] = [
    ("attn_norm.weight", "input_layernorm.weight"),
    ("mlp_norm.weight", "post_attention_layernorm.weight"),
    ("attn.wq_du.weight", "self_attn.q_proj.weight"),
    ("attn.wk_dv.weight", "self_attn.k_proj.weight"),
    ("attn.wv_dv.weight", "self_attn.v_proj.weight"),
    ("attn.wr_du.weight", "self_attn.r_proj.weight"),
    ("attn.wo_ud.weight", "self_attn.o_proj.weight"),
    ("attn.q_norm.weight", "self_attn.q_norm.weight"),
    ("attn.k_norm.weight", "self_attn.k_norm.weight"),
    ("attn.k_sconv.weight", "self_attn.k_sconv.conv1d.weight"),
    ("attn.v_sconv.weight", "self_attn.v_sconv.conv1d.weight"),
    (
        "attn.rel_logits_proj.proj",
        "self_attn.rel_logits_proj.proj",
    ),
    ("attn_sconv.weight", "attn_sconv.conv1d.weight"),
    ("mlp_sconv.weight", "mlp_sconv.conv1d.weight"),
    ("mlp.w13_dn.weight", "mlp.w13_dn.weight"),
    ("mlp.w2_md.weight", "mlp.down_proj.weight"),
    ("mlp.global_scale", "mlp.global_scale"),
    ("mlp.gate.weight", "mlp.gate.weight"),
    ("mlp.gate.bias", "mlp.gate.e_score_correction_bias"),
    ("mlp.gate.global_scale", "mlp.gate.global_scale"),
    ("mlp.experts.w13_weight", "mlp.experts.w13_weight"),
    ("mlp.experts.w2_weight", "mlp.experts.down_proj"),
    (
        "mlp.shared_experts.shared_w13_weight",
        "mlp.shared_experts.w13_weight",
    ),
    (
        "mlp.shared_experts.shared_w2_weight",
        "mlp.shared_experts.down_proj",
    ),
];

/// Prefix of released-layout tensor names.
pub const RELEASED_PREFIX: &str = "model.llm.";

/// A released name with its `model.llm.` prefix removed → the transformers name, or `None` for a
/// name outside the mapping.
pub fn released_to_causal(rest: &str) -> Option<String> {
    if let Some(&(_, c)) = TOP.iter().find(|(r, _)| *r == rest) {
        return Some(c.to_string());
    }
    let (n, t) = rest.strip_prefix("layers.")?.split_once('.')?;
    n.parse::<usize>().ok()?;
    let &(_, c) = LAYER.iter().find(|(r, _)| *r == t)?;
    Some(format!("model.layers.{n}.{c}"))
}

/// A transformers name (`model.…` or `lm_head.weight`) → the full released name
/// (`model.llm.…`), or `None` for a name outside the mapping.
pub fn causal_to_released(causal: &str) -> Option<String> {
    if let Some(&(r, _)) = TOP.iter().find(|(_, c)| *c == causal) {
        return Some(format!("{RELEASED_PREFIX}{r}"));
    }
    let (n, t) = causal.strip_prefix("model.layers.")?.split_once('.')?;
    n.parse::<usize>().ok()?;
    let &(r, _) = LAYER.iter().find(|(_, c)| *c == t)?;
    Some(format!("{RELEASED_PREFIX}layers.{n}.{r}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mapping_is_a_bijection() {
        for (r, c) in TOP {
            assert_eq!(released_to_causal(r).as_deref(), Some(c));
            assert_eq!(causal_to_released(c), Some(format!("model.llm.{r}")));
        }
        for (r, c) in LAYER {
            let rn = format!("layers.7.{r}");
            let cn = format!("model.layers.7.{c}");
            assert_eq!(released_to_causal(&rn).as_deref(), Some(cn.as_str()));
            assert_eq!(causal_to_released(&cn), Some(format!("model.llm.{rn}")));
        }
        let mut seen = std::collections::HashSet::new();
        assert!(LAYER.iter().all(|(_, c)| seen.insert(*c)));
        assert_eq!(released_to_causal("layers.x.attn_norm.weight"), None);
        assert_eq!(released_to_causal("vision.weight"), None);
        assert_eq!(
            causal_to_released("model.layers.0.mlp.experts.gate_up_proj"),
            None
        );
    }
}
