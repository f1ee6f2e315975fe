//! The benches and `smoke` on whatever adapter the suite runs on (lavapipe, a CPU adapter, in CI):
//! `bench prefill`'s default lengths fit the model's context; `bench gemm` is in quick mode on a
//! CPU adapter; every printed figure of `bench gemm`, `bench kernels`, `bench compare` and
//! `smoke` is a non-zero number with 3 significant figures (the table agrees with the JSON), and
//! a `smoke` cell that holds no figure is explained. Speed is never asserted.
use crate::model_common::{copy_fixture, scratch};
use inkling_wgpu::cli::bench_gemm::{QUICK_DIV, QUICK_TOKENS};
use inkling_wgpu::cli::bench_prefill::default_prompts;
use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> Output {
    let o = run(args);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn err(args: &[&str]) -> String {
    let o = run(args);
    assert!(!o.status.success(), "{args:?} should fail");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&o.stdout));
    })
}

/// A printed figure (`1.44x` and `12.3%` too) that is `want` to 3 significant figures: non-zero
/// and within 0.6 % of it (rounding to 3 figures moves a value by at most 0.5 %).
fn assert_sig3(cell: &str, want: f64, what: &str) {
    let v: f64 = cell
        .trim_end_matches(['x', '%'])
        .parse()
        .unwrap_or_else(|_| panic!("{what}: {cell:?} is not a number"));
    assert!(
        want > 0.0 && v > 0.0,
        "{what}: {cell:?} (want {want}) is not positive"
    );
    assert!(
        (v - want).abs() <= 0.006 * want,
        "{what}: {cell:?} is not {want} to 3 significant figures"
    );
}

/// The table rows of `text` under the header line that starts with `format`, up to the first
/// line that is not a row of `formats`.
fn rows<'a>(text: &'a str, formats: &[&str]) -> Vec<Vec<&'a str>> {
    text.lines()
        .skip_while(|l| !l.starts_with("format "))
        .skip(1)
        .take_while(|l| formats.iter().any(|f| l.starts_with(&format!("{f} "))))
        .map(|l| l.split_whitespace().collect())
        .collect()
}

