//! `convert` round trips on the fixtures: loaded QMatrix bytes equal `quantize_with()` of the source
//! weights, quantisation error stays within the documented bound per format, bf16 conversion of a
//! BF16 source is byte-identical, the expert slabs are page-aligned and contiguous, interrupted
//! conversions leave nothing under a final name, and the CLI (`convert`, `info`) works.
use inkling_wgpu::container::{
    convert, expert_name, shared_expert_name, Container, ConvertOptions, FailPlan, Proj,
    EXPERT_PROJS,
};
use inkling_wgpu::formats::{quantize_with, Encoding, ScaleRule};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A fresh directory per call: tests running in parallel may convert the same fixture the same way.
fn tmpdir(tag: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("inkling-convert-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn enc(s: &str) -> Encoding {
    Encoding::parse(s).unwrap()
}

/// Source expert matrices of one sparse layer, read independently of the converter:
/// (gate, up, down) per expert as f32 row-major, with I and H.
struct Experts {
    gate: Vec<Vec<f32>>,
    up: Vec<Vec<f32>>,
    down: Vec<Vec<f32>>,
    i: usize,
    h: usize,
}

fn source_experts(src: &Container, layer: usize) -> Option<Experts> {
    let (w13, w2, interleaved) = if src
        .tensor(&format!("model.layers.{layer}.mlp.experts.gate_up_proj"))
        .is_some()
    {
        (
            format!("model.layers.{layer}.mlp.experts.gate_up_proj"),
            format!("model.layers.{layer}.mlp.experts.down_proj"),
            false,
        )
    } else if src
        .tensor(&format!("model.llm.layers.{layer}.mlp.experts.w13_weight"))
        .is_some()
    {
        (
            format!("model.llm.layers.{layer}.mlp.experts.w13_weight"),
            format!("model.llm.layers.{layer}.mlp.experts.w2_weight"),
            true,
        )
    } else {
        return None;
    };
    let shape = src.tensor(&w13).unwrap().1.shape.clone();
    let (e_n, i2, h) = (shape[0], shape[1], shape[2]);
    let i = i2 / 2;
    let a = src.tensor_f32(&w13).unwrap();
    let d = src.tensor_f32(&w2).unwrap();
    let mut ex = Experts {
        gate: vec![],
        up: vec![],
        down: vec![],
        i,
        h,
    };
    for e in 0..e_n {
        let m = &a[e * i2 * h..(e + 1) * i2 * h];
        let rows = |pick: &dyn Fn(usize) -> usize| -> Vec<f32> {
            (0..i)
                .flat_map(|r| m[pick(r) * h..(pick(r) + 1) * h].to_vec())
                .collect()
        };
        if interleaved {
            ex.gate.push(rows(&|r| 2 * r));
            ex.up.push(rows(&|r| 2 * r + 1));
        } else {
            ex.gate.push(rows(&|r| r));
            ex.up.push(rows(&|r| i + r));
        }
        ex.down.push(d[e * h * i..(e + 1) * h * i].to_vec());
    }
    Some(ex)
}

fn rel_err(w: &[f32], d: &[f32]) -> f64 {
    let num: f64 = w.iter().zip(d).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
    let den: f64 = w.iter().map(|a| (*a as f64).powi(2)).sum();
    (num / den).sqrt()
}

/// Documented per-tensor bounds on ‖W − deq(W)‖/‖W‖ (FORMATS.md, section Container), measured on the
/// fixtures' gaussian weights (worst observed values in the doc).
fn bound(spelling: &str) -> f64 {
    match spelling {
        "int4" | "int4-g64" | "int4-g32" | "int4-g128" => 0.13,
        "int3-g64" => 0.30,
        "bf16" => 0.003,
        _ => unreachable!(),
    }
}

fn roundtrip(fix: &str, experts: &str) -> f64 {
    roundtrip_with(fix, experts, ScaleRule::default())
}

/// Convert with `scales`; every routed expert matrix must equal `quantize_with(.., scales)` of
/// its source rows. Returns the worst per-matrix relative error.
fn roundtrip_with(fix: &str, experts: &str, scales: ScaleRule) -> f64 {
    let src_dir = fixture(fix);
    let dst = tmpdir(&format!("rt-{fix}-{experts}-{}", scales.name()));
    let opts = ConvertOptions {
        experts: Some(enc(experts)),
        scales,
        ..Default::default()
    };
    convert(&src_dir, &dst, &opts).unwrap();
    let src = Container::open(&src_dir).unwrap();
    let c = Container::open(&dst).unwrap();
    assert!(c.is_converted());
    let e_enc = enc(experts);
    let mut worst = 0f64;
    let mut sparse = 0;
    for layer in 0..16 {
        let Some(ex) = source_experts(&src, layer) else {
            continue;
        };
        sparse += 1;
        let slab = c.expert_slab(layer).unwrap().expect("slab");
        assert_eq!(slab.offset % 4096, 0, "slab start page-aligned");
        assert_eq!(slab.stride % 4096, 0, "expert stride page-aligned");
        assert_eq!(slab.n_experts, ex.gate.len());
        for e in 0..ex.gate.len() {
            let expert = c.expert_bytes(&slab, e);
            let range = expert.as_ptr_range();
            for (proj, w, rows, cols) in [
                (Proj::Gate, &ex.gate[e], ex.i, ex.h),
                (Proj::Up, &ex.up[e], ex.i, ex.h),
                (Proj::Down, &ex.down[e], ex.h, ex.i),
            ] {
                let q = c.linear(&expert_name(layer, e, proj), rows, cols).unwrap();
                let want = quantize_with(e_enc, w, rows, cols, opts.scales).unwrap();
                assert_eq!(q.enc.format, e_enc.format);
                assert_eq!(
                    &q.data[..],
                    &want.data[..],
                    "{fix} {experts} layer {layer} expert {e} {proj:?}"
                );
                assert_eq!(&q.scales[..], &want.scales[..]);
                assert_eq!(q.dequantize(), want.dequantize());
                // Zero-copy and inside the expert's contiguous range.
                for part in [&q.data[..], &q.scales[..]] {
                    if !part.is_empty() {
                        let p = part.as_ptr_range();
                        assert!(
                            p.start >= range.start && p.end <= range.end,
                            "expert {e} {proj:?} outside its range"
                        );
                    }
                }
                let err = rel_err(w, &q.dequantize());
                worst = worst.max(err);
            }
        }
    }
    assert!(sparse > 0);
    assert!(
        worst <= bound(experts),
        "{fix} {experts}: worst per-tensor relative error {worst:.4} > {}",
        bound(experts)
    );
    eprintln!("{fix} {experts}: worst per-tensor relative error {worst:.4}");
    let _ = std::fs::remove_dir_all(&dst);
    worst
}

/// The default scale search never does worse than absmax on the fixtures' expert matrices, and
/// `--scales absmax` still writes exactly `quantize()`'s absmax bytes.
#[test]
fn mse_scales_beat_absmax_on_the_fixture() {
    for experts in ["int4", "int4-g32", "int3-g64"] {
        let absmax = roundtrip_with("tiny-causal-f32", experts, ScaleRule::Absmax);
        let mse = roundtrip_with("tiny-causal-f32", experts, ScaleRule::Mse);
        assert!(mse < absmax, "{experts}: mse {mse} vs absmax {absmax}");
    }
}

#[test]
fn roundtrip_int4_g64() {
    for f in [
        "tiny-causal-f32",
        "tiny-mm-bf16",
        "tiny-causal-bf16-sharded",
    ] {
        roundtrip(f, "int4-g64");
    }
}

#[test]
fn roundtrip_int3_g64() {
    for f in [
        "tiny-causal-f32",
        "tiny-mm-bf16",
        "tiny-causal-bf16-sharded",
    ] {
        roundtrip(f, "int3-g64");
    }
}

#[test]
fn roundtrip_int4() {
    for f in [
        "tiny-causal-f32",
        "tiny-mm-bf16",
        "tiny-causal-bf16-sharded",
    ] {
        roundtrip(f, "int4");
    }
}

#[test]
fn roundtrip_bf16() {
    for f in [
        "tiny-causal-f32",
        "tiny-mm-bf16",
        "tiny-causal-bf16-sharded",
    ] {
        roundtrip(f, "bf16");
    }
}

/// Released-layout names of the tensors that map one-to-one (NOTES-for-rust.md).
fn released_name(canon: &str) -> Option<String> {
    let fixed = [
        ("model.embed_tokens.weight", "model.llm.embed.weight"),
        (
            "model.embed_tokens.embed_norm.weight",
            "model.llm.embed_norm.weight",
        ),
        ("model.norm.weight", "model.llm.norm.weight"),
        ("lm_head.weight", "model.llm.unembed.weight"),
    ];
    if let Some((_, r)) = fixed.iter().find(|(c, _)| *c == canon) {
        return Some(r.to_string());
    }
    let rest = canon.strip_prefix("model.layers.")?;
    let (n, t) = rest.split_once('.')?;
    let m = match t {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "mlp_norm.weight",
        "self_attn.q_proj.weight" => "attn.wq_du.weight",
        "self_attn.k_proj.weight" => "attn.wk_dv.weight",
        "self_attn.v_proj.weight" => "attn.wv_dv.weight",
        "self_attn.r_proj.weight" => "attn.wr_du.weight",
        "self_attn.o_proj.weight" => "attn.wo_ud.weight",
        "self_attn.q_norm.weight" => "attn.q_norm.weight",
        "self_attn.k_norm.weight" => "attn.k_norm.weight",
        "self_attn.k_sconv.conv1d.weight" => "attn.k_sconv.weight",
        "self_attn.v_sconv.conv1d.weight" => "attn.v_sconv.weight",
        "self_attn.rel_logits_proj.proj" => "attn.rel_logits_proj.proj",
        "attn_sconv.conv1d.weight" => "attn_sconv.weight",
        "mlp_sconv.conv1d.weight" => "mlp_sconv.weight",
        "mlp.down_proj.weight" => "mlp.w2_md.weight",
        "mlp.global_scale" => "mlp.global_scale",
        "mlp.gate.weight" => "mlp.gate.weight",
        "mlp.gate.e_score_correction_bias" => "mlp.gate.bias",
        "mlp.gate.global_scale" => "mlp.gate.global_scale",
        _ => return None,
    };
    Some(format!("model.llm.layers.{n}.{m}"))
}

#[test]
fn bf16_conversion_of_bf16_source_is_byte_identical() {
    for fix in ["tiny-mm-bf16", "tiny-causal-bf16-sharded"] {
        let src_dir = fixture(fix);
        let dst = tmpdir(&format!("bf16id-{fix}"));
        let b = Some(Encoding::BF16);
        let opts = ConvertOptions {
            experts: b,
            shared: b,
            dense: b,
            head: None,
            ..Default::default()
        };
        convert(&src_dir, &dst, &opts).unwrap();
        let src = Container::open(&src_dir).unwrap();
        let c = Container::open(&dst).unwrap();
        let released = fix == "tiny-mm-bf16";
        let mut compared = 0;
        for name in c.names() {
            if name.contains(".experts.") || name.contains(".shared_experts.") {
                continue; // checked below, expert by expert
            }
            let src_name = if released {
                match released_name(name) {
                    Some(n) => n,
                    None => continue, // de-interleaved dense gate/up: checked below
                }
            } else {
                name.to_string()
            };
            let (ss, st) = src
                .tensor(&src_name)
                .unwrap_or_else(|| panic!("{src_name}"));
            let (cs, ct) = c.tensor(name).unwrap();
            assert_eq!(ss.bytes(st), cs.bytes(ct), "{fix}: {name}");
            assert_eq!(st.dtype, ct.dtype);
            compared += 1;
        }
        assert!(compared > 20);
        // Experts and shared experts: each row's bytes equal the source row's bytes.
        for layer in 0..16 {
            let Some(ex) = source_experts(&src, layer) else {
                continue;
            };
            for e in 0..ex.gate.len() {
                for (proj, w, rows, cols) in [
                    (Proj::Gate, &ex.gate[e], ex.i, ex.h),
                    (Proj::Up, &ex.up[e], ex.i, ex.h),
                    (Proj::Down, &ex.down[e], ex.h, ex.i),
                ] {
                    let q = c.linear(&expert_name(layer, e, proj), rows, cols).unwrap();
                    let want: Vec<u8> = w
                        .iter()
                        .flat_map(|v| half::bf16::from_f32(*v).to_bits().to_le_bytes())
                        .collect();
                    assert_eq!(&q.data[..], &want[..]);
                }
            }
            // shared experts exist and are bf16
            for p in EXPERT_PROJS {
                assert!(c.tensor(&shared_expert_name(layer, 0, p)).is_some());
            }
        }
        let _ = std::fs::remove_dir_all(&dst);
    }
}

fn final_files(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn interrupted_convert_leaves_no_final_shard() {
    for (fail, shard_bytes) in [
        (5_000u64, 4usize << 30),
        (60_000, 64 << 10),
        (200_000, 64 << 10),
    ] {
        let dst = tmpdir(&format!("interrupt-{fail}"));
        let opts = ConvertOptions {
            fail: FailPlan {
                fail_after_bytes: Some(fail),
                ..Default::default()
            },
            max_shard_bytes: shard_bytes,
            ..Default::default()
        };
        let e = convert(&fixture("tiny-mm-bf16"), &dst, &opts).unwrap_err();
        assert!(
            format!("{e:#}").contains(&format!("injected write failure after {fail} bytes")),
            "{e:#}"
        );
        let files = final_files(&dst);
        assert!(
            files
                .iter()
                .all(|f| !f.ends_with(".safetensors") && !f.ends_with(".json")),
            "{files:?}"
        );
        assert!(
            files.iter().all(|f| !f.ends_with(".tmp")),
            "temp files are cleaned up: {files:?}"
        );
        // A later conversion into the same directory succeeds without --force.
        convert(
            &fixture("tiny-mm-bf16"),
            &dst,
            &ConvertOptions {
                max_shard_bytes: shard_bytes,
                ..Default::default()
            },
        )
        .unwrap();
        let _ = std::fs::remove_dir_all(&dst);
    }
}

#[test]
fn multi_shard_output_keeps_slabs_whole() {
    let dst = tmpdir("multishard");
    let opts = ConvertOptions {
        max_shard_bytes: 48 << 10,
        ..Default::default()
    };
    let s = convert(&fixture("tiny-causal-f32"), &dst, &opts).unwrap();
    assert!(s.shards.len() > 2, "{:?}", s.shards);
    assert!(dst.join("model.safetensors.index.json").exists());
    let c = Container::open(&dst).unwrap();
    for layer in 1..4 {
        let slab = c.expert_slab(layer).unwrap().unwrap();
        assert_eq!(slab.n_experts, 8);
        assert_eq!(slab.offset % 4096, 0);
    }
    for f in [
        "config.json",
        "tokenizer.json",
        "generation_config.json",
        "tokenizer_config.json",
    ] {
        assert_eq!(
            std::fs::read(dst.join(f)).unwrap(),
            std::fs::read(fixture("tiny-causal-f32").join(f)).unwrap()
        );
    }
    let _ = std::fs::remove_dir_all(&dst);
}

#[test]
fn refuses_source_as_destination_and_previous_conversion() {
    // A copy of a fixture, so that a bug can never touch the real fixture.
    let src = tmpdir("samedir");
    std::fs::create_dir_all(&src).unwrap();
    for e in std::fs::read_dir(fixture("tiny-causal-f32")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), src.join(e.file_name())).unwrap();
    }
    let before = std::fs::read(src.join("model.safetensors")).unwrap();
    let e = convert(&src, &src, &ConvertOptions::default())
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!(
            "the destination {} is the source directory; the source is never modified",
            src.display()
        )
    );
    assert_eq!(
        std::fs::read(src.join("model.safetensors")).unwrap(),
        before
    );

    let dst = tmpdir("previous");
    convert(&src, &dst, &ConvertOptions::default()).unwrap();
    let e = convert(&src, &dst, &ConvertOptions::default())
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!(
            "{} already holds a conversion (model.safetensors); pass --force to replace it",
            dst.display()
        )
    );
    // --force replaces it, also when the new conversion has a different number of shards.
    convert(
        &src,
        &dst,
        &ConvertOptions {
            force: true,
            max_shard_bytes: 64 << 10,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!dst.join("model.safetensors").exists());
    Container::open(&dst).unwrap();
    let _ = std::fs::remove_dir_all(&dst);
    let _ = std::fs::remove_dir_all(&src);
}

