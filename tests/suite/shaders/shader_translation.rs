//! Every WGSL module `inkling-wgpu shaders` writes (every GEMV format × reduction × tuning × x tile
//! × x variant, every op kernel variant, `bench copy`'s kernel) parses and validates with naga
//! (subgroup capabilities only for the subgroup variants) and translates, for its own entry point,
//! to:
//! * MSL at every language version wgpu 30's Metal backend picks on an Apple-silicon Mac
//!   (wgpu-hal `src/metal/adapter.rs`: 2.3 on macOS 11 up to 4.0 on macOS 26), with the buffer
//!   slots and sizes buffer its pipeline layout assigns (`src/metal/device.rs`) and bounds checks
//!   on, as in debug builds;
//! * HLSL at shader model 6.0 (wave operations: wgpu's DX12 backend offers `SUBGROUP` from 6.0
//!   on) and, for the subgroup-free variants, 5.1 (FXC, no `SUBGROUP`);
//! * SPIR-V 1.3 (Vulkan 1.1, subgroups), checked by `spirv-val --target-env vulkan1.1`.
//!
//! Any failure names the pipeline key. The variant count is checked against the format registry,
//! the tunings and the op kernel lists, and every entry point of every module must be listed.
//! The same modules are checked against the limit profiles (workgroup memory, invocations per
//! workgroup, storage buffers per stage) with sizes naga computes.
use inkling_wgpu::formats::{Format, REGISTRY};
use inkling_wgpu::gpu::kernel::{Bind, KernelSpec};
use inkling_wgpu::gpu::limits::LimitProfile;
use inkling_wgpu::gpu::linear::gemv;
use inkling_wgpu::gpu::linear::gemv::x_tiles;
use inkling_wgpu::gpu::linear::route::{candidates, direct_candidates, silu_tuning};
use inkling_wgpu::gpu::variants;
use naga::back::{hlsl, msl, spv};
use naga::valid::{Capabilities, ValidationFlags, Validator};
use std::path::Path;

/// MSL versions wgpu 30 picks on macOS 11, 12, 13, 14, 15 and 26.
const MSL_VERSIONS: [(u8, u8); 6] = [(2, 3), (2, 4), (3, 0), (3, 1), (3, 2), (4, 0)];

/// What the translation of one entry point gave.
struct Translated {
    /// Storage buffers the entry point uses.
    storage_buffers: u32,
    spirv: Vec<u32>,
}

fn parse_validate(spec: &KernelSpec) -> Result<(naga::Module, naga::valid::ModuleInfo), String> {
    let src = &spec.source;
    let module = naga::front::wgsl::parse_str(src)
        .map_err(|e| format!("parse: {}", e.emit_to_string(src)))?;
    let caps = if spec.subgroups {
        Capabilities::SUBGROUP | Capabilities::SUBGROUP_BARRIER
    } else {
        Capabilities::empty()
    };
    let info = Validator::new(ValidationFlags::all(), caps)
        .validate(&module)
        .map_err(|e| format!("validate: {}", e.emit_to_string(src)))?;
    Ok((module, info))
}

