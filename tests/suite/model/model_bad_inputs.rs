//! Bad checkpoints give errors that name the file and the tensor or field; nothing panics.
//! Every bad copy is built in a scratch directory; the fixtures are never modified.
use crate::model_common;
use inkling_wgpu::model::{Checkpoint, CpuModel, Weights};
use model_common::*;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::path::Path;

/// Load the checkpoint and return the error message (panics if loading succeeds).
fn load_err(dir: &Path) -> String {
    let ck = match Checkpoint::open(dir) {
        Err(e) => return e.to_string(),
        Ok(ck) => ck,
    };
    match Weights::load(&ck) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("{} loaded although it is broken", dir.display()),
    }
}

/// Rewrite a safetensors file, passing each (name, dtype, shape) through `edit` (None drops it).
fn rewrite(file: &Path, edit: impl Fn(&str, Dtype, Vec<usize>) -> Option<(Dtype, Vec<usize>)>) {
    let bytes = std::fs::read(file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut kept: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, t) in st.tensors() {
        if let Some((dt, shape)) = edit(&name, t.dtype(), t.shape().to_vec()) {
            kept.push((name, dt, shape, t.data().to_vec()));
        }
    }
    let views: Vec<(String, TensorView<'_>)> = kept
        .iter()
        .map(|(n, dt, s, d)| (n.clone(), TensorView::new(*dt, s.clone(), d).unwrap()))
        .collect();
    let out = safetensors::serialize(views, None).unwrap();
    std::fs::write(file, out).unwrap();
}

fn assert_names(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(
            msg.contains(p),
            "error message `{msg}` should mention `{p}`"
        );
    }
}

