//! Unaligned tensor data in a safetensors file, and F16 checkpoints.
use crate::model_common;
use half::f16;
use inkling_wgpu::model::{Checkpoint, CpuModel, Weights};
use model_common::*;
use std::path::Path;

/// Rewrite a safetensors file by hand: an odd-sized U8 tensor first, so every later tensor starts
/// at an odd offset (the safetensors crate's own writer would keep them aligned). `conv` may
/// re-encode a tensor: (name, dtype, bytes) → (dtype, bytes).
fn rewrite_unaligned(file: &Path, conv: impl Fn(&str, &str, &[u8]) -> (String, Vec<u8>)) {
    let bytes = std::fs::read(file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut header = serde_json::Map::new();
    let mut data: Vec<u8> = vec![0x5a];
    header.insert(
        "aaa.pad".into(),
        serde_json::json!({"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}),
    );
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    for n in names {
        let t = st.tensor(&n).unwrap();
        let (dt, b) = conv(&n, &format!("{:?}", t.dtype()), t.data());
        let start = data.len();
        data.extend_from_slice(&b);
        header.insert(n.clone(), serde_json::json!({"dtype": dt, "shape": t.shape(), "data_offsets": [start, data.len()]}));
    }
    let mut h = serde_json::Value::Object(header).to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    std::fs::write(file, out).unwrap();
}

fn logits(dir: &Path, seq: &[u32]) -> Vec<Vec<f32>> {
    let ck = Checkpoint::open(dir).unwrap();
    let w = Weights::load(&ck).unwrap();
    CpuModel::new(&w).forward_all(seq).unwrap()
}

#[test]
fn unaligned_tensor_data_loads_bit_identically() {
    let r = reference("tiny-causal-f32");
    let seq = r.cases[0].prompt_ids.clone();
    let want = logits(&fixture("tiny-causal-f32"), &seq);
    let dir = copy_fixture("tiny-causal-f32", "unaligned");
    rewrite_unaligned(&dir.join("model.safetensors"), |_, dt, b| {
        (dt.to_string(), b.to_vec())
    });
    assert_eq!(logits(&dir, &seq), want);
    std::fs::remove_dir_all(&dir).ok();

    // BF16 shards too.
    let name = "tiny-mm-bf16";
    let seq = reference(name).cases[1].prompt_ids.clone();
    let want = logits(&fixture(name), &seq);
    let dir = copy_fixture(name, "unaligned-bf16");
    for f in [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ] {
        rewrite_unaligned(&dir.join(f), |_, dt, b| (dt.to_string(), b.to_vec()));
    }
    assert_eq!(logits(&dir, &seq), want);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn f16_checkpoint_matches_f32_closely() {
    let r = reference("tiny-causal-f32");
    let seq: Vec<u32> = r.cases[1].prompt_ids.clone();
    let want = logits(&fixture("tiny-causal-f32"), &seq);
    let dir = copy_fixture("tiny-causal-f32", "f16");
    rewrite_unaligned(&dir.join("model.safetensors"), |_, dt, b| {
        assert_eq!(dt, "F32");
        let out: Vec<u8> = b
            .chunks_exact(4)
            .flat_map(|c| {
                f16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .to_bits()
                    .to_le_bytes()
            })
            .collect();
        ("F16".to_string(), out)
    });
    let got = logits(&dir, &seq);
    for (g, w) in got.iter().zip(&want) {
        let e = rel_err(g, w);
        assert!(e < 2e-2, "F16 copy drifts {e:.3e} from F32");
        assert!(e > 0.0, "F16 rounding should change something");
    }
    std::fs::remove_dir_all(&dir).ok();
}