#[test]
fn bench_prefill_defaults_fit_the_model_context() {
    assert_eq!(default_prompts(None), [128, 512, 2048]);
    assert_eq!(default_prompts(Some(512)), [128, 512]);
    assert_eq!(default_prompts(Some(1000)), [128, 512, 1000]);
    assert_eq!(default_prompts(Some(100)), [100]);
    assert_eq!(default_prompts(Some(4096)), [128, 512, 2048]);
    // a model of 200 positions: the defaults are 128 and 200, and a 200-token prompt fits
    let dir = copy_fixture("tiny-causal-f32", "prefill-ctx");
    let cfg = dir.join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    c["max_position_embeddings"] = 200.into();
    std::fs::write(&cfg, c.to_string()).unwrap();
    let d = dir.to_str().unwrap();
    let v = json(&ok(&[
        "bench", "prefill", "--model", d, "--repeat", "1", "--json",
    ]));
    let lens: Vec<u64> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["prompt_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(lens, [128, 200]);
    // an explicit length past the context names the flag, the length and the context
    let e = err(&["bench", "prefill", "--model", d, "--prompt", "64,201"]);
    assert!(
        e.contains("--prompt 201") && e.contains("context of 200"),
        "{e}"
    );
    // the default model (512 positions) too, before any weight is read
    let e = err(&["bench", "prefill", "--prompt", "513"]);
    assert!(
        e.contains("--prompt 513") && e.contains("context of 512"),
        "{e}"
    );
    // the help shows the comma form the flag takes
    let help = String::from_utf8(ok(&["bench", "prefill", "--help"]).stdout).unwrap();
    assert!(
        help.contains("128,512,2048") && !help.contains("128 512 2048"),
        "{help}"
    );
    let help = String::from_utf8(ok(&["bench", "gemm", "--help"]).stdout).unwrap();
    assert!(
        help.contains("64,512,2048") && !help.contains("64 512 2048"),
        "{help}"
    );
}

#[test]
fn bench_gemm_prints_nonzero_figures_and_is_quick_on_a_cpu_adapter() {
    let o = ok(&[
        "bench",
        "gemm",
        "--formats",
        "bf16",
        "--dense-only",
        "--iters",
        "1",
        "--json",
    ]);
    let v = json(&o);
    let table = String::from_utf8(o.stderr).unwrap();
    let results = v["results"].as_array().unwrap();
    let rows = rows(&table, &["bf16"]);
    assert!(!results.is_empty());
    assert_eq!(rows.len(), results.len(), "{table}");
    let cpu = table
        .lines()
        .next()
        .unwrap()
        .ends_with(", software adapter on the CPU");
    for (r, row) in results.iter().zip(&rows) {
        let t = r["tokens"].as_u64().unwrap();
        assert!(r["pairs"].as_u64().unwrap() >= t, "{r}");
        assert!(r["kernel"].is_string() && r["format"] == "bf16", "{r}");
        // the last four cells: us/call, us/token, TFLOP/s, vs GEMV
        let n = row.len();
        let us = r["us_per_call"].as_f64().unwrap();
        assert_sig3(row[n - 4], us, "us/call");
        assert_sig3(row[n - 3], us / t as f64, "us/token");
        assert_sig3(row[n - 2], r["tflops"].as_f64().unwrap(), "TFLOP/s");
        assert_sig3(
            row[n - 1],
            r["speedup_vs_gemv"].as_f64().unwrap(),
            "vs GEMV",
        );
        if cpu {
            // quick mode without --quick: its shapes and chunk lengths
            let d = 4096 / QUICK_DIV;
            assert_eq!(r["shape"], format!("dense [{d}x{d}]"), "{r}");
            assert!(QUICK_TOKENS.contains(&(t as u32)), "{r}");
        }
    }
    assert_eq!(v["quick"], cpu, "{table}");
}

/// `bench kernels --json --quick` on the router shape in bf16 and int4-g64: two rows, each with
/// the bytes FORMATS.md gives for its shape and format, GB/s = bytes / time, the peak fraction
/// of `--peak-gbs`, and the table's figures equal to the JSON's to 3 significant figures.
#[test]
fn bench_kernels_json_and_table_agree_on_nonzero_figures() {
    let o = ok(&[
        "bench",
        "kernels",
        "--json",
        "--quick",
        "--formats",
        "bf16,int4-g64",
        "--shapes",
        "router",
        "--iters",
        "1",
        "--peak-gbs",
        "1000",
    ]);
    let v = json(&o);
    let table = String::from_utf8(o.stderr).unwrap();
    let results = v["results"].as_array().unwrap();
    let rows = rows(&table, &["bf16", "int4-g64"]);
    assert_eq!(results.len(), 2, "{v}");
    assert_eq!(rows.len(), 2, "{table}");
    for (r, row) in results.iter().zip(&rows) {
        assert!(r["format"].is_string() && r["shape"].as_str().unwrap().contains("router"));
        assert_eq!(r["experts"], 1, "{r}");
        // bytes from FORMATS.md: bf16 2 bytes a weight; int4-g64 a nibble a weight and one f32
        // scale a group of 64 columns
        let sh = r["shape"].as_str().unwrap();
        let dims = &sh[sh.rfind('[').unwrap() + 1..sh.len() - 1];
        let (o, i) = dims.split_once('x').unwrap();
        let (o, i): (u64, u64) = (o.parse().unwrap(), i.parse().unwrap());
        let want = match r["format"].as_str().unwrap() {
            "bf16" => o * i * 2,
            "int4-g64" => o * i / 2 + o * i.div_ceil(64) * 4,
            f => panic!("{f}"),
        };
        assert_eq!(r["bytes"].as_u64().unwrap(), want, "{r}");
        let us = r["us_per_dispatch"].as_f64().unwrap();
        let gbs = r["gbs"].as_f64().unwrap();
        assert!(us.is_finite() && us > 0.0, "{r}");
        assert!(
            (want as f64 / (us * 1e3) / gbs - 1.0).abs() < 1e-9,
            "GB/s = bytes / time: {r}"
        );
        let frac = r["frac_peak"].as_f64().unwrap();
        assert!(
            (frac * 1000.0 / gbs - 1.0).abs() < 1e-9,
            "peak fraction of 1000 GB/s: {r}"
        );
        let n = row.len();
        assert_sig3(
            row[n - 3],
            r["us_per_dispatch"].as_f64().unwrap(),
            "us/disp",
        );
        assert_sig3(row[n - 2], r["gbs"].as_f64().unwrap(), "GB/s");
        assert_sig3(
            row[n - 1],
            100.0 * r["frac_peak"].as_f64().unwrap(),
            "peak %",
        );
    }
}

#[test]
fn bench_compare_prints_small_bandwidths_and_their_ratio() {
    let dir = scratch("compare-sig");
    let write = |name: &str, gbs: f64| {
        let p = dir.join(name);
        let doc = serde_json::json!({"adapter": name, "backend": "Vulkan", "results": [
            {"format": "bf16", "shape": "inkling-small router [64x1024]", "gbs": gbs},
        ]});
        std::fs::write(&p, doc.to_string()).unwrap();
        p.to_str().unwrap().to_string()
    };
    let (a, b) = (write("a.json", 0.0123), write("b.json", 0.00855));
    let text = String::from_utf8(ok(&["bench", "compare", &a, &b]).stdout).unwrap();
    let rows = rows(&text, &["bf16"]);
    assert_eq!(rows.len(), 1, "{text}");
    let n = rows[0].len();
    assert_eq!(rows[0][n - 3..], ["0.0123", "0.00855", "1.44x"], "{text}");

    // a shape longer than the column: every line still ends at the same place
    let long = dir.join("long.json");
    let doc = serde_json::json!({"adapter": "x", "backend": "Vulkan", "results": [
        {"format": "int4-g64", "shape": "inkling-small moe-layer gate_up 8x[1024x1024]", "gbs": 1500.0},
        {"format": "int4-g64", "shape": "inkling-small router [64x1024]", "gbs": 20.0},
    ]});
    std::fs::write(&long, doc.to_string()).unwrap();
    let l = long.to_str().unwrap();
    let text = String::from_utf8(ok(&["bench", "compare", l, l]).stdout).unwrap();
    let table: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("format "))
        .collect();
    assert_eq!(table.len(), 3, "{text}");
    let ends: Vec<usize> = table.iter().map(|l| l.chars().count()).collect();
    assert!(
        ends.iter().all(|&e| e == ends[0]),
        "ragged columns {ends:?}:\n{text}"
    );
}

