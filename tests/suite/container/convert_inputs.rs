//! What `convert` and `synth` accept and what they leave behind: a converted container as the
//! source is refused (for every `--experts` value, from every container format), bad sizes and
//! spellings are refused naming their flag, a failed run removes the directories it created (and
//! nothing that existed before), SIGHUP / SIGINT / SIGTERM remove the temporary files, and a later run
//! removes the temporaries a killed run left.
use crate::model_common::{fixture, scratch};
use inkling_wgpu::cli::convert::writing_into;
use inkling_wgpu::container::{convert, ConvertOptions, ConvertSummary, FailPlan};
use inkling_wgpu::formats::Encoding;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const EXPERTS: [&str; 7] = [
    "int4",
    "int4-g32",
    "int4-g64",
    "int4-g128",
    "int3-g64",
    "bf16",
    "f32",
];

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_converted_container_is_refused_as_source_for_every_experts_value() {
    let root = scratch("reconvert");
    for from in EXPERTS {
        let src = root.join(format!("from-{from}"));
        convert(
            &fixture("tiny-mm-bf16"),
            &src,
            &ConvertOptions {
                experts: Some(Encoding::parse(from).unwrap()),
                ..Default::default()
            },
        )
        .unwrap();
        for to in EXPERTS.iter().map(|e| Some(*e)).chain([None]) {
            let dst = root.join(format!("{from}-to-{}", to.unwrap_or("keep")));
            let opts = ConvertOptions {
                experts: to.map(|e| Encoding::parse(e).unwrap()),
                ..Default::default()
            };
            let e = format!("{:#}", convert(&src, &dst, &opts).unwrap_err());
            assert!(
                e.contains(&format!(
                    "{} is already a converted container",
                    src.display()
                )) && e.contains("convert the original checkpoint again"),
                "{from} → {to:?}: {e}"
            );
            assert!(!dst.exists(), "{from} → {to:?}: nothing written");
        }
    }
    // the CLI says the same, and exits 1
    let src = root.join("from-int3-g64");
    let o = bin()
        .args(["convert", "--model", src.to_str().unwrap(), "--out"])
        .arg(root.join("cli-out"))
        .args(["--experts", "int4-g64"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("is already a converted container"),
        "{}",
        stderr(&o)
    );
    assert!(!root.join("cli-out").exists());
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn bad_sizes_and_spellings_name_their_flag() {
    let root = scratch("flags");
    let src = fixture("tiny-mm-bf16");
    let out = root.join("o");
    let cases: &[(&[&str], &str)] = &[
        (&["--max-shard-mib", "0"], "--max-shard-mib"),
        (&["--experts", "int9"], "--experts int9"),
        (&["--shared", "fp8"], "--shared fp8"),
        (&["--dense", "q4"], "--dense q4"),
        (&["--head", "x"], "--head x"),
    ];
    for (extra, flag) in cases {
        let o = bin()
            .args(["convert", "--model", src.to_str().unwrap(), "--out"])
            .arg(&out)
            .args(*extra)
            .output()
            .unwrap();
        assert!(!o.status.success(), "{extra:?}");
        assert!(stderr(&o).contains(flag), "{extra:?}: {}", stderr(&o));
        assert!(!out.exists(), "{extra:?}");
    }
    for (extra, flag) in [
        (
            ["--max-shard-mib", "0", "--experts", "bf16"],
            "--max-shard-mib",
        ),
        (["--experts", "int9", "--head", "bf16"], "--experts int9"),
    ] {
        let o = bin()
            .args(["synth", "--preset", "tiny", "--layers", "1", "--out"])
            .arg(&out)
            .args(extra)
            .output()
            .unwrap();
        assert!(!o.status.success(), "synth {extra:?}");
        assert!(stderr(&o).contains(flag), "synth {extra:?}: {}", stderr(&o));
    }
    std::fs::remove_dir_all(&root).ok();
}

/// [`convert`] through `writing_into` (what `inkling-wgpu convert` runs) with an injected write
/// failure: the error, and the directories left.
fn failed_convert(src: &Path, out: &Path) -> anyhow::Result<ConvertSummary> {
    let opts = ConvertOptions {
        fail: FailPlan {
            fail_after_bytes: Some(1000),
            ..Default::default()
        },
        ..Default::default()
    };
    writing_into(out, || convert(src, out, &opts))
}

#[test]
fn a_failed_convert_removes_only_the_directories_it_created() {
    let root = scratch("failed-out");
    let src = fixture("tiny-mm-bf16");
    // a new nested destination: every level this run created goes again
    let e = failed_convert(&src, &root.join("a/b/c")).unwrap_err();
    assert!(format!("{e:#}").contains("injected write failure"), "{e:#}");
    assert!(names(&root).is_empty(), "{:?}", names(&root));
    // an existing (empty) destination stays
    let mine = root.join("mine");
    std::fs::create_dir(&mine).unwrap();
    assert!(failed_convert(&src, &mine).is_err());
    assert!(
        mine.is_dir() && names(&mine).is_empty(),
        "{:?}",
        names(&mine)
    );
    std::fs::remove_dir_all(&root).ok();
}

/// Set in the environment of this test binary run as a child by [`interrupt_while_writing`]:
/// `convert SRC OUT` or `synth OUT`, the write the child runs (stalling after 2000 bytes).
const STALLED_WRITE: &str = "INKLING_TEST_STALLED_WRITE";

/// The child of [`interrupt_while_writing`] (does nothing unless [`STALLED_WRITE`] is set): what
/// `inkling-wgpu convert --model SRC --out OUT`, or `synth --preset tiny --layers 2 --experts
/// int4-g64 --out OUT`, runs, with the write stalling after 2000 tensor bytes until a signal ends
/// the process.
#[test]
#[ignore = "run as a child process by sigint_sigterm_and_sighup_remove_the_temporary_files"]
fn stalled_write_child() {
    use inkling_wgpu::container::synth::{synth, SynthOptions, SynthSpec};
    let Ok(what) = std::env::var(STALLED_WRITE) else {
        return;
    };
    let fail = FailPlan {
        stall_after_bytes: Some(2000),
        ..Default::default()
    };
    let words: Vec<&str> = what.split('\t').collect();
    match words[..] {
        ["convert", src, out] => {
            let opts = ConvertOptions {
                fail,
                ..Default::default()
            };
            let (src, out) = (Path::new(src), Path::new(out));
            writing_into(out, || convert(src, out, &opts)).unwrap();
        }
        ["synth", out] => {
            let mut spec = SynthSpec::preset("tiny", 2).unwrap();
            spec.experts = Encoding::parse("int4-g64").unwrap();
            let opts = SynthOptions {
                fail,
                ..Default::default()
            };
            let out = Path::new(out);
            writing_into(out, || synth(&spec, out, &opts)).unwrap();
        }
        _ => panic!("{STALLED_WRITE}={what:?}"),
    }
}

/// Run [`stalled_write_child`] on `sub` (`["convert", SRC]` or `["synth"]`) and `out` in a child
/// process, wait until its temporary file exists, send it `signal`; the child's output and the
/// names seen in `out`.
#[cfg(unix)]
fn interrupt_while_writing(sub: &[&str], out: &Path, signal: i32) -> (Output, Vec<String>) {
    let what = [sub, &[out.to_str().unwrap()]].concat().join("\t");
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "container::convert_inputs::stalled_write_child"])
        .args(["--ignored", "--nocapture", "--test-threads", "1"])
        .env(STALLED_WRITE, what)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // wait (up to 60 s) until the shard's temporary file exists and the writer has stalled
    let mut seen = Vec::new();
    for _ in 0..600 {
        if out.is_dir() {
            seen = names(out);
            if seen.iter().any(|n| n.ends_with(".tmp")) {
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(seen.iter().any(|n| n.ends_with(".tmp")), "{seen:?}");
    // SAFETY: kill sends a signal to our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
    (child.wait_with_output().unwrap(), seen)
}

#[cfg(unix)]
#[test]
fn sigint_sigterm_and_sighup_remove_the_temporary_files() {
    let root = scratch("signals");
    let src = fixture("tiny-mm-bf16");
    let src = src.to_str().unwrap();
    let convert_args = ["convert", src];
    let synth_args = ["synth"];
    for (tag, args, sig, code) in [
        ("convert-int", &convert_args[..], libc::SIGINT, 130),
        ("synth-term", &synth_args[..], libc::SIGTERM, 143),
        // the terminal closed (a hung-up ssh session)
        ("synth-hup", &synth_args[..], libc::SIGHUP, 129),
    ] {
        // a new directory: removed with the temporaries
        let out = root.join(tag).join("new");
        let (o, seen) = interrupt_while_writing(args, &out, sig);
        assert_eq!(o.status.code(), Some(code), "{tag}: {}", stderr(&o));
        assert!(
            !root.join(tag).exists(),
            "{tag}: saw {seen:?}, left {:?}",
            names(&root)
        );
        // an existing empty directory of the user's: it stays, the temporaries go (one holding
        // a file of the user's is refused before anything is written: convert_roundtrip)
        let mine = root.join(format!("{tag}-mine"));
        std::fs::create_dir_all(&mine).unwrap();
        let (o, _) = interrupt_while_writing(args, &mine, sig);
        assert_eq!(o.status.code(), Some(code), "{tag}: {}", stderr(&o));
        assert!(mine.is_dir(), "{tag}");
        assert_eq!(names(&mine), Vec::<String>::new(), "{tag}");
    }
    std::fs::remove_dir_all(&root).ok();
}

#[cfg(unix)]
#[test]
fn a_later_run_removes_stale_temporaries_of_dead_processes_only() {
    let root = scratch("stale");
    let out = root.join("out");
    std::fs::create_dir(&out).unwrap();
    // pid 4194304 is above Linux's largest pid: that process does not exist; pid 1 always runs
    let dead = "model.safetensors.4194304.tmp";
    let alive = "model-00001-of-00002.safetensors.1.tmp".to_string();
    // a temporary name that is not one of ours: the write is refused and nothing is removed
    let not_ours = "notes.4194304.tmp";
    for n in [dead, &alive, not_ours] {
        std::fs::write(out.join(n), b"partial").unwrap();
    }
    let e = convert(&fixture("tiny-mm-bf16"), &out, &ConvertOptions::default()).unwrap_err();
    assert!(
        format!("{e:#}").contains("it holds notes.4194304.tmp"),
        "{e:#}"
    );
    assert_eq!(names(&out).len(), 3, "{:?}", names(&out));
    std::fs::remove_file(out.join(not_ours)).unwrap();
    convert(&fixture("tiny-mm-bf16"), &out, &ConvertOptions::default()).unwrap();
    let left = names(&out);
    assert!(!left.contains(&dead.to_string()), "{left:?}");
    assert!(
        left.contains(&alive),
        "a running process's file stays: {left:?}"
    );
    std::fs::remove_dir_all(&root).ok();
}

/// A copy of the tiny f32 source checkpoint whose `file` is edited by `edit` (a JSON object).
fn edited_source(
    tag: &str,
    file: &str,
    edit: impl Fn(&mut serde_json::Value),
) -> std::path::PathBuf {
    let src = scratch(tag);
    for e in std::fs::read_dir(fixture("tiny-causal-f32")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), src.join(e.file_name())).unwrap();
    }
    let p = src.join(file);
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
    src
}

/// `inkling-wgpu convert --model SRC --out OUT EXTRA…`.
fn convert_cli(src: &Path, out: &Path, extra: &[&str]) -> Output {
    bin()
        .args(["convert", "--model"])
        .arg(src)
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

/// A source whose generation_config.json `generate` refuses is refused before anything is
/// written (naming the file and field); one whose config.json disagrees with its tensors is
/// converted, then refused by the load of the result, naming the source's config.json, instead
/// of exiting 0 with a container no command can load.
#[test]
fn convert_checks_the_sources_configs_as_generate_reads_them() {
    let src = edited_source("convert-bad-gen", "generation_config.json", |v| {
        v["do_sample"] = serde_json::json!(true);
        v["top_p"] = serde_json::json!(2.0);
    });
    let out = src.with_extension("out");
    let o = convert_cli(&src, &out, &["--experts", "int4-g64"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains("generation_config.json") && e.contains("top_p"),
        "{e}"
    );
    assert!(!out.exists(), "a refused source left {}", out.display());
    std::fs::remove_dir_all(&src).ok();

    let src = edited_source("convert-bad-cfg", "config.json", |v| {
        v["moe_intermediate_size"] = serde_json::json!(48);
    });
    let out = src.with_extension("out");
    let o = convert_cli(&src, &out, &["--experts", "int4-g64"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("does not load as a model"), "{e}");
    assert!(
        e.contains(&src.join("config.json").display().to_string()),
        "{e}"
    );
    assert!(
        e.contains("holds a [32, 64] matrix, the model expects [48, 64]"),
        "{e}"
    );
    assert!(
        !out.exists(),
        "the unloadable container was kept in {}",
        out.display()
    );
    // over an earlier good conversion (--force): the bad one is not swapped in
    let good = convert_cli(&fixture("tiny-causal-f32"), &out, &[]);
    assert!(good.status.success(), "{}", stderr(&good));
    let before = names(&out);
    let o = convert_cli(&src, &out, &["--force"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(names(&out), before);
    let v = bin()
        .args(["info", "--verify", "--model"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        v.status.success(),
        "the earlier container was damaged: {}",
        stderr(&v)
    );
    std::fs::remove_dir_all(&src).ok();
    std::fs::remove_dir_all(&out).ok();
    let parent = out.parent().unwrap();
    assert!(
        std::fs::read_dir(parent).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains(".tmp")),
        "a staging directory was left in {}",
        parent.display()
    );
}

/// A side file that is a symlink to /dev/zero or a FIFO is refused as not a regular file, and a
/// regular one past the cap as too large, with the file named, instead of read until memory runs
/// out or blocking for ever.
#[test]
fn an_endless_config_file_is_refused_naming_it() {
    for file in ["config.json", "generation_config.json", "tokenizer.json"] {
        for kind in ["/dev/zero", "fifo", "sparse"] {
            let src = edited_source("endless-cfg", "config.json", |_| {});
            let p = src.join(file);
            std::fs::remove_file(&p).unwrap();
            let want = match kind {
                "/dev/zero" => {
                    std::os::unix::fs::symlink("/dev/zero", &p).unwrap();
                    "not a regular file".to_string()
                }
                "fifo" => {
                    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
                    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
                    "not a regular file".to_string()
                }
                _ => {
                    let cap: u64 = if file == "tokenizer.json" { 512 } else { 64 };
                    std::fs::File::create(&p)
                        .unwrap()
                        .set_len((cap << 20) + 1)
                        .unwrap();
                    format!("larger than {cap}.00 MiB")
                }
            };
            let o = bin()
                .args([
                    "generate",
                    "--device",
                    "cpu",
                    "--prompt-ids",
                    "1",
                    "--model",
                ])
                .arg(&src)
                .output()
                .unwrap();
            let e = stderr(&o);
            assert_eq!(o.status.code(), Some(1), "{file} {kind}: {e}");
            assert!(
                e.contains(&p.display().to_string()) && e.contains(&want),
                "{file} {kind}: {e}"
            );
            std::fs::remove_dir_all(&src).ok();
        }
    }
}
