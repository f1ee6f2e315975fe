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
    let clean = cli(
        &["info", "--summary", "--verify"],
        &fixture("tiny-causal-f32"),
    );
    assert!(clean.status.success());
    let text = String::from_utf8(clean.stdout).unwrap();
    assert!(
        text.ends_with(
            "verify: 1.10 MiB read, no NaN or Inf\n\
             verify: config.json, generation_config.json, tokenizer.json and every tensor's name and shape agree\n"
        ),
        "{text}"
    );
    let dir = copy_fixture("tiny-causal-f32", "verify");
    let file = dir.join("model.safetensors");
    poke_f32(
        &file,
        "model.layers.3.self_attn.q_proj.weight",
        100,
        f32::NAN,
    );
    poke_f32(&file, "model.norm.weight", 63, f32::NEG_INFINITY);
    let out = cli(&["info", "--summary", "--verify"], &dir);
    assert!(!out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let f = file.display();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("flat index")).collect();
    let mut want = vec![
        format!(
            "{f}: tensor `model.layers.3.self_attn.q_proj.weight`: element 100 (flat index) is NaN"
        ),
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

/// `info --verify` opens the model as `generate` does (config.json, generation_config.json and its
/// sampling values, each tensor's shape against the config), so what `generate` would refuse is
/// named there rather than at the first `generate`.
#[test]
fn info_verify_refuses_an_invalid_config_naming_the_field() {
    for (name, field, value, says) in [
        (
            "config.json",
            "num_hidden_layers",
            serde_json::json!(-3),
            "field `num_hidden_layers`",
        ),
        (
            "config.json",
            "hidden_size",
            serde_json::json!(128),
            "but config.json implies",
        ),
        (
            "generation_config.json",
            "do_sample",
            serde_json::json!("yes"),
            "field `do_sample`",
        ),
        (
            "generation_config.json",
            "repetition_penalty",
            serde_json::json!(0),
            "repetition_penalty must be a finite number > 0",
        ),
        (
            "generation_config.json",
            "max_new_tokens",
            serde_json::json!(0),
            "max_new_tokens must be at least 1",
        ),
    ] {
        let dir = copy_fixture("tiny-causal-f32", "verify-config");
        edit_json(&dir, name, |v| v[field] = value);
        let out = cli(&["info", "--summary", "--verify"], &dir);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        // a shape is named in the weights' file, a field in its JSON file
        let file = if says.contains("implies") {
            dir.join("model.safetensors")
        } else {
            dir.join(name)
        };
        let want = format!("{}: ", file.display());
        assert!(
            err.contains(&want) && err.contains(says),
            "want {want:?} and {says:?} in {err}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
    // tokenizer.json as generate loads it, and the EOS ids generate would warn about
    let dir = copy_fixture("tiny-causal-f32", "verify-tokenizer");
    std::fs::write(dir.join("tokenizer.json"), "{\"model\": ").unwrap();
    let out = cli(&["info", "--summary", "--verify"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&dir.join("tokenizer.json").display().to_string()),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
    let dir = copy_fixture("tiny-causal-f32", "verify-eos");
    edit_json(&dir, "generation_config.json", |v| {
        v["eos_token_id"] = serde_json::json!([2, 99_999])
    });
    let out = cli(&["info", "--summary", "--verify"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("warning: EOS id 99999 is past the model's"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
    // a max_length that even a one-token prompt fills (with no max_new_tokens to bound instead)
    let dir = copy_fixture("tiny-causal-f32", "verify-max-length");
    edit_json(&dir, "generation_config.json", |v| {
        v.as_object_mut().unwrap().remove("max_new_tokens");
        v["max_length"] = serde_json::json!(1);
    });
    let out = cli(&["info", "--summary", "--verify"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("generation_config.json: max_length 1 (prompt and new tokens) leaves no room after a one-token prompt; generate's --max-tokens N overrides it"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Edit the JSON file `name` of `dir` as a value.
fn edit_json(dir: &Path, name: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join(name);
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

fn open_err(dir: &Path) -> String {
    match Checkpoint::open(dir) {
        Ok(_) => panic!("{} opened", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn integers_in_json_are_range_checked_never_wrapped() {
    let big = 4_294_967_307u64; // 2^32 + 11: `as u32` would make it 11
    let range = "is out of range (token ids are below 2^32 = 4294967296)";
    let cases: Vec<(&str, serde_json::Value, &str, String)> = vec![
        (
            "config.json",
            big.into(),
            "eos_token_id",
            format!("token id {big} {range}"),
        ),
        (
            "generation_config.json",
            serde_json::json!([2, big]),
            "eos_token_id",
            format!("token id {big} {range}"),
        ),
        (
            "config.json",
            big.into(),
            "pad_token_id",
            format!("token id {big} {range}"),
        ),
        (
            "config.json",
            (-1).into(),
            "bos_token_id",
            "bad token id -1 (expected a non-negative integer)".into(),
        ),
        (
            "config.json",
            1e300.into(),
            "route_scale",
            "expected a number within the f32 range, got 1e+300".into(),
        ),
        (
            "generation_config.json",
            1e39.into(),
            "temperature",
            "expected a number within the f32 range, got 1e+39".into(),
        ),
        (
            "generation_config.json",
            (-3).into(),
            "max_new_tokens",
            "expected a whole number ≥ 0, got -3".into(),
        ),
        (
            "config.json",
            big.into(),
            "hidden_size",
            format!("{big} is past the engine's limit of 1048576"),
        ),
    ];
    for (file, value, field, msg) in cases {
        let dir = copy_fixture("tiny-causal-f32", "json-int");
        edit_json(&dir, file, |v| v[field] = value.clone());
        assert_eq!(
            open_err(&dir),
            format!("{}: field `{field}`: {msg}", dir.join(file).display()),
            "{file} {field} = {value}"
        );
    }
}

#[test]
fn an_eos_id_past_the_logits_is_ignored_with_a_warning() {
    let dir = copy_fixture("tiny-causal-f32", "eos-past-vocab");
    edit_json(&dir, "generation_config.json", |v| {
        v["eos_token_id"] = serde_json::json!([2, 221, 100_000])
    });
    let r = reference("tiny-causal-f32");
    let c = &r.cases[0];
    let ids: Vec<String> = c.prompt_ids.iter().map(|i| i.to_string()).collect();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
        .args(["generate", "--device", "cpu", "--json", "--prompt-ids"])
        .arg(ids.join(","))
        .arg("--model")
        .arg(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(
            "warning: EOS id 100000 is past the model's 400 logits and can never be generated; \
             ignored (as transformers does)"
        ),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        ids_of(&v["generated_ids"]),
        c.generated_ids,
        "the other EOS ids still stop"
    );
    assert_eq!(v["finish_reason"], "eos");
}

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn a_config_with_fewer_layers_than_the_weights_warns_that_tensors_are_unused() {
    let dir = copy_fixture("tiny-causal-f32", "fewer-layers");
    edit_json(&dir, "config.json", |v| {
        v["num_hidden_layers"] = 3.into();
        for k in ["layer_types", "mlp_layer_types"] {
            v[k].as_array_mut().unwrap().truncate(3);
        }
    });
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
        .args([
            "generate",
            "--device",
            "cpu",
            "--prompt-ids",
            "5,6,7",
            "--max-tokens",
            "2",
            "--model",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "warning: {}: num_hidden_layers is 3, but the weights hold 4 layers; the tensors of \
             layers 3..=3 are unused",
            dir.join("config.json").display()
        )),
        "{err}"
    );
}

/// Rewrite the header of safetensors file `file` through `edit` (on its JSON text), keeping the
/// data bytes.
fn edit_header(file: &Path, edit: impl FnOnce(&serde_json::Value) -> String) {
    let b = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let h: serde_json::Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    let text = edit(&h);
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(&b[8 + n..]);
    std::fs::write(file, out).unwrap();
}

#[test]
fn header_errors_name_the_file_and_every_tensor_involved() {
    let norm = "model.norm.weight";
    type Edit = Box<dyn Fn(&serde_json::Value) -> String>;
    let cases: Vec<(Edit, String)> = vec![
        (
            // a duplicated name (serde_json maps would keep the last entry silently)
            Box::new(move |h| {
                let text = serde_json::to_string(h).unwrap();
                let entry = serde_json::to_string(&h["lm_head.weight"]).unwrap();
                text.replacen(
                    &format!("\"{norm}\":"),
                    &format!("\"{norm}\":{entry},\"{norm}\":"),
                    1,
                )
            }),
            format!("tensor `{norm}` is listed twice in the header"),
        ),
        (
            Box::new(move |h| {
                let mut h = h.clone();
                h[norm]["shape"] = serde_json::json!([65]);
                serde_json::to_string(&h).unwrap()
            }),
            {
                let h = header("tiny-causal-f32");
                let o = &h[norm]["data_offsets"];
                format!(
                    "tensor `{norm}`: shape [65] of F32 needs 260 bytes, but its data_offsets [{}, {}] hold 256",
                    o[0], o[1]
                )
            },
        ),
        (
            Box::new(move |h| {
                let mut h = h.clone();
                let s = h["lm_head.weight"]["data_offsets"][0].as_u64().unwrap();
                h[norm]["data_offsets"] = serde_json::json!([s + 256, s + 512]);
                serde_json::to_string(&h).unwrap()
            }),
            {
                let h = header("tiny-causal-f32");
                let o = &h["lm_head.weight"]["data_offsets"];
                let s = o[0].as_u64().unwrap();
                format!(
                    "tensors `lm_head.weight` (bytes [{s}, {})) and `{norm}` (bytes [{}, {})) overlap",
                    o[1],
                    s + 256,
                    s + 512
                )
            },
        ),
    ];
    for (edit, msg) in cases {
        let dir = copy_fixture("tiny-causal-f32", "header");
        let file = dir.join("model.safetensors");
        edit_header(&file, edit);
        let f = file.display();
        assert_eq!(
            open_err(&dir),
            format!("{f}: truncated or corrupt safetensors file: {msg}")
        );
        let got = match Container::open(&dir) {
            Ok(_) => panic!("container reader accepted: {msg}"),
            Err(e) => e.to_string(),
        };
        assert_eq!(got, format!("{f}: not a valid safetensors file: {msg}"));
    }
}

/// The parsed safetensors header of a fixture's `model.safetensors`.
fn header(name: &str) -> serde_json::Value {
    let b = std::fs::read(fixture(name).join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    serde_json::from_slice(&b[8..8 + n]).unwrap()
}
