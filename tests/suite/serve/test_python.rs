//! The Python interpreter of the tests that drive Python scripts (the `openai` client, MLX):
//! `INKLING_TEST_PYTHON` when set, else `.ci/.venv` (made by `.ci/run` from
//! `tests/python/requirements.txt`) when present, else `python3`.
use std::path::PathBuf;

pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("INKLING_TEST_PYTHON") {
        return p.into();
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".ci/.venv/bin/python");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

/// Run `tests/python/SCRIPT` with [`python`] against the server at `addr` (`HOST:PORT`); whether
/// it exited 0, and its stdout and stderr together.
pub fn run_script(script: &str, addr: &str) -> (bool, String) {
    let out = std::process::Command::new(python())
        .arg(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("tests/python")
                .join(script),
        )
        .arg(format!("http://{addr}"))
        .output()
        .unwrap();
    let report = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), report)
}
