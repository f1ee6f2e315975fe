//! The model loader on converted containers (`inkling-wgpu convert` output): for every expert
//! format, the loaded linears are exactly `quantize_with()` (default scale rule) of the source weights and borrow the mapped
//! file (routed experts inside their slab); the CPU and GPU forwards on them give the logits of
//! the f32 path on the dequantised weights (1e-5), also over a prompt long enough for the routed
//! experts' prefill GEMM; a bf16-only
//! conversion of a BF16 source reproduces transformers' tokens and the unconverted model's logits
//! bit for bit; `generate --device cpu --json` and `info` work on converted and source
//! directories; a corrupted stamp is refused through `Checkpoint::open`, naming shard and tensor.
use crate::model_common;
use inkling_wgpu::container::{convert, Container, ContainerError, ConvertOptions, STAMP_KEY};
use inkling_wgpu::formats::{quantize_with, Encoding, QMatrix};
use inkling_wgpu::model::generate::generate;
use inkling_wgpu::model::weights::{AttnWeights, DenseMlp, Ffn, LayerWeights, Mlp, MoeWeights};
use inkling_wgpu::model::{
    Checkpoint, CpuModel, GpuModel, GpuModelOptions, Layout, ModelError, Weights,
};
use model_common::*;
use std::borrow::Cow;
use std::path::{Path, PathBuf};

fn enc(s: &str) -> Encoding {
    Encoding::parse(s).unwrap()
}

/// (file name, length, modification time) of every file of a directory.
fn snapshot(dir: &Path) -> Vec<(String, u64, std::time::SystemTime)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                m.len(),
                m.modified().unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

/// Convert fixture `name` into a fresh temp dir (the fixture itself is left untouched).
fn convert_fixture(name: &str, experts: &str, shared: &str, dense: &str) -> PathBuf {
    let before = snapshot(&fixture(name));
    let dst = scratch(&format!("conv-{name}-{experts}"));
    let opts = ConvertOptions {
        experts: Some(enc(experts)),
        shared: Some(enc(shared)),
        dense: Some(enc(dense)),
        ..Default::default()
    };
    convert(&fixture(name), &dst, &opts).unwrap();
    assert_eq!(
        snapshot(&fixture(name)),
        before,
        "{name}: the fixture changed"
    );
    dst
}

/// What the converter does with a linear.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Role {
    /// Copied byte for byte (embedding, router).
    Copy,
    /// `--head keep`: the source precision.
    Head,
    /// `--dense`: attention projections and dense MLPs.
    Dense,
    /// `--shared`.
    Shared,
    /// `--experts`.
    Routed { layer: usize, expert: usize },
}

fn linears<'w, 'a>(w: &'w Weights<'a>) -> Vec<(String, Role, &'w QMatrix<'a>)> {
    let mut v = vec![
        ("embed".to_string(), Role::Copy, &w.embed),
        ("lm_head".to_string(), Role::Head, &w.lm_head),
    ];
    for (i, l) in w.layers.iter().enumerate() {
        let a = &l.attn;
        for (p, m) in [
            ("q", &a.q),
            ("k", &a.k),
            ("v", &a.v),
            ("r", &a.r),
            ("o", &a.o),
        ] {
            v.push((format!("layer {i} attn {p}"), Role::Dense, m));
        }
        match &l.mlp {
            Mlp::Dense(d) => {
                for (p, m) in [
                    ("gate", &d.ffn.gate),
                    ("up", &d.ffn.up),
                    ("down", &d.ffn.down),
                ] {
                    v.push((format!("layer {i} dense {p}"), Role::Dense, m));
                }
            }
            Mlp::Moe(moe) => {
                v.push((format!("layer {i} router"), Role::Copy, &moe.router));
                for (x, f) in moe.experts.iter().enumerate() {
                    for (p, m) in [("gate", &f.gate), ("up", &f.up), ("down", &f.down)] {
                        let role = Role::Routed {
                            layer: i,
                            expert: x,
                        };
                        v.push((format!("layer {i} expert {x} {p}"), role, m));
                    }
                }
                for (x, f) in moe.shared.iter().enumerate() {
                    for (p, m) in [("gate", &f.gate), ("up", &f.up), ("down", &f.down)] {
                        v.push((format!("layer {i} shared {x} {p}"), Role::Shared, m));
                    }
                }
            }
        }
    }
    v
}

