//! `convert --force` replaces only a conversion of its own, whole: a damaged source, a partial
//! download or a user's file in `--out` is refused by name and left byte for byte; a replacement
//! stopped at any step of the swap (as a kill would) leaves a whole container, old or new; a
//! replacement killed between the two renames of the fallback path is restored by the next run.
use inkling_wgpu::container::replace::SwapStep;
use inkling_wgpu::container::{convert, Container, ConvertOptions, FailPlan};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("inkling-replace-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Every file of `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

fn forced() -> ConvertOptions {
    ConvertOptions {
        force: true,
        ..Default::default()
    }
}

/// The number of weight shards of the container in `dir`, which must open and verify whole.
fn whole_shards(dir: &Path) -> usize {
    let c = Container::open(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    assert!(c.is_converted());
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            let n = e.as_ref().unwrap().file_name();
            let n = n.to_string_lossy();
            n.starts_with("model") && n.ends_with(".safetensors")
        })
        .count()
}

#[test]
fn damaged_sources_partial_downloads_and_foreign_files_are_never_replaced() {
    let src = fixture("tiny-causal-f32");
    let root = tmpdir("refused");
    let source = std::fs::read(src.join("model.safetensors")).unwrap();
    // a truncated download of the source weights, inside and before the header
    for (tag, cut) in [("short", 4usize), ("truncated", source.len() / 2)] {
        let out = root.join(tag);
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(out.join("model.safetensors"), &source[..cut]).unwrap();
        std::fs::copy(src.join("config.json"), out.join("config.json")).unwrap();
        let before = snapshot(&out);
        let e = format!("{:#}", convert(&src, &out, &forced()).unwrap_err());
        assert!(
            e.contains(&format!("{}: ", out.join("model.safetensors").display()))
                && (e.contains("a damaged weight file") || e.contains("a source checkpoint"))
                && e.contains("refusing to replace"),
            "{tag}: {e}"
        );
        assert_eq!(snapshot(&out), before, "{tag}: the folder was changed");
    }
    // a sharded download missing its second shard: index + shard 1 of the source
    let out = root.join("partial");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("model-00001-of-00002.safetensors"), &source).unwrap();
    std::fs::write(
        out.join("model.safetensors.index.json"),
        r#"{"metadata":{},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}"#,
    )
    .unwrap();
    let before = snapshot(&out);
    let e = format!("{:#}", convert(&src, &out, &forced()).unwrap_err());
    assert!(e.contains("refusing to replace"), "{e}");
    assert_eq!(snapshot(&out), before, "partial download changed");
    // a conversion of ours beside a file of the user's: refused naming that file
    let out = root.join("mine");
    convert(&src, &out, &ConvertOptions::default()).unwrap();
    std::fs::write(out.join("notes.txt"), "precious").unwrap();
    // named like a dead run's temporary: a refused run deletes nothing, not even that
    std::fs::write(out.join("config.json.4194304.tmp"), "partial").unwrap();
    let before = snapshot(&out);
    let e = format!("{:#}", convert(&src, &out, &forced()).unwrap_err());
    assert!(
        e.contains(&format!(
            "{}: not a file of a conversion",
            out.join("notes.txt").display()
        )),
        "{e}"
    );
    assert_eq!(
        snapshot(&out),
        before,
        "a refused --force changed the folder"
    );
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn a_replacement_stopped_at_any_step_leaves_a_whole_container() {
    let src = fixture("tiny-causal-f32");
    let root = tmpdir("steps");
    for (step, want_new) in [
        (SwapStep::BeforeSwap, false),
        (SwapStep::BeforeRemovingOld, true),
    ] {
        let out = root.join(format!("{step:?}"));
        convert(&src, &out, &ConvertOptions::default()).unwrap();
        let old = whole_shards(&out);
        // the new conversion has several shards, so old and new can be told apart
        let opts = ConvertOptions {
            force: true,
            max_shard_bytes: 64 << 10,
            fail: FailPlan {
                crash_at: Some(step),
                ..Default::default()
            },
            ..Default::default()
        };
        let e = format!("{:#}", convert(&src, &out, &opts).unwrap_err());
        assert!(e.contains("injected crash"), "{step:?}: {e}");
        let now = whole_shards(&out);
        assert_eq!(now != old, want_new, "{step:?}: {old} → {now} shards");
        // the next run replaces it again and leaves no staging directory behind
        convert(&src, &out, &forced()).unwrap();
        assert_eq!(whole_shards(&out), old);
        let left: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp") || n.ends_with(".old"))
            .collect();
        assert!(left.is_empty(), "{step:?}: {left:?}");
    }
    std::fs::remove_dir_all(&root).ok();
}

/// Where the swap takes two renames (no atomic exchange), a kill between them leaves the old
/// container whole at `OUT.PID.old`; the next run restores it before anything else.
#[test]
fn a_container_parked_by_a_killed_replacement_is_restored() {
    let src = fixture("tiny-causal-f32");
    let root = tmpdir("parked");
    let out = root.join("out");
    convert(&src, &out, &ConvertOptions::default()).unwrap();
    let before = snapshot(&out);
    // pid 4194304 is above Linux's largest pid: that process is gone
    let parked = root.join("out.4194304.old");
    std::fs::rename(&out, &parked).unwrap();
    let e = format!(
        "{:#}",
        convert(&src, &out, &ConvertOptions::default()).unwrap_err()
    );
    assert!(e.contains("already holds a conversion"), "{e}");
    assert!(!parked.exists());
    assert_eq!(snapshot(&out), before);
    std::fs::remove_dir_all(&root).ok();
}