/// Translate one kernel; Err names what failed.
fn translate(spec: &KernelSpec) -> Result<Translated, String> {
    let (module, info) = parse_validate(spec)?;
    let ep_index = module
        .entry_points
        .iter()
        .position(|e| e.name == spec.entry)
        .ok_or_else(|| format!("no entry point {}", spec.entry))?;
    let ep_info = info.get_entry_point(ep_index);

    // the buffers the entry point uses, against the layout the engine declares
    let mut storage_buffers = 0u32;
    for (h, var) in module.global_variables.iter() {
        if ep_info[h].is_empty() {
            continue;
        }
        let want = match var.space {
            naga::AddressSpace::Uniform => Bind::Uniform,
            naga::AddressSpace::Storage { access }
                if access.contains(naga::StorageAccess::STORE) =>
            {
                Bind::Write
            }
            naga::AddressSpace::Storage { .. } => Bind::Read,
            _ => continue,
        };
        if want != Bind::Uniform {
            storage_buffers += 1;
        }
        let rb = var.binding.as_ref().ok_or("a buffer without a binding")?;
        let declared = spec.binds.iter().find(|b| b.0 == rb.binding);
        if rb.group != 0 || declared.map(|b| b.1) != Some(want) {
            return Err(format!(
                "binding {} ({:?}) is used as {want:?} but the layout declares {declared:?}",
                rb.binding, var.name
            ));
        }
    }

    // MSL, with the slots wgpu-hal's Metal pipeline layout assigns: buffers in layout order,
    // then the sizes buffer (runtime-sized storage arrays)
    let mut resources = std::collections::BTreeMap::new();
    for (slot, &(binding, b)) in spec.binds.iter().enumerate() {
        resources.insert(
            naga::ResourceBinding { group: 0, binding },
            msl::BindTarget {
                buffer: Some(slot as u8),
                mutable: b == Bind::Write,
                ..Default::default()
            },
        );
    }
    let slots = spec.binds.len() as u8;
    if slots + 1 > 31 {
        return Err(format!("{} buffer slots > Metal's 31", slots + 1));
    }
    let per_entry_point_map = msl::EntryPointResourceMap::from([(
        spec.entry.clone(),
        msl::EntryPointResources {
            resources,
            immediates_buffer: None,
            sizes_buffer: Some(slots),
        },
    )]);
    let restrict = naga::proc::BoundsCheckPolicy::Restrict;
    for lang_version in MSL_VERSIONS {
        let options = msl::Options {
            lang_version,
            per_entry_point_map: per_entry_point_map.clone(),
            fake_missing_bindings: false,
            bounds_check_policies: naga::proc::BoundsCheckPolicies {
                index: restrict,
                buffer: restrict,
                image_load: restrict,
                binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
            },
            zero_initialize_workgroup_memory: true,
            ..Default::default()
        };
        let pipeline = msl::PipelineOptions {
            entry_point: Some((naga::ShaderStage::Compute, spec.entry.clone())),
            ..Default::default()
        };
        msl::write_string(&module, &info, &options, &pipeline)
            .map_err(|e| format!("MSL {}.{}: {e:?}", lang_version.0, lang_version.1))?;
    }

    // HLSL: 6.0 (wave ops) always, 5.1 (FXC) for the subgroup-free variants
    let models: &[hlsl::ShaderModel] = if spec.subgroups {
        &[hlsl::ShaderModel::V6_0]
    } else {
        &[hlsl::ShaderModel::V5_1, hlsl::ShaderModel::V6_0]
    };
    for &shader_model in models {
        let options = hlsl::Options {
            shader_model,
            zero_initialize_workgroup_memory: true,
            restrict_indexing: true,
            force_loop_bounding: true,
            ..Default::default()
        };
        let pipeline = hlsl::PipelineOptions {
            entry_point: Some((naga::ShaderStage::Compute, spec.entry.clone())),
        };
        let mut out = String::new();
        hlsl::Writer::new(&mut out, &options, &pipeline)
            .write(&module, &info, None)
            .map_err(|e| format!("HLSL {shader_model:?}: {e:?}"))?;
    }

    let options = spv::Options {
        lang_version: (1, 3),
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: restrict,
            buffer: restrict,
            image_load: restrict,
            binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
        },
        ..Default::default()
    };
    let pipeline = spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: spec.entry.clone(),
    };
    let spirv = spv::write_vec(&module, &info, &options, Some(&pipeline))
        .map_err(|e| format!("SPIR-V: {e:?}"))?;
    Ok(Translated {
        storage_buffers,
        spirv,
    })
}

/// Run `f` over `items` on every core; results in order.
fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let chunk = items.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .map(|c| s.spawn(|| c.iter().map(&f).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("translation thread panicked"))
            .collect()
    })
}