/// Whether `inner` lies inside `outer` (same allocation: a view of the mapped file).
fn within(inner: &[u8], outer: &[u8]) -> bool {
    let (i0, o0) = (inner.as_ptr() as usize, outer.as_ptr() as usize);
    i0 >= o0 && i0 + inner.len() <= o0 + outer.len()
}

/// (a): every loaded linear of the converted model equals `quantize_with()` of the source linear in
/// the requested format (default scale rule) (copied tensors: the source bytes), and borrows the mapped file; each
/// routed expert's bytes lie inside that expert's one contiguous slab range.
fn check_linears(name: &str, dst: &Path, experts: &str, shared: &str, dense: &str) {
    let src_ck = Checkpoint::open(&fixture(name)).unwrap();
    let src_w = Weights::load(&src_ck).unwrap();
    let ck = Checkpoint::open(dst).unwrap();
    let c: &Container = ck
        .container()
        .expect("a converted dir opens as a container");
    let w = Weights::load(&ck).unwrap();
    assert_eq!(
        w.layout,
        Layout::Transformers {
            prefix: "model.".into()
        },
        "{name}: converted names are transformers names"
    );
    let (got, want) = (linears(&w), linears(&src_w));
    assert_eq!(got.len(), want.len(), "{name}: number of linears");
    for ((label, role, g), (_, _, s)) in got.iter().zip(&want) {
        let what = format!("{name} --experts {experts}: {label}");
        assert_eq!((g.rows, g.cols), (s.rows, s.cols), "{what}: shape");
        assert!(
            matches!(g.data, Cow::Borrowed(_)) && matches!(g.scales, Cow::Borrowed(_)),
            "{what}: not zero-copy"
        );
        let target = match role {
            Role::Copy | Role::Head => s.enc,
            Role::Dense => enc(dense),
            Role::Shared => enc(shared),
            Role::Routed { .. } => enc(experts),
        };
        let rule = ConvertOptions::default().scales;
        let q = quantize_with(target, &s.dequantize(), s.rows, s.cols, rule).unwrap();
        if *role == Role::Copy {
            assert_eq!(g.enc, s.enc, "{what}: copied tensor changed format");
            assert!(
                g.data[..] == s.data[..],
                "{what}: bytes differ from the source"
            );
        }
        assert_eq!(g.enc.format, target.format, "{what}: format");
        // A group that spans the whole row decodes the same for every group size, so only the
        // scale layout is compared, not the group size picked at verification.
        assert_eq!(
            g.enc.scales_per_row(g.cols),
            target.scales_per_row(g.cols),
            "{what}: scales per row"
        );
        assert!(
            g.data[..] == q.data[..],
            "{what}: weight bytes differ from quantize_with()"
        );
        assert!(
            g.scales[..] == q.scales[..],
            "{what}: scales differ from quantize_with()"
        );
        if let Role::Routed { layer, expert } = *role {
            let slab = c
                .expert_slab(layer)
                .unwrap()
                .expect("a slab per sparse layer");
            let range = c.expert_bytes(&slab, expert);
            assert!(within(&g.data, range), "{what}: weights outside the slab");
            assert!(
                g.scales.is_empty() || within(&g.scales, range),
                "{what}: scales outside the slab"
            );
        }
    }
}

