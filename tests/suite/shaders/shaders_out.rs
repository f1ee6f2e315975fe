//! `shaders --out DIR` into an earlier output replaces it completely (the folder then holds
//! exactly what its index.json lists), and refuses a folder that holds anything it did not write,
//! deleting nothing.
use inkling_wgpu::cli::shaders::{write, INDEX};
use inkling_wgpu::gpu::limits::LimitProfile;
use std::collections::BTreeSet;
use std::path::Path;

fn files(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

fn indexed(dir: &Path) -> BTreeSet<String> {
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(INDEX)).unwrap()).unwrap();
    let mut set: BTreeSet<String> = doc["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["file"].as_str().unwrap().to_string())
        .collect();
    set.insert(INDEX.to_string());
    set
}

#[test]
fn shaders_out_replaces_its_earlier_output_and_keeps_foreign_files() {
    let dir = crate::model_common::scratch("shaders-out");
    let full = write(&dir, None).unwrap().len();
    assert_eq!(files(&dir), indexed(&dir));
    let webgpu = write(&dir, Some(LimitProfile::WebGpu)).unwrap().len();
    assert!(
        webgpu < full,
        "webgpu {webgpu} vs full {full}: no stale file to catch"
    );
    assert_eq!(files(&dir), indexed(&dir));
    assert_eq!(files(&dir).len(), webgpu + 1);
    // a user's file: refused, named, and nothing is deleted
    std::fs::write(dir.join("notes.txt"), "mine").unwrap();
    let before = files(&dir);
    let e = format!("{:#}", write(&dir, None).unwrap_err());
    assert!(e.contains("notes.txt"), "{e}");
    assert_eq!(files(&dir), before);
    assert_eq!(
        std::fs::read_to_string(dir.join("notes.txt")).unwrap(),
        "mine"
    );
    // a folder without an index of this command: refused, nothing deleted
    let other = crate::model_common::scratch("shaders-foreign");
    std::fs::write(other.join("a.wgsl"), "// mine").unwrap();
    let e = format!("{:#}", write(&other, None).unwrap_err());
    assert!(e.contains(INDEX), "{e}");
    assert_eq!(files(&other), BTreeSet::from(["a.wgsl".to_string()]));
}

/// `inkling-wgpu shaders --out DIR` (all kernels, and `--model` on a fixture): the folder holds
/// exactly index.json and the files it lists; each listed file is `file_name(key)`, starts with
/// the comment naming its key and entry point, defines that entry point as a compute shader, and
/// declares every binding the index lists with the listed address space; `subgroups` is true exactly for the
/// modules whose code (comments aside) uses subgroup builtins; the count printed on stdout (total and GEMV) is the index's.
#[test]
fn shaders_cli_index_matches_the_files_written() {
    let fx = crate::model_common::fixture("tiny-mm-bf16");
    let cases: [&[&str]; 2] = [&[], &["--model", fx.to_str().unwrap()]];
    let mut counts = Vec::new();
    for extra in cases {
        let dir = crate::model_common::scratch("shaders-cli");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
            .arg("shaders")
            .arg("--out")
            .arg(&dir)
            .args(extra)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(files(&dir), indexed(&dir), "{extra:?}");
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(INDEX)).unwrap()).unwrap();
        let kernels = doc["kernels"].as_array().unwrap();
        assert!(!kernels.is_empty());
        let mut gemv = 0;
        for k in kernels {
            let key = k["key"].as_str().unwrap();
            let file = k["file"].as_str().unwrap();
            let entry = k["entry_point"].as_str().unwrap();
            assert_eq!(file, inkling_wgpu::cli::shaders::file_name(key));
            let text = std::fs::read_to_string(dir.join(file)).unwrap();
            let first = text.lines().next().unwrap();
            assert_eq!(
                first,
                format!("// inkling-wgpu pipeline {key} (entry point {entry})")
            );
            assert!(text.contains("@compute"), "{file}");
            assert!(
                text.contains(&format!("fn {entry}(")),
                "{file}: no fn {entry}"
            );
            // binding number -> the address space of its declaration, as the index spells it
            let declared: std::collections::HashMap<u64, String> = text
                .lines()
                .filter_map(|l| {
                    let rest = &l[l.find("@binding(")? + "@binding(".len()..];
                    let b: u64 = rest[..rest.find(')')?].trim().parse().ok()?;
                    let space = &rest[rest.find("var<")? + 4..];
                    Some((b, space[..space.find('>')?].to_string()))
                })
                .collect();
            for b in k["bindings"].as_array().unwrap() {
                let n = b["binding"].as_u64().unwrap();
                assert_eq!(
                    declared.get(&n).map(String::as_str),
                    Some(b["type"].as_str().unwrap()),
                    "{file}: binding {n} as the index lists it"
                );
            }
            let uses_subgroups = text
                .lines()
                .map(|l| l.split("//").next().unwrap())
                .any(|l| l.contains("subgroup"));
            assert_eq!(
                k["subgroups"].as_bool().unwrap(),
                uses_subgroups,
                "{file}: subgroups flag"
            );
            gemv += key.starts_with("gemv:") as usize;
        }
        let n = kernels.len();
        assert!(
            stdout.starts_with(&format!(
                "wrote {n} WGSL modules ({gemv} GEMV, {} other)",
                n - gemv
            )),
            "{stdout}"
        );
        counts.push(n);
        std::fs::remove_dir_all(&dir).ok();
    }
    assert!(counts[1] < counts[0], "--model writes a subset: {counts:?}");
}
