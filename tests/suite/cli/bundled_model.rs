//! The default model comes from the binary itself: a copy of the binary outside the checkout,
//! with its own cache directory, generates the same tokens as the checkout's fixture; an
//! unwritable cache says what to pass instead.
use crate::model_common::scratch;
use std::process::Command;

fn json_ids(o: &std::process::Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["generated_ids"].clone()
}

#[test]
fn default_model_runs_from_the_binary_alone() {
    let root = scratch("bundled");
    let exe = root.join("inkling-wgpu");
    std::fs::copy(env!("CARGO_BIN_EXE_inkling-wgpu"), &exe).unwrap();
    let cache = root.join("cache");
    let args = [
        "generate",
        "--prompt-ids",
        "5,6,7",
        "--device",
        "cpu",
        "--json",
        "--max-tokens",
        "4",
    ];
    let run = || {
        Command::new(&exe)
            .args(args)
            .current_dir(&root)
            .env("XDG_CACHE_HOME", &cache)
            .env("HOME", &root)
            .output()
            .unwrap()
    };
    let first = json_ids(&run());
    let want = json_ids(
        &Command::new(&exe)
            .args(args)
            .arg("--model")
            .arg(inkling_wgpu::bundled_model_dir())
            .output()
            .unwrap(),
    );
    assert_eq!(first, want);
    // written once to the cache, keyed by the embedded bytes' hash
    let dirs: Vec<_> = std::fs::read_dir(cache.join("inkling-wgpu"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    assert_eq!(
        dirs[0].file_name().unwrap().to_string_lossy(),
        format!("bundled-{}", inkling_wgpu::bundled::content_hash())
    );
    for (name, bytes) in inkling_wgpu::bundled::FILES {
        assert_eq!(&std::fs::read(dirs[0].join(name)).unwrap()[..], *bytes);
    }
    // a damaged cache is rewritten
    std::fs::write(dirs[0].join("config.json"), b"{}").unwrap();
    assert_eq!(json_ids(&run()), want);
    // again: the same directory, nothing else
    assert_eq!(
        std::fs::read_dir(cache.join("inkling-wgpu"))
            .unwrap()
            .count(),
        1
    );

    // nowhere to write it: an error that says what to pass
    let blocker = root.join("not-a-dir");
    std::fs::write(&blocker, b"").unwrap();
    let o = Command::new(&exe)
        .args(args)
        .env("XDG_CACHE_HOME", &blocker)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("the bundled model could not be written to") && e.contains("pass --model DIR"),
        "{e}"
    );
    std::fs::remove_dir_all(&root).ok();
}
