//! `benches/native/mlx_gemv.py` on MLX's CPU package (`tests/python/requirements.txt`, installed into
//! `.ci/.venv` by .ci/run): small shapes in check mode, every call checked against NumPy by the script itself;
//! here the JSON it prints has `bench kernels --json`'s schema, its rows are named as `bench
//! kernels` names them, each row's `bytes` equals MLX's array sizes computed here from the shape
//! and format, `bench compare` against a second file with known per-row bandwidths reports
//! exactly those ratios, and the script's check fails on an MLX call made 0.1 % wrong.
use inkling_wgpu::cli::bench::shape_names;
use std::process::Command;

const DIV: usize = 16;

/// (output rows, input columns, experts) of a `bench kernels` row name: `label [OxI]` or
/// `label Ex[OxI]`.
fn parse_shape(name: &str) -> (u64, u64, u64) {
    let open = name.rfind('[').unwrap();
    let (o, i) = name[open + 1..name.len() - 1].split_once('x').unwrap();
    let before = name[..open].trim_end();
    let experts = before
        .rsplit_once(' ')
        .and_then(|(_, e)| e.strip_suffix('x'))
        .and_then(|e| e.parse().ok())
        .unwrap_or(1);
    (o.parse().unwrap(), i.parse().unwrap(), experts)
}

/// The bytes of MLX's arrays for one row, from the definitions: bf16 weights are 2 bytes each;
/// `mx.quantize(bits, group 64)` packs `bits` bits per weight into uint32 words plus one bf16
/// scale and one bf16 bias per group of 64.
fn mlx_bytes(format: &str, (o, i, e): (u64, u64, u64)) -> u64 {
    match format {
        "bf16" => e * o * i * 2,
        "int4-g64" => e * o * (i * 4 / 8 + 2 * 2 * i / 64),
        "int3-g64" => e * o * (i * 3 / 8 + 2 * 2 * i / 64),
        f => panic!("unknown format {f}"),
    }
}

/// The script's JSON schema, row names and byte counts; `bench compare` of it against a copy whose
/// row n has `gbs` divided by n + 2 reports ratio n + 2 for every row, and drops a row missing
/// from the copy.
#[test]
fn mlx_script_prints_the_bench_kernels_schema_and_checks_its_numbers() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(crate::serve::test_python::python())
        .arg(format!("{root}/benches/native/mlx_gemv.py"))
        .args([
            "--div",
            &DIV.to_string(),
            "--check",
            "--iters",
            "1",
            "--warmup",
            "0",
        ])
        .output()
        .expect("the test Python runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "mlx_gemv.py failed (needs tests/python/requirements.txt, which .ci/run installs into .ci/.venv):\n{stderr}"
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc["backend"].as_str().unwrap().starts_with("MLX "));
    assert!(doc["adapter"].is_string() && doc["quick"] == true);
    let rows = doc["results"].as_array().unwrap();
    let names = shape_names(DIV);
    for fmt in ["int4-g64", "int3-g64", "bf16"] {
        let got: Vec<&str> = rows
            .iter()
            .filter(|r| r["format"] == fmt)
            .map(|r| r["shape"].as_str().unwrap())
            .collect();
        assert_eq!(got, names, "{fmt}: row names");
    }
    for r in rows {
        let experts = r["experts"].as_u64().unwrap();
        assert!((1..=8).contains(&experts), "{r}");
        for k in ["bytes", "us_per_dispatch", "gbs"] {
            assert!(r[k].as_f64().is_some_and(|v| v > 0.0), "{k}: {r}");
        }
        assert!(r["frac_peak"].is_null(), "{r}");
        let gbs = r["bytes"].as_f64().unwrap() / (r["us_per_dispatch"].as_f64().unwrap() * 1e3);
        assert!((gbs / r["gbs"].as_f64().unwrap() - 1.0).abs() < 1e-9, "{r}");
    }
    // one numerical check line per row, float32 to 1e-5 and the timed bf16 call to 5e-2
    assert_eq!(stderr.matches("# check ").count(), rows.len(), "{stderr}");
    for r in rows {
        let (f, sh) = (r["format"].as_str().unwrap(), r["shape"].as_str().unwrap());
        assert_eq!(
            r["bytes"].as_u64().unwrap(),
            mlx_bytes(f, parse_shape(sh)),
            "{f} {sh}: bytes"
        );
        assert_eq!(r["experts"].as_u64().unwrap(), parse_shape(sh).2, "{r}");
    }
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("inkling-mlx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let a = dir.join("mlx.json");
    std::fs::write(&a, &out.stdout).unwrap();
    // B: row n at gbs / (n + 2), and the last row missing
    let mut b_doc = doc.clone();
    let b_rows = b_doc["results"].as_array_mut().unwrap();
    b_rows.pop();
    for (n, r) in b_rows.iter_mut().enumerate() {
        r["gbs"] = serde_json::json!(r["gbs"].as_f64().unwrap() / (n + 2) as f64);
    }
    let b = dir.join("b.json");
    std::fs::write(&b, serde_json::to_vec(&b_doc).unwrap()).unwrap();
    let cmp = Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
        .args(["bench", "compare", "--json"])
        .arg(&a)
        .arg(&b)
        .output()
        .unwrap();
    assert!(
        cmp.status.success(),
        "{}",
        String::from_utf8_lossy(&cmp.stderr)
    );
    let c: serde_json::Value = serde_json::from_slice(&cmp.stdout).unwrap();
    let matched = c["rows"].as_array().unwrap();
    assert_eq!(
        matched.len(),
        rows.len() - 1,
        "the row missing from B is dropped"
    );
    for (n, (m, r)) in matched.iter().zip(rows).enumerate() {
        assert_eq!(m["format"], r["format"]);
        assert_eq!(m["shape"], r["shape"]);
        let ratio = m["ratio"].as_f64().unwrap();
        assert!(
            (ratio / (n + 2) as f64 - 1.0).abs() < 1e-12,
            "row {n} {}: ratio {ratio}, want {}",
            m["shape"],
            n + 2
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--check` is a live check: with MLX's `quantized_matmul` and `gather_qmm` results scaled by
/// 1.001 (a 1e-3 relative error, 100 times the f32 bound) the script exits non-zero
/// naming the failed call, where the unpatched run above passes.
#[test]
fn mlx_script_check_fails_on_a_wrong_mlx_result() {
    let root = env!("CARGO_MANIFEST_DIR");
    let code = format!(
        r#"
import sys, runpy
import mlx.core as mx
for name in ("quantized_matmul", "gather_qmm"):
    real = getattr(mx, name)
    setattr(mx, name, (lambda real: lambda *a, **k: real(*a, **k) * 1.001)(real))
sys.argv = ["mlx_gemv.py", "--div", "{DIV}", "--check", "--iters", "1", "--warmup", "0",
            "--formats", "int4-g64"]
runpy.run_path("{root}/benches/native/mlx_gemv.py", run_name="__main__")
"#
    );
    let out = Command::new(crate::serve::test_python::python())
        .args(["-c", &code])
        .output()
        .expect("the test Python runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("ModuleNotFoundError"),
        "the test Python lacks MLX (needs tests/python/requirements.txt, which .ci/run installs \
         into .ci/.venv):\n{stderr}"
    );
    assert!(
        !out.status.success(),
        "a wrong MLX result passed --check:\n{stderr}"
    );
    assert!(
        stderr.contains("AssertionError") && stderr.contains("relative error"),
        "{stderr}"
    );
}
