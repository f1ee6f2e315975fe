//! The command line: `formats` prints the registry; `smoke --force-ordinal` shows the two distinct
//! dispatcher errors. Needs an adapter (lavapipe in CI); a missing one fails.

use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
}

#[test]
fn formats_prints_the_registry() {
    let out = bin().arg("formats").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for s in inkling_wgpu::formats::REGISTRY {
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().nth(1) == Some(s.name)),
            "{} missing:\n{text}",
            s.name
        );
    }
}

#[test]
fn smoke_force_ordinal_shows_distinct_typed_errors() {
    let run = |ord: &str| {
        let out = bin()
            .args(["smoke", "--force-ordinal", ord])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            text.contains("adapter:"),
            "no adapter line (is a GPU adapter available?):\n{text}"
        );
        (out.status.code(), text)
    };
    let (c42, t42) = run("42");
    assert!(t42.contains("DispatchError::UnknownOrdinal"), "{t42}");
    assert_ne!(c42, Some(0));
    let (c6, t6) = run("6");
    assert!(t6.contains("DispatchError::NoKernel"), "{t6}");
    assert_ne!(c6, Some(0));
}
