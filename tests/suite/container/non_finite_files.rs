//! Non-finite values in files: `convert` refuses a NaN or an Inf in a source tensor (naming the file,
//! the tensor and the flat index in the source), and the loader refuses a container whose `.qs`
//! scales hold one (naming the shard and the tensor). Damaged copies live in scratch directories.
use crate::model_common::*;
use inkling_wgpu::container::{convert, Container, ConvertOptions};
use std::path::Path;

/// The `.qs` tensor names of a safetensors file, sorted.
fn qs_tensors(file: &Path) -> Vec<String> {
    let b = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let h: serde_json::Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    let mut v: Vec<String> = h
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| k.ends_with(".qs"))
        .cloned()
        .collect();
    v.sort();
    v
}

#[test]
fn convert_refuses_a_non_finite_source_value_naming_tensor_and_flat_index() {
    let src = copy_fixture("tiny-causal-f32", "nan-convert");
    let file = src.join("model.safetensors");
    // expert 3, row 40 (the up half of gate_up_proj [8, 64, 64]), column 7: quantised per expert
    let at = (3 * 64 + 40) * 64 + 7;
    poke_f32(
        &file,
        "model.layers.1.mlp.experts.gate_up_proj",
        at,
        f32::NAN,
    );
    let dst = scratch("nan-convert-out");
    let e = convert(&src, &dst.join("out"), &ConvertOptions::default()).unwrap_err();
    assert_eq!(
        format!("{:#}", e.root_cause()),
        format!(
            "{}: tensor `model.layers.1.mlp.experts.gate_up_proj`: element {at} (flat index) is \
             NaN; convert refuses a non-finite source value (the checkpoint is damaged)",
            file.display()
        )
    );
    // a copied tensor (a norm weight, kept as f32): +inf
    let src = copy_fixture("tiny-causal-f32", "inf-convert");
    let file = src.join("model.safetensors");
    poke_f32(
        &file,
        "model.layers.2.post_attention_layernorm.weight",
        9,
        f32::INFINITY,
    );
    let e = convert(&src, &dst.join("out2"), &ConvertOptions::default()).unwrap_err();
    assert_eq!(
        format!("{:#}", e.root_cause()),
        format!(
            "{}: tensor `model.layers.2.post_attention_layernorm.weight`: element 9 (flat index) \
             is +inf; convert refuses a non-finite source value (the checkpoint is damaged)",
            file.display()
        )
    );
}

#[test]
fn loader_refuses_a_non_finite_container_scale_naming_shard_and_tensor() {
    let dst = scratch("nan-scale").join("c");
    convert(
        &fixture("tiny-causal-f32"),
        &dst,
        &ConvertOptions::default(),
    )
    .unwrap();
    let shard = dst.join("model.safetensors");
    let qs = qs_tensors(&shard);
    let victim = qs.iter().find(|n| n.contains("experts")).unwrap().clone();
    poke_f32(&shard, &victim, 1, f32::NEG_INFINITY);
    let weight = victim.trim_end_matches(".qs");
    let e = match Container::open(&dst) {
        Ok(_) => panic!("a container with an infinite scale was accepted"),
        Err(e) => e.to_string(),
    };
    assert_eq!(
        e,
        format!(
            "{}: tensor {weight}: scale 1 of {victim} is -inf (scales must be finite; the \
             container is damaged)",
            shard.display()
        )
    );
}

#[test]
fn loader_refuses_non_finite_small_weights_it_copies() {
    // norms, convolutions, the router bias and global scales are read into f32 at load: a NaN or
    // an Inf there is refused at once, naming file, tensor and flat index
    for (tensor, at, v, what) in [
        (
            "model.layers.2.mlp.gate.e_score_correction_bias",
            5,
            f32::NAN,
            "NaN",
        ),
        (
            "model.layers.0.input_layernorm.weight",
            0,
            f32::INFINITY,
            "+inf",
        ),
    ] {
        let dir = copy_fixture("tiny-causal-f32", "nan-small");
        let file = dir.join("model.safetensors");
        poke_f32(&file, tensor, at, v);
        let ck = inkling_wgpu::model::Checkpoint::open(&dir).unwrap();
        let e = match inkling_wgpu::model::Weights::load(&ck) {
            Ok(_) => panic!("{tensor}: loaded"),
            Err(e) => e.to_string(),
        };
        assert_eq!(
            e,
            format!(
                "{}: tensor `{tensor}`: element {at} (flat index) is {what}; non-finite weights \
                 are refused",
                file.display()
            )
        );
    }
}
