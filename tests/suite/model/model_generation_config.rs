//! generation_config.json's `repetition_penalty` and `min_p`, read as transformers 5.24.0 reads
//! them: `generate` on a copy of tiny-causal-f32 whose generation_config.json sets
//! `repetition_penalty` reproduces transformers' greedy ids (tools/penalty_reference.py: the
//! penalty over the whole sequence, prompt included) on the CPU and the GPU; `--repeat-last-n 64`
//! gives the last-64 window's ids instead, and `--repeat-penalty 1` the unpenalised ones; values out
//! of transformers' range are refused naming the file and field; `max_length` bounds the run when
//! `max_new_tokens` is not set; fields transformers acts on that the engine does not implement are
//! warned about.
use crate::model_common::{copy_fixture, fixture, ids};
use std::path::Path;
use std::process::Command;

struct Case {
    prompt: String,
    penalty: f64,
    generated: Vec<u32>,
    unpenalized: Vec<u32>,
    last64: Option<Vec<u32>>,
}

fn cases() -> Vec<Case> {
    let path = fixture("tiny-causal-f32").join("penalty_reference.json");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(v["transformers_version"], "5.24.0");
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            prompt: ids(&c["prompt_ids"])
                .iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(","),
            penalty: c["repetition_penalty"].as_f64().unwrap(),
            generated: ids(&c["generated_ids"]),
            unpenalized: ids(&c["unpenalized_ids"]),
            last64: c.get("last64_ids").map(ids),
        })
        .collect()
}

/// A copy of tiny-causal-f32 whose generation_config.json also holds `extra`'s fields.
fn with_generation_config(tag: &str, extra: serde_json::Value) -> std::path::PathBuf {
    let dir = copy_fixture("tiny-causal-f32", tag);
    let file = dir.join("generation_config.json");
    let mut g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    for (k, v) in extra.as_object().unwrap() {
        g[k] = v.clone();
    }
    std::fs::write(&file, serde_json::to_string_pretty(&g).unwrap()).unwrap();
    dir
}

fn generate(dir: &Path, prompt: &str, device: &str, flags: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
        .args(["generate", "--model", dir.to_str().unwrap(), "--prompt-ids"])
        .args([prompt, "--device", device, "--json"])
        .args(flags)
        .output()
        .unwrap()
}

