//! `benches/native/mlx_gemv.py` on MLX's CPU package (`tests/python/requirements.txt`, installed into
//! `.ci/.venv` by .ci/run): small shapes in check mode, every call checked against NumPy by the script itself;
//! here the JSON it prints has `bench kernels --json`'s schema, its rows are named as `bench
//! kernels` names them, and `bench compare` matches every row.
use inkling_wgpu::cli::bench::shape_names;
use std::process::Command;

const DIV: usize = 16;

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
    let dir = std::env::temp_dir().join(format!("inkling-mlx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("mlx.json");
    std::fs::write(&f, &out.stdout).unwrap();
    let cmp = Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
        .args(["bench", "compare", "--json"])
        .arg(&f)
        .arg(&f)
        .output()
        .unwrap();
    assert!(
        cmp.status.success(),
        "{}",
        String::from_utf8_lossy(&cmp.stderr)
    );
    let c: serde_json::Value = serde_json::from_slice(&cmp.stdout).unwrap();
    let matched = c["rows"].as_array().unwrap();
    assert_eq!(matched.len(), rows.len());
    assert!(matched.iter().all(|r| r["ratio"] == 1.0));
    std::fs::remove_dir_all(&dir).unwrap();
}