#[test]
fn cli_convert_and_info() {
    let exe = env!("CARGO_BIN_EXE_inkling-wgpu");
    let dst = tmpdir("cli");
    let st = std::process::Command::new(exe)
        .args(["convert", "--model"])
        .arg(fixture("tiny-mm-bf16"))
        .arg("--out")
        .arg(&dst)
        .args([
            "--experts",
            "int3-g64",
            "--dense",
            "int4-g64",
            "--shared",
            "bf16",
        ])
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let out = std::process::Command::new(exe)
        .args(["info", "--model"])
        .arg(&dst)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("model.layers.2.mlp.experts.0.gate_proj.weight"),
        "{text}"
    );
    assert!(text.contains("int3-g64"), "{text}");
    assert!(text.contains("int4-g64"), "{text}");
    assert!(
        text.contains("converted container (stamps verified)"),
        "{text}"
    );
    assert!(text.contains("total resident size: "), "{text}");
    // An injected failure in what the command runs: an error, nothing under a final name.
    let dst2 = tmpdir("cli-fail");
    let opts = ConvertOptions {
        fail: FailPlan {
            fail_after_bytes: Some(10000),
            ..Default::default()
        },
        ..Default::default()
    };
    let src2 = fixture("tiny-causal-f32");
    let e = inkling_wgpu::cli::convert::writing_into(&dst2, || convert(&src2, &dst2, &opts))
        .unwrap_err();
    assert!(format!("{e:#}").contains("injected write failure"), "{e:#}");
    assert!(final_files(&dst2).is_empty(), "{:?}", final_files(&dst2));
    let _ = std::fs::remove_dir_all(&dst);
    let _ = std::fs::remove_dir_all(&dst2);
}

