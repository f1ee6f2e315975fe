//! Hostile or damaged files around the weights: shard names in the index that leave the model
//! directory (refused by the loader and by `info` with the same text; symbolic links inside the
//! directory, as the Hugging Face cache lays shards out, keep working), and `info --verify`.
//! Every bad copy is built in a scratch directory; the fixtures are never modified.
use crate::model_common::*;
use inkling_wgpu::container::Container;
use inkling_wgpu::model::{Checkpoint, CpuModel, Weights};
use std::path::Path;

const SHARDED: &str = "tiny-causal-bf16-sharded";
const FIRST: &str = "model-00001-of-00003.safetensors";

/// Rewrite the index of `dir`, naming `shard` wherever it named the first shard.
fn rename_first_shard(dir: &Path, shard: &str) {
    let p = dir.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&p).unwrap();
    let json_name = serde_json::to_string(shard).unwrap();
    std::fs::write(&p, text.replace(&format!("\"{FIRST}\""), &json_name)).unwrap();
}

/// The first tensor (by name) that the index puts in the first shard.
fn first_tensor_of_first_shard() -> String {
    let text =
        std::fs::read_to_string(fixture(SHARDED).join("model.safetensors.index.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut names: Vec<&String> = v["weight_map"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, f)| f.as_str() == Some(FIRST))
        .map(|(k, _)| k)
        .collect();
    names.sort();
    names[0].clone()
}

fn cli(args: &[&str], model: &Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
        .args(args)
        .arg("--model")
        .arg(model)
        .output()
        .unwrap()
}

#[test]
fn index_shard_names_that_leave_the_model_directory_are_refused() {
    let tensor = first_tensor_of_first_shard();
    for bad in [
        "../elsewhere/x.safetensors",
        "/tmp/x.safetensors",
        "sub/x.safetensors",
        "sub\\x.safetensors",
        "..",
        ".",
        "",
    ] {
        let root = scratch("shard-escape");
        let dir = root.join("model");
        std::fs::create_dir_all(&dir).unwrap();
        for e in std::fs::read_dir(fixture(SHARDED)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
        }
        // a real shard where the escaping name points: it must not be opened
        std::fs::create_dir_all(root.join("elsewhere")).unwrap();
        std::fs::copy(dir.join(FIRST), root.join("elsewhere/x.safetensors")).unwrap();
        rename_first_shard(&dir, bad);
        let index = dir.join("model.safetensors.index.json");
        let want = format!(
            "{}: field `weight_map.{tensor}`: shard name {bad:?} is not a plain file name in the \
             model directory (no path separators, no `.` or `..`, not absolute)",
            index.display()
        );
        let got = match Checkpoint::open(&dir) {
            Ok(_) => panic!("{bad:?}: loaded"),
            Err(e) => e.to_string(),
        };
        assert_eq!(got, want, "loader, {bad:?}");
        let got = match Container::open(&dir) {
            Ok(_) => panic!("{bad:?}: opened as a container"),
            Err(e) => e.to_string(),
        };
        assert_eq!(got, want, "container reader, {bad:?}");
        let out = cli(&["info"], &dir);
        assert!(!out.status.success(), "info accepted {bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&want), "info, {bad:?}: {err}");
    }
}

#[test]
fn shards_that_are_symbolic_links_into_a_blob_store_load() {
    // the Hugging Face cache: snapshots/REV/NAME -> ../../blobs/HASH
    let root = scratch("hf-cache");
    let blobs = root.join("blobs");
    let snap = root.join("snapshots/abc123");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::create_dir_all(&snap).unwrap();
    for (i, e) in std::fs::read_dir(fixture(SHARDED)).unwrap().enumerate() {
        let e = e.unwrap();
        let blob = blobs.join(format!("{i:040x}"));
        std::fs::copy(e.path(), &blob).unwrap();
        std::os::unix::fs::symlink(
            Path::new("../../blobs").join(blob.file_name().unwrap()),
            snap.join(e.file_name()),
        )
        .unwrap();
    }
    let ck = Checkpoint::open(&snap).unwrap();
    let w = Weights::load(&ck).unwrap();
    let r = reference(SHARDED);
    let mut m = CpuModel::new(&w);
    check_greedy_case(&mut m, SHARDED, 0, &r.cases[0], &r.eos);
    assert!(Container::open(&snap).is_ok());
    let out = cli(&["info", "--verify"], &snap);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn info_verify_reads_every_tensor_and_names_each_damaged_one() {
    let clean = cli(&["info", "--summary", "--verify"], &fixture("tiny-causal-f32"));
    assert!(clean.status.success());
    let text = String::from_utf8(clean.stdout).unwrap();
    assert!(text.ends_with("verify: 1.10 MiB read, no NaN or Inf\n"), "{text}");
    let dir = copy_fixture("tiny-causal-f32", "verify");
    let file = dir.join("model.safetensors");
    poke_f32(&file, "model.layers.3.self_attn.q_proj.weight", 100, f32::NAN);
    poke_f32(&file, "model.norm.weight", 63, f32::NEG_INFINITY);
    let out = cli(&["info", "--summary", "--verify"], &dir);
    assert!(!out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let f = file.display();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("flat index"))
        .collect();
    let mut want = vec![
        format!("{f}: tensor `model.layers.3.self_attn.q_proj.weight`: element 100 (flat index) is NaN"),
        format!("{f}: tensor `model.norm.weight`: element 63 (flat index) is -inf"),
    ];
    let mut got: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{}: 2 tensor(s) hold NaN or Inf (listed above); the model is damaged",
            dir.display()
        )),
        "{err}"
    );
}
