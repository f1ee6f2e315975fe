//! RMSNorm rows (wide, many rows), per-head in place, embedding gather + embed_norm (f32 and bf16 shards).
use crate::ops_util;
use inkling_wgpu::gpu::ops::{EmbedNorm, EmbedShard, RmsNorm};
use ops_util::*;

fn ref_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f64> {
    let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
    let inv = 1.0 / (ss / x.len() as f64 + eps as f64).sqrt();
    x.iter()
        .zip(w)
        .map(|(&v, &g)| g as f64 * v as f64 * inv)
        .collect()
}

#[test]
fn rows_wide_and_many() {
    let gpu = gpu();
    // 70000 rows spread over y; 8192 and odd widths loop over the workgroup.
    for (rows, width) in [(3usize, 8192usize), (5, 6145), (7, 37), (70_000, 8)] {
        let mut rng = Rng(rows as u64 * 31 + width as u64);
        let x = rng.vec(rows * width, 3.0);
        let w = rng.vec(width, 1.5);
        let eps = 1e-6;
        let (xb, wb, yb) = (
            buf_f32(&gpu, &x),
            buf_f32(&gpu, &w),
            poisoned(&gpu, rows * width),
        );
        RmsNorm::rows(rows as u32, width as u32, eps)
            .bind(&gpu, &xb, &wb, &yb)
            .unwrap()
            .run(&gpu);
        let r: Vec<f64> = x
            .chunks(width)
            .flat_map(|row| ref_norm(row, &w, eps))
            .collect();
        let y = read(&gpu, &yb, rows * width);
        assert_close(&format!("rms {rows}x{width}"), &y, &r, 1e-5);
        // last row checked on its own too
        assert_close(
            "last row",
            &y[(rows - 1) * width..],
            &r[(rows - 1) * width..],
            1e-5,
        );
    }
}

#[test]
fn per_head_inplace_with_offsets() {
    let gpu = gpu();
    let (t, h, d) = (7usize, 6usize, 16usize);
    let mut rng = Rng(9);
    // First: the contiguous per-head case (rows = T*H, width D) on the first T*H*D values of a larger
    // buffer; the rest must stay untouched. Then: rows of width D every 2D starting at D (offset + stride).
    let x = rng.vec(t * 2 * h * d, 2.0);
    let w = rng.vec(d, 1.0);
    let xb = buf_f32(&gpu, &x);
    let wb = buf_f32(&gpu, &w);
    let norm = RmsNorm {
        rows: (t * h) as u32,
        width: d as u32,
        eps: 1e-6,
        x_off: 0,
        x_stride: d as u32,
        y_off: 0,
        y_stride: d as u32,
    };
    norm.bind_inplace(&gpu, &xb, &wb).unwrap().run(&gpu);
    // first half of buffer (T*H*D values) normalised per head, the rest untouched
    let y = read(&gpu, &xb, x.len());
    let r: Vec<f64> = x[..t * h * d]
        .chunks(d)
        .flat_map(|row| ref_norm(row, &w, 1e-6))
        .collect();
    assert_close("per-head in place", &y[..t * h * d], &r, 1e-5);
    assert_eq!(
        &y[t * h * d..],
        &x[t * h * d..],
        "in-place norm wrote past its rows"
    );
    // offset + stride: rows of width D every 2D starting at D
    let xb = buf_f32(&gpu, &x);
    let rows = x.len() / (2 * d);
    let norm = RmsNorm {
        rows: rows as u32,
        width: d as u32,
        eps: 1e-6,
        x_off: d as u32,
        x_stride: 2 * d as u32,
        y_off: 0,
        y_stride: d as u32,
    };
    norm.bind_inplace(&gpu, &xb, &wb).unwrap().run(&gpu);
    let y = read(&gpu, &xb, x.len());
    for rr in 0..rows {
        let lo = rr * 2 * d;
        assert_eq!(&y[lo..lo + d], &x[lo..lo + d]);
        assert_close(
            "strided",
            &y[lo + d..lo + 2 * d],
            &ref_norm(&x[lo + d..lo + 2 * d], &w, 1e-6),
            1e-5,
        );
    }
}

fn bf16_round(v: f32) -> (u16, f32) {
    let h = half::bf16::from_f32(v);
    (h.to_bits(), h.to_f32())
}

#[test]
fn embed_gather_norm_f32_and_bf16_shards() {
    // 73: f32 variant (bf16 elements straddle u32 words); 12, 128, 4096: vec4 variant (several tokens
    // per workgroup for the short rows, some of them in the other shard).
    for hidden in [73usize, 12, 128, 4096] {
        embed_case(hidden);
    }
}

