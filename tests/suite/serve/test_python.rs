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

/// [`python`], after checking that it has the `openai` package (a clear panic when not).
pub fn python_with_openai() -> PathBuf {
    let py = python();
    let probe = std::process::Command::new(&py)
        .args(["-c", "import openai; print(openai.__version__)"])
        .output();
    match probe {
        Ok(o) if o.status.success() => py,
        other => panic!(
            "{} with the `openai` package is needed (pip install -r tests/python/requirements.txt, \
             into .ci/.venv or the interpreter named by INKLING_TEST_PYTHON): {other:?}",
            py.display()
        ),
    }
}

/// Run `tests/python/SCRIPT` (which uses the official `openai` client) with
/// [`python_with_openai`] against the server at `addr` (`HOST:PORT`); whether
/// it exited 0, and its stdout and stderr together.
pub fn run_script(script: &str, addr: &str) -> (bool, String) {
    let out = std::process::Command::new(python_with_openai())
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
