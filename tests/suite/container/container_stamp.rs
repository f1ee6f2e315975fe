//! Trust, verify, refuse: each refusal case with its exact error text.
use inkling_wgpu::container::writer::{write_shard, PlannedTensor};
use inkling_wgpu::container::{Container, ContainerError};
use inkling_wgpu::formats::{quantize, Encoding, Format};
use safetensors::Dtype;
use std::path::{Path, PathBuf};

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "inkling-container-stamp-{tag}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn weights(rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols)
        .map(|i| ((i * 7919 % 113) as f32 - 56.0) / 40.0)
        .collect()
}

/// A one-matrix container: tensor `w` [rows, cols] in `enc`, with the given metadata entries.
/// `scales_override` replaces the `.qs` values (to make the scale count disagree).
fn make(
    tag: &str,
    enc: Encoding,
    rows: usize,
    cols: usize,
    meta: &[(&str, &str)],
    scales_override: Option<usize>,
) -> PathBuf {
    let d = tmpdir(tag);
    let q = quantize(enc, &weights(rows, cols), rows, cols).unwrap();
    let mut t = vec![(
        PlannedTensor {
            name: "w".into(),
            dtype: Dtype::U8,
            shape: vec![rows, enc.bytes_per_row(cols)],
            align: 64,
        },
        q.data.to_vec(),
    )];
    let ns = scales_override.unwrap_or(q.scales.len() / 4);
    if ns > 0 {
        let mut s = q.scales.to_vec();
        s.resize(ns * 4, 0);
        t.push((
            PlannedTensor {
                name: "w.qs".into(),
                dtype: Dtype::F32,
                shape: vec![ns],
                align: 64,
            },
            s,
        ));
    }
    let meta: Vec<(String, String)> = meta
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    write_shard(&d.join("model.safetensors"), &t, &meta).unwrap();
    d
}

fn shard(d: &Path) -> String {
    d.join("model.safetensors").display().to_string()
}

fn open_err(d: &Path) -> String {
    match Container::open(d) {
        Ok(_) => panic!("container at {} was accepted", d.display()),
        Err(e) => e.to_string(),
    }
}