fn generated(dir: &Path, prompt: &str, device: &str, flags: &[&str]) -> Vec<u32> {
    let o = generate(dir, prompt, device, flags);
    assert!(
        o.status.success(),
        "{device} {flags:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    ids(&v["generated_ids"])
}

/// `generate` on `dir` with `prompt` exits 1 with an error naming `DIR/generation_config.json: `
/// and then `says`.
fn refused(dir: &Path, prompt: &str, says: &str) {
    let o = generate(dir, prompt, "cpu", &[]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{e}");
    let want = format!("{}: {says}", dir.join("generation_config.json").display());
    assert!(e.contains(&want), "want {want:?} in {e}");
}

#[test]
fn repetition_penalty_of_generation_config_reproduces_transformers() {
    let cases = cases();
    // the reference can tell: the penalty changes most runs, and on the long prompt the whole
    // sequence differs from the last 64 ids
    assert!(
        cases
            .iter()
            .filter(|c| c.generated != c.unpenalized)
            .count()
            >= 4
    );
    let long: Vec<&Case> = cases.iter().filter(|c| c.last64.is_some()).collect();
    assert_eq!(long.len(), 2);
    assert!(long.iter().all(|c| c.last64.as_ref() != Some(&c.generated)));
    for penalty in [1.3, 0.8] {
        let dir = with_generation_config(
            "gencfg-penalty",
            serde_json::json!({ "repetition_penalty": penalty, "max_new_tokens": 16 }),
        );
        for c in cases.iter().filter(|c| c.penalty == penalty) {
            for device in ["cpu", "gpu"] {
                assert_eq!(
                    generated(&dir, &c.prompt, device, &[]),
                    c.generated,
                    "{device}, penalty {penalty}, prompt {}",
                    c.prompt
                );
            }
            if let Some(last64) = &c.last64 {
                assert_eq!(
                    &generated(&dir, &c.prompt, "cpu", &["--repeat-last-n", "64"]),
                    last64,
                    "--repeat-last-n 64 narrows the file's penalty to llama.cpp's window"
                );
            }
            assert_eq!(
                generated(&dir, &c.prompt, "cpu", &["--repeat-penalty", "1"]),
                c.unpenalized,
                "--repeat-penalty 1 turns the file's penalty off"
            );
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[test]
fn generation_config_penalties_out_of_range_name_the_file() {
    for (extra, field, range) in [
        (
            serde_json::json!({ "repetition_penalty": 0.0 }),
            "repetition_penalty",
            "must be a finite number > 0",
        ),
        (
            serde_json::json!({ "do_sample": true, "min_p": 1.5 }),
            "min_p",
            "must be in [0, 1]",
        ),
    ] {
        let dir = with_generation_config("gencfg-bad", extra);
        refused(&dir, "5,6,7", &format!("{field} {range}"));
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[test]
fn max_length_bounds_the_run_without_max_new_tokens() {
    let dir = with_generation_config(
        "gencfg-max-length",
        serde_json::json!({ "max_new_tokens": null, "max_length": 5 }),
    );
    // three prompt ids leave two new ones, as transformers' max_length = prompt + new
    assert_eq!(generated(&dir, "5,6,7", "cpu", &[]).len(), 2);
    assert_eq!(
        generated(&dir, "5,6,7", "cpu", &["--max-tokens", "4"]).len(),
        4
    );
    refused(
        &dir,
        "5,6,7,8,9",
        "max_length 5 (prompt and new tokens) leaves no room after the prompt's 5 tokens",
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn sampling_at_temperature_0_and_fields_not_implemented_are_named() {
    let dir = with_generation_config(
        "gencfg-temperature-0",
        serde_json::json!({ "do_sample": true, "temperature": 0.0 }),
    );
    refused(
        &dir,
        "5,6",
        "temperature must be > 0 when do_sample is true",
    );
    // --temperature 0 asks for greedy decoding: taken
    assert!(generate(&dir, "5,6", "cpu", &["--temperature", "0"])
        .status
        .success());
    std::fs::remove_dir_all(&dir).ok();

    let dir = with_generation_config(
        "gencfg-ignored",
        serde_json::json!({ "num_beams": 4, "no_repeat_ngram_size": 0, "typical_p": null,
            "stop_strings": ["The"], "max_time": 5.0, "num_return_sequences": 1 }),
    );
    let o = generate(&dir, "5,6", "cpu", &[]);
    assert!(o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    let warnings: Vec<&str> = e.lines().filter(|l| l.starts_with("warning:")).collect();
    let f = dir.join("generation_config.json");
    let warned = |kv: &str| {
        format!(
            "warning: {} sets {kv}, which this engine does not implement; it is ignored",
            f.display()
        )
    };
    assert_eq!(
        warnings,
        [
            warned("num_beams = 4"),
            warned("stop_strings = [\"The\"]"),
            warned("max_time = 5.0")
        ],
        "the values that change nothing are not warned about"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A length written as a float (`8.0`, as Python's json may hold it) is the whole number it is, as
/// transformers computes with it; a fractional one is refused naming the field.
#[test]
fn lengths_in_float_form_are_whole_numbers() {
    use inkling_wgpu::model::GenerationConfig;
    let dir = with_generation_config("gencfg-float", serde_json::json!({ "max_new_tokens": 8.0 }));
    let g = GenerationConfig::from_dir(&dir).unwrap().unwrap();
    assert_eq!(g.max_new_tokens, Some(8));
    std::fs::remove_dir_all(&dir).ok();
    let dir = with_generation_config("gencfg-frac", serde_json::json!({ "max_new_tokens": 8.5 }));
    let e = GenerationConfig::from_dir(&dir).err().unwrap().to_string();
    assert!(
        e.ends_with(
            "generation_config.json: field `max_new_tokens`: expected a whole number ≥ 0, got 8.5"
        ),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