/// `convert` and `synth` replace nothing but a previous conversion: a `config.json` (or another
/// side file) or any other file the user put in `--out` stops them, with or without `--force`,
/// and stays as it was; a source checkpoint is refused without suggesting `--force`.
#[test]
fn side_files_and_source_checkpoints_in_out_are_never_replaced() {
    use inkling_wgpu::container::synth::{synth, SynthOptions, SynthSpec};
    let src = fixture("tiny-causal-f32");
    // a side file of the writer's in --out (named as such), or any other file of the user's:
    // refused up front, --force or not, so that a fresh write never leaves a container that a
    // later --force would refuse to replace
    let config: (&str, &[u8]) = ("config.json", b"{\"mine\": 1}");
    let notes: (&str, &[u8]) = ("notes.txt", b"precious");
    for (tag, planted) in [("side", vec![config, notes]), ("foreign", vec![notes])] {
        for force in [false, true] {
            let dst = tmpdir(&format!("{tag}-{force}"));
            std::fs::create_dir_all(&dst).unwrap();
            for (name, bytes) in &planted {
                std::fs::write(dst.join(name), bytes).unwrap();
            }
            let want = if tag == "side" {
                format!(
                    "{} already exists and is not part of a conversion; refusing to replace it, \
                     even with --force (choose another --out)",
                    dst.join("config.json").display()
                )
            } else {
                format!("{} is not empty (it holds notes.txt)", dst.display())
            };
            let opts = ConvertOptions {
                force,
                ..Default::default()
            };
            let e = format!("{:#}", convert(&src, &dst, &opts).unwrap_err());
            assert!(e.contains(&want), "{e}");
            let spec = SynthSpec::preset("tiny", 2).unwrap();
            let sopts = SynthOptions {
                force,
                ..Default::default()
            };
            let e = format!("{:#}", synth(&spec, &dst, &sopts).unwrap_err());
            assert!(e.contains(&want), "{e}");
            for (name, bytes) in &planted {
                assert_eq!(&std::fs::read(dst.join(name)).unwrap(), bytes, "{name}");
            }
            let mut names: Vec<_> = std::fs::read_dir(&dst)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            let want_names: Vec<&str> = planted.iter().map(|p| p.0).collect();
            assert_eq!(names, want_names);
            let _ = std::fs::remove_dir_all(&dst);
        }
    }
    // a copy of a source checkpoint as --out: refused without the --force hint
    let dst = tmpdir("source-as-out");
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    let e = format!(
        "{:#}",
        convert(&src, &dst, &ConvertOptions::default()).unwrap_err()
    );
    assert!(
        e.contains(&format!(
            "{}: a source checkpoint (no container stamp), not a conversion; refusing to replace {}",
            dst.join("model.safetensors").display(),
            dst.display()
        )) && !e.contains("pass --force"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dst);
}