/// `w` with every linear replaced by an F32 matrix of its dequantised values (norms, conv
/// weights and everything else as they are): the plain f32 path computes on exactly the numbers
/// the quantised kernels should compute on.
fn dequantised<'a>(w: &Weights<'a>) -> Weights<'static> {
    fn f32_of(q: &QMatrix<'_>) -> QMatrix<'static> {
        let bytes: Vec<u8> = q
            .dequantize()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        QMatrix::new(
            Encoding::F32,
            q.rows,
            q.cols,
            Cow::Owned(bytes),
            Cow::Owned(Vec::new()),
        )
        .unwrap()
    }
    fn ffn(f: &Ffn<'_>) -> Ffn<'static> {
        Ffn {
            gate: f32_of(&f.gate),
            up: f32_of(&f.up),
            down: f32_of(&f.down),
        }
    }
    Weights {
        config: w.config.clone(),
        layout: w.layout.clone(),
        embed: f32_of(&w.embed),
        embed_norm: w.embed_norm.clone(),
        norm: w.norm.clone(),
        lm_head: f32_of(&w.lm_head),
        layers: w
            .layers
            .iter()
            .map(|l| {
                let a = &l.attn;
                LayerWeights {
                    input_norm: l.input_norm.clone(),
                    attn: AttnWeights {
                        geom: a.geom,
                        q: f32_of(&a.q),
                        k: f32_of(&a.k),
                        v: f32_of(&a.v),
                        r: f32_of(&a.r),
                        o: f32_of(&a.o),
                        q_norm: a.q_norm.clone(),
                        k_norm: a.k_norm.clone(),
                        k_sconv: a.k_sconv.clone(),
                        v_sconv: a.v_sconv.clone(),
                        rel_proj: a.rel_proj.clone(),
                    },
                    attn_sconv: l.attn_sconv.clone(),
                    post_attn_norm: l.post_attn_norm.clone(),
                    mlp: match &l.mlp {
                        Mlp::Dense(d) => Mlp::Dense(DenseMlp {
                            ffn: ffn(&d.ffn),
                            global_scale: d.global_scale,
                        }),
                        Mlp::Moe(m) => Mlp::Moe(MoeWeights {
                            router: f32_of(&m.router),
                            router_bias: m.router_bias.clone(),
                            router_scale: m.router_scale,
                            top_k: m.top_k,
                            route_scale: m.route_scale,
                            experts: m.experts.iter().map(ffn).collect(),
                            shared: m.shared.iter().map(ffn).collect(),
                        }),
                    },
                    mlp_sconv: l.mlp_sconv.clone(),
                }
            })
            .collect(),
    }
}

/// (b) for a quantised model: the teacher-forced logits of case 0 (prompt + the quantised
/// model's own greedy continuation) on the container, by the CPU and by the resident GPU model,
/// equal within 1e-5 per row those of the f32 path on the dequantised weights (the path the
/// fixtures' transformers logits validate); and the greedy tokens are the argmax of those
/// reference logits. A quantised kernel that reads a wrong nibble, scale or group fails this.
fn check_logits(name: &str, dst: &Path) -> Vec<u32> {
    let ck = Checkpoint::open(dst).unwrap();
    let w = Weights::load(&ck).unwrap();
    let deq = dequantised(&w);
    let r = reference(name);
    let c = &r.cases[0];
    let out = generate(
        &mut CpuModel::new(&w),
        &c.prompt_ids,
        &greedy(r.eos.clone(), c.max_new_tokens),
        &mut |_| Ok(()),
    )
    .unwrap();
    assert!(!out.generated_ids.is_empty(), "{name}: nothing generated");
    let mut seq = c.prompt_ids.clone();
    seq.extend_from_slice(&out.generated_ids);
    let want = CpuModel::new(&deq).forward_all(&seq).unwrap();
    let g = crate::ops_util::shared_gpu();
    let mut gpu = GpuModel::new(&g, &w, GpuModelOptions::new(seq.len())).unwrap();
    let on_gpu = gpu.forward_all(&seq).unwrap();
    let on_cpu = CpuModel::new(&w).forward_all(&seq).unwrap();
    // every row of `got` within 1e-5 of the f32 path's on the dequantised weights
    let close = |who: &str, got: &[Vec<f32>], want: &[Vec<f32>]| {
        assert_eq!(got.len(), want.len());
        for (t, (a, b)) in got.iter().zip(want).enumerate() {
            let e = rel_err(a, b);
            assert!(
                e <= 1e-5,
                "{name} {}: {who} on the container vs f32 on the dequantised weights, position {t}: rel err {e:e}",
                dst.display()
            );
        }
    };
    close("CPU", &on_cpu, &want);
    close("GPU", &on_gpu, &want);
    // a prompt long enough that the routed experts' prefill takes the GEMM (at least
    // every format's gemm_min_pairs per expert) in every format: GPU = f32 on the dequantised weights
    let cfg = &w.config;
    let long: Vec<u32> = (0..120u32)
        .map(|k| (k * 37 + 5) % cfg.vocab_size as u32)
        .collect();
    assert!(
        long.len() * cfg.num_experts_per_tok / cfg.n_routed_experts
            >= inkling_wgpu::gpu::linear::format::max_gemm_min_pairs() as usize
    );
    let want_long = CpuModel::new(&deq).forward_all(&long).unwrap();
    let mut gpu = GpuModel::new(&g, &w, GpuModelOptions::new(long.len())).unwrap();
    close(
        "GPU (120-token prompt)",
        &gpu.forward_all(&long).unwrap(),
        &want_long,
    );
    for (t, &id) in out.generated_ids.iter().enumerate() {
        let row = &want[c.prompt_ids.len() - 1 + t];
        assert_eq!(
            id,
            inkling_wgpu::model::sampling::argmax(row),
            "{name}: greedy token {t} vs the dequantised reference"
        );
    }
    out.generated_ids
}

fn per_format(experts: &str, shared: &str, dense: &str) {
    for name in FIXTURES {
        let dst = convert_fixture(name, experts, shared, dense);
        check_linears(name, &dst, experts, shared, dense);
        let ids = check_logits(name, &dst);
        eprintln!("{name} --experts {experts}: greedy {ids:?}");
        let _ = std::fs::remove_dir_all(&dst);
    }
}

#[test]
fn int4_experts_load_exactly_and_generate() {
    per_format("int4", "bf16", "bf16");
}

#[test]
fn int4_g64_experts_load_exactly_and_generate() {
    per_format("int4-g64", "int4-g64", "bf16");
}

#[test]
fn int3_g64_experts_load_exactly_and_generate() {
    per_format("int3-g64", "bf16", "int4-g64");
}

#[test]
fn bf16_experts_load_exactly_and_generate() {
    per_format("bf16", "bf16", "f32");
}

/// (b): bf16-only conversion of a BF16 source: transformers' greedy tokens, and logits bit-equal
/// to the unconverted checkpoint's (and within 1e-4 of transformers').
#[test]
fn bf16_conversion_of_bf16_source_matches_reference_exactly() {
    for name in ["tiny-mm-bf16", "tiny-causal-bf16-sharded"] {
        let dst = convert_fixture(name, "bf16", "bf16", "bf16");
        check_linears(name, &dst, "bf16", "bf16", "bf16");
        let src_ck = Checkpoint::open(&fixture(name)).unwrap();
        let src_w = Weights::load(&src_ck).unwrap();
        let ck = Checkpoint::open(&dst).unwrap();
        let w = Weights::load(&ck).unwrap();
        let r = reference(name);
        let mut m = CpuModel::new(&w);
        for (ci, c) in r.cases.iter().enumerate() {
            let out = generate(
                &mut m,
                &c.prompt_ids,
                &greedy(r.eos.clone(), c.max_new_tokens),
                &mut |_| Ok(()),
            )
            .unwrap();
            assert_eq!(
                out.generated_ids, c.generated_ids,
                "{name} case {ci}: greedy tokens of the converted model"
            );
            let mut seq = c.prompt_ids.clone();
            seq.extend_from_slice(&c.generated_ids[..c.generated_ids.len() - 1]);
            let got = CpuModel::new(&w).forward_all(&seq).unwrap();
            let unconverted = CpuModel::new(&src_w).forward_all(&seq).unwrap();
            let want = reference_logits(name, &c.logits_key);
            assert_eq!(got.len(), want.len());
            for (t, (g, u)) in got.iter().zip(&unconverted).enumerate() {
                assert!(
                    g.iter().zip(u).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{name} case {ci} position {t}: logits differ from the unconverted model"
                );
                let e = rel_err(g, &want[t]);
                assert!(e < 1e-4, "{name} case {ci} position {t}: rel err {e:.3e}");
            }
        }
        let _ = std::fs::remove_dir_all(&dst);
    }
}

fn cli(args: &[&str], model: &Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
        .arg(args[0])
        .arg("--model")
        .arg(model)
        .args(&args[1..])
        .output()
        .unwrap()
}

fn generate_json(model: &Path, prompt: &[u32]) -> serde_json::Value {
    let ids = prompt
        .iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let out = cli(
        &[
            "generate",
            "--prompt-ids",
            &ids,
            "--temperature",
            "0",
            "--device",
            "cpu",
            "--json",
        ],
        model,
    );
    assert!(
        out.status.success(),
        "{}: exit {:?}, stderr: {}",
        model.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.trim().lines().count(), 1, "{stdout}");
    serde_json::from_str(stdout.trim()).unwrap()
}

/// (c): the binary generates on converted dirs; bf16-only reproduces transformers' tokens, int3-g64
/// gives what the library's CPU forward gives on the same container.
#[test]
fn cli_generate_json_on_converted_dirs() {
    let name = "tiny-mm-bf16";
    let r = reference(name);
    let c = &r.cases[0];
    let dst = convert_fixture(name, "bf16", "bf16", "bf16");
    let v = generate_json(&dst, &c.prompt_ids);
    assert_eq!(ids(&v["generated_ids"]), c.generated_ids);
    assert_eq!(v["finish_reason"], c.finish_reason.as_str());
    let _ = std::fs::remove_dir_all(&dst);

    let name = "tiny-causal-f32";
    let dst = convert_fixture(name, "int3-g64", "bf16", "int4-g64");
    let r = reference(name);
    let c = &r.cases[0];
    let v = generate_json(&dst, &c.prompt_ids);
    let lib = check_logits(name, &dst);
    assert_eq!(
        ids(&v["generated_ids"]),
        lib,
        "CLI and library disagree on the same container"
    );
    let _ = std::fs::remove_dir_all(&dst);
}

/// `info` on an unconverted checkpoint: dtype as format per tensor, bytes per format, total.
#[test]
fn info_on_source_checkpoints() {
    for (name, dtype) in [("tiny-causal-f32", "f32"), ("tiny-mm-bf16", "bf16")] {
        let out = cli(&["info"], &fixture(name));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains("source checkpoint (no stamps)"), "{text}");
        let line = text
            .lines()
            .find(|l| l.contains("embed") && l.split_whitespace().count() >= 3)
            .unwrap_or_else(|| panic!("{text}"));
        assert!(line.contains(dtype), "{line}");
        assert!(text.contains(&format!("  {dtype} ")), "{text}");
        let total: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("total resident size: "))
            .and_then(|l| l.split('(').nth(1))
            .and_then(|b| b.split(' ').next())
            .and_then(|b| b.parse().ok())
            .unwrap_or_else(|| panic!("{text}"));
        let c = Container::open(&fixture(name)).unwrap();
        let want: u64 = c
            .names()
            .iter()
            .map(|n| c.tensor(n).unwrap().1.len() as u64)
            .sum();
        assert_eq!(total, want, "{name}: total bytes");
    }
}