const G64: Encoding = Encoding {
    format: Format::Int4Grouped,
    group_size: 64,
};
const SHAPE_4X128: (&str, &str) = ("inkling.shape", r#"{"w":[4,128]}"#);

#[test]
fn agreeing_stamp_is_accepted_and_loads_zero_copy() {
    let d = make(
        "ok",
        G64,
        4,
        128,
        &[("inkling.fmt", r#"{"w":"int4-grouped"}"#), SHAPE_4X128],
        None,
    );
    let c = Container::open(&d).unwrap();
    let q = c.linear("w", 4, 128).unwrap();
    assert_eq!(q.enc, G64);
    assert!(matches!(q.data, std::borrow::Cow::Borrowed(_)));
    assert!(matches!(q.scales, std::borrow::Cow::Borrowed(_)));
    let want = quantize(G64, &weights(4, 128), 4, 128).unwrap();
    assert_eq!(&q.data[..], &want.data[..]);
    assert_eq!(&q.scales[..], &want.scales[..]);
    // The model asking for another shape is refused.
    let e = c.linear("w", 8, 64).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "{}: tensor w: holds a [4, 128] matrix, the model expects [8, 64]",
            shard(&d)
        )
    );
}

#[test]
fn wrong_stamp_is_refused() {
    let d = make(
        "wrong",
        G64,
        4,
        128,
        &[("inkling.fmt", r#"{"w":"int3-g64"}"#), SHAPE_4X128],
        None,
    );
    assert_eq!(
        open_err(&d),
        format!(
            "{}: tensor w: stamp \"int3-g64\" disagrees with the bytes: [4, 128] in int3-g64 needs 192 weight bytes and 8 scales, found 256 bytes and 8 scales; the bytes imply int4-grouped/g64",
            shard(&d)
        )
    );
}

#[test]
fn unknown_format_name_is_refused() {
    let d = make(
        "unknown",
        G64,
        4,
        128,
        &[("inkling.fmt", r#"{"w":"int5"}"#), SHAPE_4X128],
        None,
    );
    assert_eq!(
        open_err(&d),
        format!(
            "{}: tensor w: stamp \"int5\" is not a format name in the registry (FORMATS.md); the bytes imply int4-grouped/g64",
            shard(&d)
        )
    );
}

#[test]
fn disagreeing_scale_count_is_refused() {
    let d = make(
        "scales",
        G64,
        4,
        128,
        &[("inkling.fmt", r#"{"w":"int4-grouped"}"#), SHAPE_4X128],
        Some(12),
    );
    assert_eq!(
        open_err(&d),
        format!(
            "{}: tensor w: stamp \"int4-grouped\" disagrees with the bytes: [4, 128] in int4-grouped needs 256 weight bytes and 16 (g32) or 8 (g64) or 4 (g128) scales, found 256 bytes and 12 scales; the bytes imply no registered format ([4, 128] with 256 weight bytes and 12 scales)",
            shard(&d)
        )
    );
}

#[test]
fn truncated_shard_is_refused() {
    let d = make(
        "trunc",
        G64,
        4,
        128,
        &[("inkling.fmt", r#"{"w":"int4-grouped"}"#), SHAPE_4X128],
        None,
    );
    let p = d.join("model.safetensors");
    let len = std::fs::metadata(&p).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(len - 10).unwrap();
    assert_eq!(
        open_err(&d),
        format!(
            "{}: truncated: tensor data ends at byte {len}, the file has {} bytes",
            shard(&d),
            len - 10
        )
    );
    // Cut inside the header.
    f.set_len(100).unwrap();
    let e = open_err(&d);
    assert!(
        e.starts_with(&format!("{}: truncated: the header needs ", shard(&d))),
        "{e}"
    );
}

#[test]
fn stamp_for_missing_tensor_is_refused() {
    let d = make(
        "missing",
        G64,
        4,
        128,
        &[
            ("inkling.fmt", r#"{"w":"int4-grouped","ghost":"bf16"}"#),
            SHAPE_4X128,
        ],
        None,
    );
    assert_eq!(
        open_err(&d),
        format!("{}: inkling.fmt has an entry for tensor \"ghost\", but the shard has no tensor of that name", shard(&d))
    );
}

#[test]
fn malformed_stamp_json_is_refused() {
    let d = make(
        "malformed",
        G64,
        4,
        128,
        &[("inkling.fmt", r#"{"w": "int4-grouped""#), SHAPE_4X128],
        None,
    );
    assert_eq!(
        open_err(&d),
        format!(
            "{}: malformed inkling.fmt metadata: EOF while parsing an object at line 1 column 20",
            shard(&d)
        )
    );
    let d = make(
        "notobject",
        G64,
        4,
        128,
        &[("inkling.fmt", r#"["w"]"#), SHAPE_4X128],
        None,
    );
    assert_eq!(
        open_err(&d),
        format!("{}: malformed inkling.fmt metadata: invalid type: sequence, expected a JSON object at line 1 column 0", shard(&d))
    );
    let d = make(
        "notstring",
        G64,
        4,
        128,
        &[("inkling.fmt", r#"{"w": 4}"#), SHAPE_4X128],
        None,
    );
    assert_eq!(
        open_err(&d),
        format!("{}: malformed inkling.fmt metadata: invalid type: integer `4`, expected a string at line 1 column 7", shard(&d))
    );
}

#[test]
fn duplicate_claim_is_refused() {
    let d = make(
        "dup",
        G64,
        4,
        128,
        &[
            ("inkling.fmt", r#"{"w":"int4-grouped","w":"int4-grouped"}"#),
            SHAPE_4X128,
        ],
        None,
    );
    assert_eq!(
        open_err(&d),
        format!(
            "{}: inkling.fmt claims tensor \"w\" 2 times; at most one claim per tensor is allowed",
            shard(&d)
        )
    );
}

#[test]
fn no_stamp_unique_inference_is_accepted() {
    let d = make("infer", G64, 4, 128, &[SHAPE_4X128], None);
    let c = Container::open(&d).unwrap();
    assert!(!c.is_converted());
    let q = c.linear("w", 4, 128).unwrap();
    assert_eq!(q.enc, G64);
}

#[test]
fn no_stamp_ambiguous_inference_is_refused() {
    // [4, 64] with one scale per row: int4 per-row, int4-g64 and int4-g128 all fit.
    let d = make(
        "ambiguous",
        G64,
        4,
        64,
        &[("inkling.shape", r#"{"w":[4,64]}"#)],
        None,
    );
    let c = Container::open(&d).unwrap();
    let e = c.linear("w", 4, 64).unwrap_err();
    assert!(matches!(e, ContainerError::Ambiguous { .. }));
    assert_eq!(
        e.to_string(),
        format!(
            "{}: tensor w: no stamp, and the bytes allow several formats (int4, int4-grouped/g64, int4-grouped/g128); refusing to guess",
            shard(&d)
        )
    );
    // The same bytes with a stamp are fine.
    let d = make(
        "ambiguous-stamped",
        G64,
        4,
        64,
        &[
            ("inkling.fmt", r#"{"w":"int4"}"#),
            ("inkling.shape", r#"{"w":[4,64]}"#),
        ],
        None,
    );
    let c = Container::open(&d).unwrap();
    assert_eq!(c.linear("w", 4, 64).unwrap().enc.format, Format::Int4);
}

#[test]
fn stamp_naming_a_format_without_kernel_is_refused() {
    // 4 x 128 int8 bytes + 4 per-row scales, stamped int8.
    let d = tmpdir("nokernel");
    let t = vec![
        (
            PlannedTensor {
                name: "w".into(),
                dtype: Dtype::U8,
                shape: vec![4, 128],
                align: 64,
            },
            vec![0u8; 512],
        ),
        (
            PlannedTensor {
                name: "w.qs".into(),
                dtype: Dtype::F32,
                shape: vec![4],
                align: 64,
            },
            vec![0u8; 16],
        ),
    ];
    let meta = vec![
        ("inkling.fmt".to_string(), r#"{"w":"int8"}"#.to_string()),
        ("inkling.shape".to_string(), r#"{"w":[4,128]}"#.to_string()),
    ];
    write_shard(&d.join("model.safetensors"), &t, &meta).unwrap();
    assert_eq!(
        open_err(&d),
        format!(
            "{}: tensor w: stamp \"int8\" names a format this engine cannot decode (no kernel)",
            shard(&d)
        )
    );
}

#[test]
fn written_shards_are_valid_safetensors_with_aligned_data() {
    let d = make(
        "valid",
        G64,
        4,
        128,
        &[("inkling.fmt", r#"{"w":"int4-grouped"}"#), SHAPE_4X128],
        None,
    );
    let bytes = std::fs::read(d.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!((8 + n) % 4096, 0, "data buffer starts page-aligned");
    assert_eq!(st.tensor("w").unwrap().data().len(), 256);
    assert_eq!(st.tensor("w.qs").unwrap().data().len(), 32);
}

#[test]
fn info_does_not_claim_verified_stamps_for_an_unstamped_blob() {
    // A converted container (it has a stamp map) in which the U8 blob `w` carries no stamp.
    let d = make(
        "info-unstamped",
        G64,
        4,
        64,
        &[("inkling.fmt", "{}"), ("inkling.shape", r#"{"w":[4,64]}"#)],
        None,
    );
    let c = Container::open(&d).unwrap();
    let text = inkling_wgpu::cli::info::report(&c, false);
    assert!(!text.contains("(stamps verified)"), "{text}");
    assert!(
        text.contains("1 U8 tensor(s) carry no stamp") && text.contains("(first: w)"),
        "{text}"
    );
    // With the stamp, info says the stamps are verified.
    let d = make(
        "info-stamped",
        G64,
        4,
        64,
        &[
            ("inkling.fmt", r#"{"w":"int4-grouped"}"#),
            ("inkling.shape", r#"{"w":[4,64]}"#),
        ],
        None,
    );
    let text = inkling_wgpu::cli::info::report(&Container::open(&d).unwrap(), false);
    assert!(
        text.contains("converted container (stamps verified)"),
        "{text}"
    );
}