#[test]
fn truncated_safetensors() {
    let dir = copy_fixture("tiny-causal-f32", "trunc");
    let f = dir.join("model.safetensors");
    let len = std::fs::metadata(&f).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    file.set_len(len - 1000).unwrap();
    drop(file);
    let msg = load_err(&dir);
    assert_names(&msg, &["model.safetensors", "truncated"]);
    // The tensor whose bytes were cut off is named.
    assert!(msg.contains("tensor `"), "{msg}");
    // A file cut inside its header, and garbage.
    std::fs::write(&f, b"\x10\x00\x00").unwrap();
    assert_names(&load_err(&dir), &["model.safetensors", "truncated"]);
    std::fs::write(&f, b"\xff\xff\xff\xff\x00\x00\x00\x00garbage").unwrap();
    assert_names(&load_err(&dir), &["model.safetensors"]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn missing_tensor_single_file_and_shard() {
    let t = "model.layers.2.self_attn.k_proj.weight";
    let dir = copy_fixture("tiny-causal-f32", "missing");
    rewrite(&dir.join("model.safetensors"), |n, d, s| {
        (n != t).then_some((d, s))
    });
    assert_names(&load_err(&dir), &["model.safetensors", t, "missing tensor"]);
    std::fs::remove_dir_all(&dir).ok();

    // Sharded: the index lists it but its shard lacks it.
    let dir = copy_fixture("tiny-causal-bf16-sharded", "missing-sh");
    let t = "model.layers.0.mlp.experts.gate_up_proj";
    rewrite(&dir.join("model-00002-of-00003.safetensors"), |n, d, s| {
        (n != t).then_some((d, s))
    });
    assert_names(&load_err(&dir), &["model-00002-of-00003.safetensors", t]);
    std::fs::remove_dir_all(&dir).ok();

    // Released layout: an interleaved expert tensor.
    let dir = copy_fixture("tiny-mm-bf16", "missing-mm");
    let t = "model.llm.layers.3.mlp.experts.w13_weight";
    for f in [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ] {
        rewrite(&dir.join(f), |n, d, s| (n != t).then_some((d, s)));
    }
    assert_names(&load_err(&dir), &[t, "missing tensor"]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn shape_disagreeing_with_config() {
    let t = "model.layers.1.self_attn.q_proj.weight";
    let dir = copy_fixture("tiny-causal-f32", "shape");
    rewrite(&dir.join("model.safetensors"), |n, d, s| {
        Some((d, if n == t { vec![32, 128] } else { s }))
    });
    let msg = load_err(&dir);
    assert_names(
        &msg,
        &[
            "model.safetensors",
            t,
            "[32, 128]",
            "[64, 64]",
            "config.json",
        ],
    );
    std::fs::remove_dir_all(&dir).ok();

    // Config says otherwise: head_dim changed in config.json.
    let dir = copy_fixture("tiny-causal-f32", "shape-cfg");
    let cfg = std::fs::read_to_string(dir.join("config.json"))
        .unwrap()
        .replace("\"head_dim\": 16", "\"head_dim\": 8");
    std::fs::write(dir.join("config.json"), cfg).unwrap();
    let msg = load_err(&dir);
    assert_names(
        &msg,
        &[
            "model.safetensors",
            "model.layers.1.self_attn",
            "config.json",
        ],
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn unsupported_dtype() {
    let t = "model.layers.0.self_attn.v_proj.weight";
    let dir = copy_fixture("tiny-causal-f32", "dtype");
    rewrite(&dir.join("model.safetensors"), |n, d, s| {
        Some((if n == t { Dtype::I32 } else { d }, s))
    });
    assert_names(&load_err(&dir), &["model.safetensors", t, "I32"]);
    std::fs::remove_dir_all(&dir).ok();
    // A small (norm) tensor too.
    let t = "model.norm.weight";
    let dir = copy_fixture("tiny-causal-f32", "dtype2");
    rewrite(&dir.join("model.safetensors"), |n, d, s| {
        Some((if n == t { Dtype::U32 } else { d }, s))
    });
    assert_names(&load_err(&dir), &["model.safetensors", t, "U32"]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn config_missing_a_field() {
    let dir = copy_fixture("tiny-causal-f32", "cfg");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("hidden_size");
    std::fs::write(dir.join("config.json"), v.to_string()).unwrap();
    assert_names(&load_err(&dir), &["config.json", "hidden_size"]);
    std::fs::remove_dir_all(&dir).ok();

    let dir = copy_fixture("tiny-mm-bf16", "cfg-mm");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    v["text_config"]
        .as_object_mut()
        .unwrap()
        .remove("num_hidden_layers");
    std::fs::write(dir.join("config.json"), v.to_string()).unwrap();
    assert_names(&load_err(&dir), &["config.json", "num_hidden_layers"]);
    std::fs::remove_dir_all(&dir).ok();

    let dir = copy_fixture("tiny-causal-f32", "cfg-none");
    std::fs::remove_file(dir.join("config.json")).unwrap();
    assert_names(&load_err(&dir), &["config.json"]);
    std::fs::remove_dir_all(&dir).ok();

    // JSON that is not an object: config.json and generation_config.json alike, by name
    for (file, text) in [
        ("config.json", "null"),
        ("generation_config.json", "null"),
        ("generation_config.json", "[1,2]"),
    ] {
        let dir = copy_fixture("tiny-causal-f32", "cfg-not-object");
        std::fs::write(dir.join(file), text).unwrap();
        let want = format!("{file}: expected a JSON object, got {text}");
        assert_names(&load_err(&dir), &[&want]);
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[test]
fn missing_shard() {
    let dir = copy_fixture("tiny-causal-bf16-sharded", "shard");
    std::fs::remove_file(dir.join("model-00002-of-00003.safetensors")).unwrap();
    assert_names(
        &load_err(&dir),
        &[
            "model.safetensors.index.json",
            "model-00002-of-00003.safetensors",
            "tensor `",
        ],
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_token_ids_are_errors_not_panics() {
    let ck = Checkpoint::open(&fixture("tiny-causal-f32")).unwrap();
    let w = Weights::load(&ck).unwrap();
    let mut m = CpuModel::new(&w);
    let e = m.forward(&[1, 100_000]).unwrap_err().to_string();
    assert!(e.contains("100000"), "{e}");
    assert!(m.forward(&[]).is_err());
    assert_eq!(
        m.position(),
        0,
        "a refused call does not advance the sequence"
    );
}