fn embed_case(hidden: usize) {
    let gpu = shared_gpu();
    let vocab = 50usize;
    let mut rng = Rng(11 + hidden as u64);
    let table = rng.vec(vocab * hidden, 1.0);
    let w = rng.vec(hidden, 1.0);
    let wb = buf_f32(&gpu, &w);
    let ids: Vec<u32> = vec![7, 0, 49, 20, 19, 49, 33];
    let t = ids.len();
    let idb = buf_u32(&gpu, &[&[999u32][..], &ids].concat()); // ids_off = 1
    let emb = EmbedNorm {
        tokens: t as u32,
        hidden: hidden as u32,
        eps: 1e-6,
        ids_off: 1,
    };
    // f32, two shards [0,20) and [20,50)
    let s0 = buf_f32(&gpu, &table[..20 * hidden]);
    let s1 = buf_f32(&gpu, &table[20 * hidden..]);
    let y = poisoned(&gpu, t * hidden);
    let shards = [
        EmbedShard {
            buffer: &s0,
            first_row: 0,
            n_rows: 20,
            bf16: false,
        },
        EmbedShard {
            buffer: &s1,
            first_row: 20,
            n_rows: 30,
            bf16: false,
        },
    ];
    emb.bind(&gpu, &idb, &shards, &wb, &y).unwrap().run(&gpu);
    let r: Vec<f64> = ids
        .iter()
        .flat_map(|&id| ref_norm(&table[id as usize * hidden..][..hidden], &w, 1e-6))
        .collect();
    assert_close(
        &format!("embed f32 {hidden}"),
        &read(&gpu, &y, t * hidden),
        &r,
        1e-5,
    );
    // bf16 table (one shard of odd width: elements straddle u32 words)
    let (bits, vals): (Vec<u16>, Vec<f32>) = table.iter().map(|&v| bf16_round(v)).unzip();
    let tb = gpu.storage_init("bf16 table", bytemuck::cast_slice(&bits));
    let y = poisoned(&gpu, t * hidden);
    emb.bind(
        &gpu,
        &idb,
        &[EmbedShard {
            buffer: &tb,
            first_row: 0,
            n_rows: vocab as u32,
            bf16: true,
        }],
        &wb,
        &y,
    )
    .unwrap()
    .run(&gpu);
    let r: Vec<f64> = ids
        .iter()
        .flat_map(|&id| ref_norm(&vals[id as usize * hidden..][..hidden], &w, 1e-6))
        .collect();
    assert_close(
        &format!("embed bf16 {hidden}"),
        &read(&gpu, &y, t * hidden),
        &r,
        1e-5,
    );
}

#[test]
fn decode_rows_offsets_and_alignment() {
    // One 4096-wide row at an aligned offset (vec4) and at an odd offset (f32 variant); rows of 128
    // (per-head norms: 8 rows per workgroup) with a row count not a multiple of 8; width 4100 (vec4,
    // 1025 units: unrolled loop plus a remainder).
    let gpu = shared_gpu();
    let eps = 1e-5;
    for (rows, width, x_off, y_off) in [
        (1usize, 4096usize, 8192usize, 4usize),
        (1, 4096, 4095, 0),
        (1, 4096, 0, 3),
        (37, 128, 0, 0),
        (3, 4100, 4100, 0),
    ] {
        let mut rng = Rng((rows * 7 + width + x_off) as u64);
        let x = rng.vec(x_off + rows * width, 2.0);
        let w = rng.vec(width, 1.5);
        let (xb, wb, yb) = (
            buf_f32(&gpu, &x),
            buf_f32(&gpu, &w),
            poisoned(&gpu, y_off + rows * width),
        );
        let n = RmsNorm {
            rows: rows as u32,
            width: width as u32,
            eps,
            x_off: x_off as u32,
            x_stride: width as u32,
            y_off: y_off as u32,
            y_stride: width as u32,
        };
        n.bind(&gpu, &xb, &wb, &yb).unwrap().run(&gpu);
        let r: Vec<f64> = x[x_off..]
            .chunks(width)
            .flat_map(|row| ref_norm(row, &w, eps))
            .collect();
        let y = read(&gpu, &yb, y_off + rows * width);
        assert_close(
            &format!("rms {rows}x{width} x_off {x_off} y_off {y_off}"),
            &y[y_off..],
            &r,
            1e-5,
        );
        // in place on the same layout
        let xb = buf_f32(&gpu, &x);
        n.bind_inplace(&gpu, &xb, &wb).unwrap().run(&gpu);
        let y = read(&gpu, &xb, x.len());
        assert_close(
            &format!("in place {rows}x{width} x_off {x_off}"),
            &y[x_off..],
            &r,
            1e-5,
        );
        assert_eq!(&y[..x_off], &x[..x_off], "in-place norm wrote before x_off");
    }
}
