//! config.json parsing: aliases, derived layer types, dense_intermediate_size, eos lists.
use inkling_wgpu::model::{AttnKind, MlpKind, TextConfig};
use serde_json::json;
use std::path::Path;

fn parse(v: serde_json::Value) -> TextConfig {
    TextConfig::from_value(&v, Path::new("config.json")).unwrap()
}

fn base() -> serde_json::Value {
    json!({"vocab_size": 100, "hidden_size": 16, "num_hidden_layers": 13, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 4, "intermediate_size": 64})
}

#[test]
fn derived_layer_types_and_defaults() {
    let c = parse(base());
    // sliding iff (i + 1) % 6 != 0
    let full: Vec<usize> = (0..13)
        .filter(|&i| c.layer_types[i] == AttnKind::Full)
        .collect();
    assert_eq!(full, vec![5, 11]);
    assert!(c.mlp_layer_types.iter().all(|&m| m == MlpKind::Sparse));
    assert_eq!(c.sliding_window_size, 512);
    assert_eq!(c.eos_token_ids, Vec::<u32>::new());
    assert_eq!(c.logits_width(), 100);

    let mut v = base();
    v["local_layer_ids"] = json!([0, 3]);
    v["dense_mlp_idx"] = json!(2);
    let c = parse(v);
    let sliding: Vec<usize> = (0..13)
        .filter(|&i| c.layer_types[i] == AttnKind::Sliding)
        .collect();
    assert_eq!(sliding, vec![0, 3]);
    assert_eq!(
        &c.mlp_layer_types[..3],
        &[MlpKind::Dense, MlpKind::Dense, MlpKind::Sparse]
    );
}

#[test]
fn aliases_and_dense_intermediate_size() {
    let mut v = base();
    let o = v.as_object_mut().unwrap();
    o.insert("sconv_kernel_size".into(), json!(3));
    o.insert("sliding_window".into(), json!(7));
    o.insert("num_local_experts".into(), json!(9));
    o.insert("embedding_multiplier".into(), json!(12.0));
    o.insert("dense_intermediate_size".into(), json!(200));
    o.insert("eos_token_id".into(), json!([2, 7]));
    o.insert("unpadded_vocab_size".into(), json!(90));
    o.insert("log_scaling_n_floor".into(), json!(4));
    let c = parse(v);
    assert_eq!(c.conv_kernel_size, 3);
    assert_eq!(c.sliding_window_size, 7);
    assert_eq!(c.n_routed_experts, 9);
    assert_eq!(c.logits_mup_width_multiplier, 12.0);
    assert_eq!(c.moe_intermediate_size, 64);
    assert_eq!(c.intermediate_size, 200);
    assert_eq!(c.eos_token_ids, vec![2, 7]);
    assert_eq!(c.logits_width(), 90);
    // geometry: sliding layer 0 uses the window as its rel extent and no τ; full layer 5 has τ
    let g0 = c.attn(0);
    assert_eq!(
        (g0.window, g0.rel_extent, g0.log_scaling),
        (Some(7), 7, None)
    );
    let g5 = c.attn(5);
    assert_eq!(g5.window, None);
    assert_eq!(g5.tau(2), 1.0); // (2+1)/4 < 1
    assert!((g5.tau(7) - (1.0 + 0.1 * 2f32.ln())).abs() < 1e-6);
}

#[test]
fn multimodal_text_config_and_bad_fields() {
    let c = parse(json!({"model_type": "inkling_mm_model", "text_config": base()}));
    assert!(c.multimodal);
    assert_eq!(c.hidden_size, 16);
    let mut v = base();
    v["head_dim"] = json!("sixteen");
    let e = TextConfig::from_value(&v, Path::new("/x/config.json"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("/x/config.json") && e.contains("head_dim"),
        "{e}"
    );
    let mut v = base();
    v["layer_types"] = json!(["hybrid"]);
    let e = TextConfig::from_value(&v, Path::new("config.json"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("layer_types"), "{e}");
}

/// A BOS id that is no row of the embedding names config.json and the key (perplexity prepends
/// it; the loader's own "outside the vocabulary" error named neither).
#[test]
fn a_bos_id_outside_the_vocabulary_names_the_file_and_key() {
    let mut v = base();
    v["bos_token_id"] = json!(99_999);
    let e = TextConfig::from_value(&v, Path::new("/x/config.json"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "/x/config.json: field `bos_token_id`: 99999 is outside the vocabulary of 100 tokens (vocab_size)"
    );
    v["bos_token_id"] = json!(99);
    assert_eq!(parse(v).bos_token_id, Some(99));
}

/// The router's `route_scale` and the head's divisor `logits_mup_width_multiplier` (alias
/// `embedding_multiplier`) must be positive: a divisor of 0 made every logit non-finite at run
/// time, after the model had loaded; past f32 range both are refused by the parse.
#[test]
fn route_scale_and_logits_divisor_must_be_positive() {
    for field in [
        "route_scale",
        "logits_mup_width_multiplier",
        "embedding_multiplier",
    ] {
        for bad in [json!(0.0), json!(-1.0), json!(1e39)] {
            let want = if bad == json!(1e39) {
                "expected a number within the f32 range"
            } else {
                "must be a positive number"
            };
            let mut v = base();
            v[field] = bad.clone();
            let e = TextConfig::from_value(&v, Path::new("/x/config.json"))
                .unwrap_err()
                .to_string();
            let named = if field == "embedding_multiplier" {
                "logits_mup_width_multiplier"
            } else {
                field
            };
            assert!(
                e.starts_with(&format!("/x/config.json: field `{named}`: {want}")),
                "{field} {bad}: {e}"
            );
        }
    }
    let mut v = base();
    v["route_scale"] = json!(2.5);
    v["logits_mup_width_multiplier"] = json!(0.5);
    let c = parse(v);
    assert_eq!((c.route_scale, c.logits_mup_width_multiplier), (2.5, 0.5));
}

/// A size written as a float says so, rather than "expected a non-negative integer, got 64.0".
#[test]
fn a_size_in_float_form_is_named_as_such() {
    let mut v = base();
    v["hidden_size"] = json!(16.0);
    let e = TextConfig::from_value(&v, Path::new("/x/config.json"))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("/x/config.json: field `hidden_size`: expected an integer written without a decimal point or exponent"),
        "{e}"
    );
    assert!(e.ends_with("got 16.0"), "{e}");
    v["hidden_size"] = json!(-3);
    let e = TextConfig::from_value(&v, Path::new("/x/config.json"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("expected a non-negative integer, got -3"), "{e}");
}
