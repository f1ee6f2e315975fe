//! Shared helpers of the model tests (fixture paths, reference.json, reference logits).

use std::path::PathBuf;

pub const FIXTURES: [&str; 3] = [
    "tiny-causal-f32",
    "tiny-mm-bf16",
    "tiny-causal-bf16-sharded",
];

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

pub struct Case {
    pub prompt_ids: Vec<u32>,
    pub generated_ids: Vec<u32>,
    pub finish_reason: String,
    pub max_new_tokens: usize,
    pub logits_key: String,
}

pub struct Reference {
    pub eos: Vec<u32>,
    pub logits_width: usize,
    pub cases: Vec<Case>,
    pub tokenizer_roundtrip: Vec<(String, Vec<u32>, String)>,
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub fn reference(name: &str) -> Reference {
    let text = std::fs::read_to_string(fixture(name).join("reference.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    Reference {
        eos: ids(&v["eos_token_id"]),
        logits_width: v["logits_width"].as_u64().unwrap() as usize,
        cases: v["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| Case {
                prompt_ids: ids(&c["prompt_ids"]),
                generated_ids: ids(&c["generated_ids"]),
                finish_reason: c["finish_reason"].as_str().unwrap().to_string(),
                max_new_tokens: c["max_new_tokens"].as_u64().unwrap() as usize,
                // fixtures without reference.safetensors (tiny-router-extremes) have no key
                logits_key: c["logits_key"].as_str().unwrap_or_default().to_string(),
            })
            .collect(),
        tokenizer_roundtrip: v["tokenizer_roundtrip"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|r| {
                        (
                            r["text"].as_str().unwrap().to_string(),
                            ids(&r["ids"]),
                            r["decoded"].as_str().unwrap().to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// Teacher-forced reference logits `[rows][width]` of one case.
pub fn reference_logits(name: &str, key: &str) -> Vec<Vec<f32>> {
    let bytes = std::fs::read(fixture(name).join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(key).unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::F32);
    let (rows, width) = (t.shape()[0], t.shape()[1]);
    let vals: Vec<f32> = t
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    (0..rows)
        .map(|r| vals[r * width..(r + 1) * width].to_vec())
        .collect()
}

/// ‖a − b‖ / ‖b‖
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// Unique scratch directory under Cargo's temporary directory for tests (target/tmp, so test runs
/// leave nothing in the system temp dir).
pub fn scratch(tag: &str) -> PathBuf {
    scratch_in(&PathBuf::from(env!("CARGO_TARGET_TMPDIR")), tag)
}

/// Unique scratch directory under the system temp dir, outside the checkout (for tests of what a
/// binary does away from it); the test removes it.
pub fn scratch_outside(tag: &str) -> PathBuf {
    scratch_in(&std::env::temp_dir(), tag)
}

fn scratch_in(root: &std::path::Path, tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let p = root.join(format!(
        "inkling-test-{tag}-{}-{nanos}-{n}",
        std::process::id()
    ));
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// Copy every file of a fixture into a fresh scratch dir.
pub fn copy_fixture(name: &str, tag: &str) -> PathBuf {
    let dst = scratch(tag);
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let e = e.unwrap();
        // a usage file left by a streamed run on the fixture itself is not part of the fixture
        if e.file_name() == "inkling-wgpu.usage.json" {
            continue;
        }
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    dst
}

/// Greedy decoding parameters (temperature 0) stopping at `eos` or after `max` tokens.
pub fn greedy(eos: Vec<u32>, max: usize) -> inkling_wgpu::model::generate::GenerateParams {
    inkling_wgpu::model::generate::GenerateParams {
        max_new_tokens: max,
        sampling: inkling_wgpu::model::sampling::SamplingParams::default(),
        seed: 0,
        eos_ids: eos,
    }
}

/// `generate` case `ci` of fixture `name` greedily on `m` and check transformers' continuation,
/// finish reason and the ids handed to the printer (never the EOS).
pub fn check_greedy_case(
    m: &mut dyn inkling_wgpu::model::Forward,
    name: &str,
    ci: usize,
    c: &Case,
    eos: &[u32],
) {
    use inkling_wgpu::model::generate::{generate, FinishReason};
    let mut streamed = Vec::new();
    let out = generate(
        m,
        &c.prompt_ids,
        &greedy(eos.to_vec(), c.max_new_tokens),
        &mut |id| {
            streamed.push(id);
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(
        out.generated_ids, c.generated_ids,
        "{name} case {ci}: greedy continuation"
    );
    let want = if c.finish_reason == "eos" {
        FinishReason::Eos
    } else {
        FinishReason::Length
    };
    assert_eq!(out.finish_reason, want, "{name} case {ci}: finish reason");
    // EOS is never handed to the printer.
    let printed = if want == FinishReason::Eos {
        &c.generated_ids[..c.generated_ids.len() - 1]
    } else {
        &c.generated_ids[..]
    };
    assert_eq!(streamed, printed, "{name} case {ci}: streamed ids");
}

/// Overwrite element `index` (flat, row-major) of F32 tensor `tensor` in safetensors file `file`
/// with `value`, in place (use it on a scratch copy).
pub fn poke_f32(file: &std::path::Path, tensor: &str, index: usize, value: f32) {
    let mut bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let h: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let t = &h[tensor];
    assert_eq!(t["dtype"], "F32", "{tensor}: poke_f32 needs an F32 tensor");
    let start = t["data_offsets"][0].as_u64().unwrap() as usize + 8 + n + 4 * index;
    bytes[start..start + 4].copy_from_slice(&value.to_le_bytes());
    std::fs::write(file, bytes).unwrap();
}

/// (temperature, top-k, top-p) settings that each differ from the first in one field, for the
/// tests that sampling flags and request fields reach the sampler (`generate` and `serve`).
pub const SAMPLING_SETTINGS: [(f32, usize, f32); 4] =
    [(1.5, 0, 1.0), (0.6, 0, 1.0), (1.5, 3, 1.0), (1.5, 0, 0.5)];
