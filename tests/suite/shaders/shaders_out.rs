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