/// The GEMV variant count from the registry rows with a GPU kernel (each group size of a grouped
/// format) and the tuning lists, on a device with `smem` bytes of workgroup memory.
fn expected_gemv(smem: u64, subgroups: bool) -> usize {
    let mut n = 0;
    for row in REGISTRY.iter().filter(|r| r.gpu_kernel) {
        let encodings = if row.format == Format::Int4Grouped {
            row.group_sizes.len()
        } else {
            1
        };
        // the tunings (silu-capable ones only when `silu`), x tiles sized with the epilogue's
        // row sums when `sums`
        let count = |silu: bool, sums: bool| -> usize {
            let staged: usize = candidates(row.format)
                .iter()
                .filter(|&&t| !silu || silu_tuning(t))
                .map(|&t| x_tiles(row.format, t, smem, sums).len())
                .sum();
            let direct = if matches!(row.format, Format::F32 | Format::Bf16) {
                direct_candidates()
                    .iter()
                    .filter(|&&t| !silu || silu_tuning(t))
                    .count()
            } else {
                0
            };
            staged + direct
        };
        // × (one or two weight chunks bound per dispatch, or one chunk with output segments), plus
        // one or two chunks with the silu·up epilogue on the tunings that can run it, plus one
        // chunk with the short-conv epilogue on every tuning
        let per = count(false, false) * 3 + count(true, true) * 2 + count(false, true);
        n += encodings * (1 + subgroups as usize) * per;
    }
    n
}

/// The GEMM variant count: every GEMV kernel encoding × the GEMM tiles, plus the grouping pass
/// of each BN among the tiles (one pass serves every tile of its BN).
fn expected_gemm() -> usize {
    let encs = inkling_wgpu::gpu::linear::kernel_encodings().len();
    let tiles = inkling_wgpu::gpu::linear::route::TILES;
    let mut bns: Vec<u32> = tiles.iter().map(|t| t.pairs()).collect();
    bns.sort();
    bns.dedup();
    encs * tiles.len() + bns.len()
}

/// Op kernels per WGSL file: attention (2 entry points × f32/vec4), fused attention (the FUSED
/// attention × f32/vec4, alone and batched, the prologue), conv (single, pair, combine; single and
/// combine batched), elementwise (5 entry points), norm
/// (rms_norm out/in place and embed_norm × f32/vec4), router (1), split (1); then `bench copy`.
const EXPECTED_OPS: usize = 4 + 5 + 5 + 5 + 6 + 1 + 1;

fn spirv_val(dir: &Path, files: &[std::path::PathBuf]) -> Vec<String> {
    let probe = std::process::Command::new("spirv-val")
        .arg("--version")
        .output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "spirv-val (SPIRV-Tools) is needed to validate the SPIR-V: apt-get install spirv-tools \
         (brew install spirv-tools on macOS)"
    );
    par_map(files, |f| {
        let out = std::process::Command::new("spirv-val")
            .args(["--target-env", "vulkan1.1"])
            .arg(f)
            .output()
            .expect("spirv-val runs");
        if out.status.success() {
            String::new()
        } else {
            format!(
                "{}: spirv-val: {}{}",
                f.strip_prefix(dir).unwrap_or(f).display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        }
    })
    .into_iter()
    .filter(|e| !e.is_empty())
    .collect()
}