/// Rewrite one shard's header with `edit` applied to its stamp map, keeping the header length
/// (the writer pads headers with spaces, so a shorter or equal JSON fits).
fn edit_stamp(shard: &Path, edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let mut bytes = std::fs::read(shard).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let meta = header["__metadata__"].as_object_mut().unwrap();
    let mut stamps: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(meta[STAMP_KEY].as_str().unwrap()).unwrap();
    edit(&mut stamps);
    meta.insert(
        STAMP_KEY.into(),
        serde_json::Value::String(serde_json::to_string(&stamps).unwrap()),
    );
    let mut text = serde_json::to_string(&header).unwrap().into_bytes();
    assert!(text.len() <= n, "edited header does not fit");
    text.resize(n, b' ');
    bytes[8..8 + n].copy_from_slice(&text);
    std::fs::write(shard, bytes).unwrap();
}

/// (d): a corrupted stamp in a copy of a converted container stops `Checkpoint::open` (and so
/// `Weights::load`) with the stamp error, naming shard and tensor.
#[test]
fn corrupted_stamp_is_refused_naming_shard_and_tensor() {
    for name in ["tiny-causal-bf16-sharded", "tiny-causal-f32"] {
        let dst = convert_fixture(name, "int4-g64", "bf16", "bf16");
        let c = Container::open(&dst).unwrap();
        let tensor = c
            .names()
            .into_iter()
            .find(|n| n.contains(".mlp.experts.0.gate_proj.weight"))
            .unwrap()
            .to_string();
        let shard = c.tensor(&tensor).unwrap().0.path.clone();
        drop(c);
        edit_stamp(&shard, |m| {
            assert_eq!(m[&tensor], "int4-grouped");
            m.insert(tensor.clone(), "int3-g64".into());
        });
        let err = match Checkpoint::open(&dst) {
            Ok(_) => panic!("{name}: a wrong stamp was accepted"),
            Err(e) => e,
        };
        let msg = err.to_string();
        match &err {
            ModelError::Container(ContainerError::WrongStamp {
                shard: s,
                tensor: t,
                stamp,
                implied,
                ..
            }) => {
                assert_eq!(s, &shard.display().to_string(), "{msg}");
                assert_eq!(t, &tensor, "{msg}");
                assert_eq!(stamp, "int3-g64", "{msg}");
                assert!(implied.contains("int4-grouped/g64"), "{msg}");
            }
            other => panic!("{name}: expected a wrong-stamp error, got {other:?}"),
        }
        assert!(
            msg.starts_with(&format!(
                "{}: tensor {tensor}: stamp \"int3-g64\" disagrees with the bytes",
                shard.display()
            )),
            "{msg}"
        );

        // A stamp naming no registered format, in the same copy.
        edit_stamp(&shard, |m| {
            m.insert(tensor.clone(), "int5".into());
        });
        let msg = Checkpoint::open(&dst).err().unwrap().to_string();
        assert!(
            msg.starts_with(&format!(
                "{}: tensor {tensor}: stamp \"int5\" is not a format name in the registry",
                shard.display()
            )),
            "{msg}"
        );
        let _ = std::fs::remove_dir_all(&dst);
    }
}

/// The layout of a converted released-layout model comes from its tensor names, not from its
/// (nested, multimodal) config.json.
#[test]
fn converted_names_are_detected_from_tensors_not_config() {
    // tiny-mm-bf16 keeps its nested multimodal config.json, yet its converted tensors use
    // transformers names with per-expert matrices.
    let dst = convert_fixture("tiny-mm-bf16", "int4-g64", "bf16", "bf16");
    let cfg = std::fs::read_to_string(dst.join("config.json")).unwrap();
    assert!(
        cfg.contains("text_config"),
        "config.json was copied verbatim"
    );
    let ck = Checkpoint::open(&dst).unwrap();
    assert_eq!(
        ck.layout().unwrap(),
        Layout::Transformers {
            prefix: "model.".into()
        }
    );
    let w = Weights::load(&ck).unwrap();
    let moe = w
        .layers
        .iter()
        .find_map(|l| match &l.mlp {
            Mlp::Moe(m) => Some(m),
            _ => None,
        })
        .unwrap();
    assert_eq!(moe.experts.len(), w.config.n_routed_experts);
    assert_eq!(moe.shared.len(), w.config.n_shared_experts);
    let _ = std::fs::remove_dir_all(&dst);
}