#[test]
fn smoke_prints_every_bandwidth_or_says_why_not() {
    let o = ok(&["smoke"]);
    let text = String::from_utf8(o.stdout).unwrap();
    let rows: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("format "))
        .skip(1)
        .take_while(|l| !l.starts_with("shapes "))
        .collect();
    assert!(!rows.is_empty(), "{text}");
    for row in rows {
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert!(cells.len() >= 5, "a blank GB/s cell: {row:?}\n{text}");
        let rate = cells[4];
        if rate == "n/a" {
            assert!(
                text.lines().any(|l| l.contains("n/a: ")),
                "n/a without a legend:\n{text}"
            );
        } else {
            let g: f64 = rate.parse().unwrap_or_else(|_| panic!("{row:?}"));
            assert!(g > 0.0, "{row:?}");
            // 3 significant figures: a value below 100 has decimals
            assert!(g >= 100.0 || rate.contains('.'), "{row:?}");
        }
    }
}

/// `bench prefill --json --compare` on the fixture: one row per (kernel, chunk, prompt length)
/// with `kernel` gemv then gemm; `runs_s` holds `--repeat` positive finite times, `ttft_s` is
/// their median and `prefill_tok_s` is prompt_tokens / ttft_s; the table on stderr has a row per
/// result with the same figures. Speed is never asserted.
#[test]
fn bench_prefill_json_rows_are_consistent() {
    let fx = crate::model_common::fixture("tiny-causal-f32");
    let o = ok(&[
        "bench",
        "prefill",
        "--model",
        fx.to_str().unwrap(),
        "--prompt",
        "5,12",
        "--chunk",
        "4,16",
        "--repeat",
        "3",
        "--compare",
        "--json",
    ]);
    let v = json(&o);
    let table = String::from_utf8(o.stderr).unwrap();
    assert!(v["adapter"].as_str().is_some_and(|a| !a.is_empty()), "{v}");
    assert_eq!(v["repeat"], 3);
    let results = v["results"].as_array().unwrap();
    let mut want = Vec::new();
    for k in ["gemv", "gemm"] {
        for c in [4u64, 16] {
            for n in [5u64, 12] {
                want.push((k.to_string(), c, n));
            }
        }
    }
    let got: Vec<(String, u64, u64)> = results
        .iter()
        .map(|r| {
            (
                r["kernel"].as_str().unwrap().to_string(),
                r["chunk"].as_u64().unwrap(),
                r["prompt_tokens"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, want, "{v}");
    let rows: Vec<Vec<&str>> = table
        .lines()
        .filter(|l| l.starts_with("gemv ") || l.starts_with("gemm "))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), results.len(), "{table}");
    for (r, row) in results.iter().zip(&rows) {
        let runs: Vec<f64> = r["runs_s"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(runs.len(), 3, "{r}");
        assert!(runs.iter().all(|s| s.is_finite() && *s > 0.0), "{r}");
        assert!(runs.windows(2).all(|w| w[0] <= w[1]), "sorted: {r}");
        let s = r["ttft_s"].as_f64().unwrap();
        assert_eq!(s, runs[1], "the median: {r}");
        let n = r["prompt_tokens"].as_f64().unwrap();
        let tps = r["prefill_tok_s"].as_f64().unwrap();
        assert!((tps * s / n - 1.0).abs() < 1e-12, "{r}");
        assert_eq!(row[0], r["kernel"].as_str().unwrap(), "{row:?}");
        assert_eq!(row[1], r["chunk"].to_string(), "{row:?}");
        assert_eq!(row[2], r["prompt_tokens"].to_string(), "{row:?}");
        let ms: f64 = row[3].parse().unwrap();
        assert!((ms - s * 1e3).abs() <= 0.05 + 1e-9, "TTFT ms {ms} vs {s} s");
    }
}

/// `bench stream` on the tiny fixture (24 routed experts): the resident row reads nothing, the
/// one-slot row misses on every decode token and has an I/O bound; the rows' ids agree and the
/// JSON says so; a slot count that is no count or percentage is refused naming the flag.
#[test]
fn bench_stream_rows_are_consistent() {
    let fx = crate::model_common::fixture("tiny-causal-f32");
    let m = fx.to_str().unwrap();
    let o = ok(&[
        "bench", "stream", "--model", m, "--slots", "100%,1", "--tokens", "4", "--json",
    ]);
    let v = json(&o);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{v}");
    assert_eq!(rows[0]["resident"], true, "{v}");
    assert_eq!(rows[0]["misses_per_token"].as_f64(), Some(0.0), "{v}");
    assert!(rows[0]["io_bound_tok_s"].is_null(), "{v}");
    assert_eq!(
        (rows[1]["slots"].as_u64(), rows[1]["resident"].as_bool()),
        (Some(1), Some(false))
    );
    // one slot and top-2 routing: every decode token misses in every sparse layer
    assert!(rows[1]["misses_per_token"].as_f64().unwrap() >= 1.0, "{v}");
    assert!(rows[1]["io_bound_tok_s"].as_f64().unwrap() > 0.0, "{v}");
    assert!(rows[1]["decode_tok_s"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(rows[1]["decode_pipelines_built"].as_u64(), Some(0), "{v}");
    assert!(v["read_gbs"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(v["ids_identical"], true, "{v}");
    let e = err(&["bench", "stream", "--model", m, "--slots", "0%"]);
    assert!(e.contains("--slots") && e.contains("\"0%\""), "{e}");
}

/// `bench batch` with a batch larger than the probe's sequence (16-token prompt + 1 step) and no
/// batch of 1: it runs (a decode batch of B sequences is one B-token chunk, so the model's
/// sequences are sized for it), every row's figures are positive, and the "× batch 1" ratio is
/// `null` in the JSON and `-` in the table rather than NaN.
#[test]
fn bench_batch_larger_than_the_probe_and_no_batch_of_one() {
    let m = crate::model_common::fixture("tiny-causal-f32");
    let batch = |sizes: &str| {
        let m = m.to_str().unwrap();
        ok(&[
            "bench", "batch", "--model", m, "--batch", sizes, "--tokens", "1", "--json",
        ])
    };
    let o = batch("2,21");
    let v = json(&o);
    let rows = v["batches"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for (r, b) in rows.iter().zip([2, 21]) {
        assert_eq!(r["batch"], b);
        assert!(r["aggregate_tok_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["step_ms"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["vs_batch_1"].is_null(), "{r}");
    }
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(!text.contains("NaN"), "{text}");
    let row21 = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some("21"))
        .unwrap_or_else(|| panic!("no row for batch 21: {text}"));
    assert_eq!(row21.split_whitespace().nth(4), Some("-"), "{row21}");
    // a batch of 1 after the others is still the ratio's base
    let v = json(&batch("2,1"));
    let rows = v["batches"].as_array().unwrap();
    let agg = |r: &serde_json::Value| r["aggregate_tok_s"].as_f64().unwrap();
    let x = rows[0]["vs_batch_1"].as_f64().unwrap();
    assert!((x - agg(&rows[0]) / agg(&rows[1])).abs() < 1e-9, "{v}");
    assert_eq!(rows[1]["vs_batch_1"], 1.0);
}