#[test]
fn every_shader_translates_to_msl_hlsl_and_valid_spirv() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("inkling-shaders-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let written = inkling_wgpu::cli::shaders::write(&dir, None).unwrap();
    // the count: registry × tunings × tiles for the GEMV, the op kernel lists, the int3-g64
    // reorder, bench copy
    let gemv_n = written
        .iter()
        .filter(|w| w.0.key.starts_with("gemv:"))
        .count();
    assert_eq!(gemv_n, expected_gemv(u64::MAX, true), "GEMV variants");
    let gemm_n = written
        .iter()
        .filter(|w| w.0.key.starts_with("gemm"))
        .count();
    assert_eq!(gemm_n, expected_gemm(), "GEMM variants");
    // the sample of GEMV pairs: per reduction and kernel encoding, the bf16 direct GEMV beside
    // the encoding's default GEMV with silu·up (where its default tuning takes it) and without
    let pairs_n = written
        .iter()
        .filter(|w| w.0.key.starts_with("gemv-pair["))
        .count();
    let expected_pairs: usize = 2 * inkling_wgpu::gpu::linear::kernel_encodings()
        .iter()
        .map(|e| 1 + silu_tuning(inkling_wgpu::gpu::linear::route::tuning(e.format)) as usize)
        .sum::<usize>();
    assert_eq!(pairs_n, expected_pairs, "GEMV pairs");
    assert_eq!(
        written.len() - gemv_n - gemm_n - pairs_n,
        EXPECTED_OPS + 2,
        "op kernels + the int3-g64 reorder + bench copy"
    );
    eprintln!(
        "{} kernels: {gemv_n} GEMV, {gemm_n} GEMM, {} op, 1 int3-g64 reorder, 1 bench copy",
        written.len(),
        EXPECTED_OPS
    );
    // what was written is what is translated
    let specs: Vec<KernelSpec> = written
        .iter()
        .map(|(s, path)| {
            let text = std::fs::read_to_string(path).unwrap();
            let (header, body) = text.split_once('\n').unwrap();
            assert!(header.contains(&s.key), "{}", path.display());
            assert_eq!(body, s.source, "{}", path.display());
            s.clone()
        })
        .collect();
    let results = par_map(&specs, translate);
    let mut errors = Vec::new();
    let mut spv_files = Vec::new();
    let spv_dir = dir.join("spv");
    std::fs::create_dir_all(&spv_dir).unwrap();
    let mut entry_points = std::collections::BTreeSet::new();
    for (s, r) in specs.iter().zip(&results) {
        match r {
            Ok(m) => {
                let f = spv_dir.join(inkling_wgpu::cli::shaders::file_name(&s.key) + ".spv");
                let bytes: Vec<u8> = m.spirv.iter().flat_map(|w| w.to_le_bytes()).collect();
                std::fs::write(&f, bytes).unwrap();
                spv_files.push(f);
                assert_eq!(m.storage_buffers, s.storage_buffers(), "{}", s.key);
            }
            Err(e) => errors.push(format!("{}: {e}", s.key)),
        }
    }
    errors.extend(spirv_val(&spv_dir, &spv_files));
    assert!(
        errors.is_empty(),
        "{} of {} kernels failed:\n{}",
        errors.len(),
        specs.len(),
        errors.join("\n")
    );
    // every entry point of every module is some kernel's
    for s in specs.iter().filter(|s| !s.key.starts_with("gemv:")) {
        let (module, _) = parse_validate(s).unwrap();
        for ep in &module.entry_points {
            entry_points.insert(ep.name.clone());
        }
    }
    for ep in &entry_points {
        assert!(
            specs.iter().any(|s| &s.entry == ep),
            "entry point {ep} is in a WGSL file but no listed kernel uses it"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn every_kernel_of_a_profile_fits_its_limits_or_the_device_check_names_the_limit() {
    for p in LimitProfile::ALL {
        let Some(limits) = p.limits() else {
            // no-subgroups keeps the adapter's limits: only the variant set changes
            let specs = variants::all(Some(p));
            assert!(specs.iter().all(|s| !s.subgroups));
            assert_eq!(
                specs.iter().filter(|s| s.key.starts_with("gemv:")).count(),
                expected_gemv(u64::MAX, false)
            );
            continue;
        };
        let specs = variants::all(Some(p));
        let smem = limits.max_compute_workgroup_storage_size as u64;
        assert_eq!(
            specs.iter().filter(|s| s.key.starts_with("gemv:")).count(),
            expected_gemv(smem, p.subgroups()),
            "{p}"
        );
        let device_check = variants::check_limits(&limits, Some(p), true);
        let measured = par_map(&specs, |s| {
            let (module, info) = parse_validate(s).unwrap();
            let i = module
                .entry_points
                .iter()
                .position(|e| e.name == s.entry)
                .unwrap();
            let mut layouter = naga::proc::Layouter::default();
            layouter.update(module.to_ctx()).unwrap();
            let ep_info = info.get_entry_point(i);
            let wg: u64 = module
                .global_variables
                .iter()
                .filter(|(h, v)| {
                    v.space == naga::AddressSpace::WorkGroup && !ep_info[*h].is_empty()
                })
                .map(|(_, v)| layouter[v.ty].size as u64)
                .sum();
            (wg, module.entry_points[i].workgroup_size)
        });
        let mut over_buffers = Vec::new();
        for (s, (wg, size)) in specs.iter().zip(measured) {
            assert!(
                wg <= smem,
                "{p}: {} uses {wg} bytes of workgroup memory > {smem}",
                s.key
            );
            assert!(
                size.iter().product::<u32>() <= limits.max_compute_invocations_per_workgroup
                    && size[0] <= limits.max_compute_workgroup_size_x,
                "{p}: {} workgroup {size:?}",
                s.key
            );
            // the GEMV's output-segment and short-conv variants (9 storage buffers) are optional:
            // the engine falls back to a packed output, or o_proj then the conv, where they do
            // not fit (`GpuWeights::segments_fit`, `GpuWeights::conv_fits`)
            let optional =
                s.key.starts_with("gemv:") && (s.key.ends_with(":seg") || s.key.ends_with(":conv"));
            let over = s.storage_buffers() > limits.max_storage_buffers_per_shader_stage;
            if over && s.key.contains("+batch") {
                // the decode batch's kernels: GpuModel::new refuses sequence slots there
                assert!(
                    limits.max_storage_buffers_per_shader_stage
                        < inkling_wgpu::model::gpu::BATCH_STORAGE_BUFFERS
                        && s.storage_buffers() <= inkling_wgpu::model::gpu::BATCH_STORAGE_BUFFERS,
                    "{p}: {}",
                    s.key
                );
            } else if over && !optional {
                over_buffers.push(s.key.clone());
            }
            // the GEMV's host-side workgroup-memory formula is naga's size
            if let Some(rest) = s.key.strip_prefix("gemv:") {
                let parts: Vec<&str> = rest.split(':').collect();
                let enc = inkling_wgpu::formats::Encoding::parse(parts[0]).unwrap();
                let (tpr, rpt) = parts[2].split_once('x').unwrap();
                let t = inkling_wgpu::gpu::linear::Tuning {
                    tpr: tpr.parse().unwrap(),
                    rpt: rpt.parse().unwrap(),
                };
                let direct = parts[3] == "xdirect";
                let xt: u32 = parts[4].parse().unwrap();
                assert_eq!(
                    gemv::workgroup_bytes(
                        enc.format,
                        t,
                        xt,
                        direct,
                        s.key.ends_with(":silu") || s.key.ends_with(":conv")
                    ),
                    wg,
                    "{}",
                    s.key
                );
            }
        }
        // the only kernels over a profile's buffer limit are the ones the device check refuses
        match (&device_check, over_buffers.first()) {
            (Ok(()), None) => {}
            (Err(e), Some(k)) => {
                assert_eq!(e.limit, "max_storage_buffers_per_shader_stage", "{p}");
                assert_eq!(&e.kernel, k, "{p}");
                eprintln!("{p}: {e}");
            }
            (r, k) => panic!("{p}: device check {r:?}, kernels over the limit: {k:?}"),
        }
    }
}
