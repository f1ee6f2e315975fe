//! `inkling-wgpu generate --device gpu --json --temperature 0` reproduces transformers' tokens on
//! both tensor-name layouts. Needs a GPU adapter (lavapipe on CI); fails without one.
use crate::model_common;
use model_common::*;
use std::process::Command;

#[test]
fn cli_gpu_json_reproduces_transformers_on_both_layouts() {
    for name in FIXTURES {
        let r = reference(name);
        let dir = fixture(name);
        for (ci, c) in r.cases.iter().enumerate() {
            let arg = c
                .prompt_ids
                .iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(",");
            let out = Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
                .args([
                    "generate",
                    "--model",
                    dir.to_str().unwrap(),
                    "--prompt-ids",
                    &arg,
                    "--temperature",
                    "0",
                    "--device",
                    "gpu",
                    "--json",
                ])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{name} case {ci}: exit {:?}, stderr: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            let stdout = String::from_utf8(out.stdout).unwrap();
            let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
            assert_eq!(ids(&v["prompt_ids"]), c.prompt_ids);
            assert_eq!(
                ids(&v["generated_ids"]),
                c.generated_ids,
                "{name} case {ci}: generated_ids"
            );
            assert_eq!(v["finish_reason"], c.finish_reason.as_str());
            let s = &v["stats"];
            assert_eq!(s["backend"], "gpu");
            let adapter = s["adapter"].as_str().unwrap();
            assert!(
                !adapter.is_empty() && adapter != "cpu",
                "adapter: {adapter}"
            );
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains("gpu (") && stderr.contains(adapter),
                "stats line names the adapter: {stderr}"
            );
        }
    }
}
