//! Weight slabs on the GPU: the E experts `[O, I]` of one tensor in one encoding, uploaded as
//! binding-sized chunks, or as empty expert slots filled later (the expert cache). The slab
//! knows no kernel: the GEMV and the GEMM bind its chunks.
//!
//! # GPU layout and alignment (enforced here on the host; FORMATS.md, *GPU layout*)
//! [`GpuWeights`] holds the E experts of one tensor in one slab. Each row is stored with its
//! FORMATS.md bytes followed by zero padding up to a whole number of *units*: 16 bytes for f32,
//! bf16, int4 and int4-grouped, 48 bytes (two 64-column groups) for int3-g64. So every row starts
//! 16-byte aligned whatever I is and the kernel reads whole `vec4<u32>` words; the kernel masks
//! columns ≥ I through x, so padding never contributes. int3-g64 groups are stored with their
//! bits in the GPU order of [`slab_layout`] (same bytes per group). Real Inkling shapes
//! (I = 6144, 3072, 4096, 2048) need no padding in any format. Scales are stored unpadded,
//! `[E][O][scales per row]` f32.
//!
//! # Weight chunks
//! The slab is split into chunks (one storage binding each) no larger than the adapter's
//! `max_storage_buffer_binding_size`, `max_buffer_size` and 2³¹ − 1 bytes: by whole experts when
//! an expert fits, else by rows within each expert. One dispatch binds two chunks (bindings 1/2
//! and 7/8; eight storage buffers, WebGPU's default limit), so inkling-small's 2.4 GB routed
//! gate_up runs as one dispatch: the row blocks of chunk 0 come first, then those of chunk 1,
//! and each workgroup picks its chunk once, outside the hot loop (the skeleton's hot loop is
//! written once per chunk). A slab of more chunks takes one dispatch per two; the caller never sees chunks.

use crate::formats::{Encoding, QMatrix};
use crate::gpu::dispatch::{self, DispatchError};
use crate::gpu::linear::format::unit_shape;
use crate::gpu::linear::slab_layout;
use crate::gpu::linear::staging::{RowCopy, StagedCopy, Stager};
use crate::gpu::Gpu;

/// Padded GPU row stride in bytes for `enc` and `cols` (see the module docs).
pub fn gpu_row_stride(enc: Encoding, cols: usize) -> usize {
    let (_, vpu) = unit_shape(enc.format);
    enc.bytes_per_row(cols).next_multiple_of(16 * vpu as usize)
}

/// One binding-sized piece of a slab: experts `e0..e1`, rows `r0..r1` of each.
#[derive(Debug)]
pub struct WeightChunk {
    pub weights: wgpu::Buffer,
    pub scales: wgpu::Buffer,
    pub e0: u32,
    pub e1: u32,
    pub r0: u32,
    pub r1: u32,
}

/// The E experts `[O, I]` of one tensor in one encoding, uploaded to the GPU (see module docs).
/// The encoding travels with the bytes: a [`GpuWeights::bind`] refuses an ordinal other than this one.
#[derive(Debug)]
pub struct GpuWeights {
    enc: Encoding,
    experts: usize,
    rows: usize,
    cols: usize,
    chunks: Vec<WeightChunk>,
}

impl GpuWeights {
    /// Upload E matrices of identical shape and encoding as one slab (E = 1 for a dense matrix).
    pub fn upload(gpu: &Gpu, mats: &[QMatrix]) -> Result<GpuWeights, DispatchError> {
        Self::upload_with_limit(gpu, mats, default_limit(gpu))
    }

    /// [`GpuWeights::upload`] with chunks of at most `limit` bytes (tests use a small limit).
    pub fn upload_with_limit(
        gpu: &Gpu,
        mats: &[QMatrix],
        limit: u64,
    ) -> Result<GpuWeights, DispatchError> {
        let first = mats
            .first()
            .ok_or_else(|| DispatchError::Shape("no matrices to upload".into()))?;
        for (i, m) in mats.iter().enumerate() {
            if m.enc != first.enc || m.rows != first.rows || m.cols != first.cols {
                return Err(DispatchError::Shape(format!(
                    "expert {i} is {} [{}, {}], expert 0 is {} [{}, {}]",
                    m.enc.spelling(),
                    m.rows,
                    m.cols,
                    first.enc.spelling(),
                    first.rows,
                    first.cols
                )));
            }
        }
        let data: Vec<&[u8]> = mats.iter().map(|m| &m.data[..]).collect();
        let scales: Vec<&[u8]> = mats.iter().map(|m| &m.scales[..]).collect();
        Self::build(
            gpu,
            first.enc,
            mats.len(),
            first.rows,
            first.cols,
            &data,
            &scales,
            limit,
        )
    }

    /// Upload straight from raw bytes (e.g. a mapped container): `data` is E·O·row_bytes bytes,
    /// experts then rows, FORMATS.md layout, any alignment; `scales` is E·(scales of one expert)
    /// little-endian f32 as bytes (empty for f32/bf16).
    pub fn from_slab_bytes(
        gpu: &Gpu,
        enc: Encoding,
        experts: usize,
        rows: usize,
        cols: usize,
        data: &[u8],
        scales: &[u8],
    ) -> Result<GpuWeights, DispatchError> {
        Self::from_slab_bytes_with_limit(
            gpu,
            enc,
            experts,
            rows,
            cols,
            data,
            scales,
            default_limit(gpu),
        )
    }

    /// [`GpuWeights::from_slab_bytes`] with chunks of at most `limit` bytes.
    #[allow(clippy::too_many_arguments)]
    pub fn from_slab_bytes_with_limit(
        gpu: &Gpu,
        enc: Encoding,
        experts: usize,
        rows: usize,
        cols: usize,
        data: &[u8],
        scales: &[u8],
        limit: u64,
    ) -> Result<GpuWeights, DispatchError> {
        dispatch::resolve(enc.format.ordinal())?;
        enc.format
            .check_group_size(enc.group_size)
            .map_err(|e| DispatchError::Shape(e.to_string()))?;
        let wb = rows * enc.bytes_per_row(cols);
        let sb = 4 * enc.scale_count(rows, cols);
        if data.len() != experts * wb || scales.len() != experts * sb {
            return Err(DispatchError::Shape(format!(
                "{} slab of {experts}×[{rows}, {cols}] needs {} weight and {} scale bytes, got {} and {}",
                enc.spelling(),
                experts * wb,
                experts * sb,
                data.len(),
                scales.len()
            )));
        }
        let d: Vec<&[u8]> = (0..experts).map(|e| &data[e * wb..(e + 1) * wb]).collect();
        let s: Vec<&[u8]> = (0..experts)
            .map(|e| &scales[e * sb..(e + 1) * sb])
            .collect();
        Self::build(gpu, enc, experts, rows, cols, &d, &s, limit)
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        gpu: &Gpu,
        enc: Encoding,
        experts: usize,
        rows: usize,
        cols: usize,
        data: &[&[u8]],
        scales: &[&[u8]],
        limit: u64,
    ) -> Result<GpuWeights, DispatchError> {
        let (stride, spr, limit) = slab_geometry(gpu, enc, experts, rows, cols, limit)?;
        let rb = enc.bytes_per_row(cols);
        let plan = chunk_plan(experts, rows, stride, limit);
        let mut chunks = Vec::with_capacity(plan.len());
        for (ci, &(e0, e1, r0, r1)) in plan.iter().enumerate() {
            let n_rows = (e1 - e0) * (r1 - r0);
            let wbuf = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(&format!("gemv weights {} chunk {ci}", enc.spelling())),
                size: (n_rows * stride).max(16) as u64,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: true,
            });
            {
                let mut view = wbuf
                    .get_mapped_range_mut(..)
                    .map_err(|e| DispatchError::Shape(format!("mapping a weight chunk: {e:?}")))?;
                let per_expert = (r1 - r0) * stride;
                for (k, src) in data[e0..e1].iter().enumerate() {
                    let rows = &src[r0 * rb..r1 * rb];
                    let mut dst = view.slice(k * per_expert..(k + 1) * per_expert);
                    if rb == stride && !slab_layout::reorders_bits(enc) {
                        dst.copy_from_slice(rows);
                    } else {
                        dst.copy_from_slice(&slab_layout::gpu_rows(enc, rows, rb, stride));
                    }
                }
            }
            wbuf.unmap();
            let mut sbytes = Vec::with_capacity(n_rows * spr * 4);
            for src in &scales[e0..e1] {
                sbytes.extend_from_slice(&src[r0 * spr * 4..r1 * spr * 4]);
            }
            let sbuf = gpu.storage_init(
                &format!("gemv scales {} chunk {ci}", enc.spelling()),
                &sbytes,
            );
            chunks.push(WeightChunk {
                weights: wbuf,
                scales: sbuf,
                e0: e0 as u32,
                e1: e1 as u32,
                r0: r0 as u32,
                r1: r1 as u32,
            });
        }
        Ok(GpuWeights {
            enc,
            experts,
            rows,
            cols,
            chunks,
        })
    }

    /// A slab of `experts` zeroed expert slots `[rows, cols]` in `enc`, to be filled later one
    /// expert at a time with [`GpuWeights::write_expert`] (the expert-cache slot pool). Chunks of
    /// at most `limit` bytes, laid out exactly as an uploaded slab, so a [`GpuWeights::bind`] over it is
    /// a GEMV over whatever experts the slots hold.
    pub fn empty_with_limit(
        gpu: &Gpu,
        enc: Encoding,
        experts: usize,
        rows: usize,
        cols: usize,
        limit: u64,
    ) -> Result<GpuWeights, DispatchError> {
        enc.format
            .check_group_size(enc.group_size)
            .map_err(|e| DispatchError::Shape(e.to_string()))?;
        let (stride, spr, limit) = slab_geometry(gpu, enc, experts, rows, cols, limit)?;
        let chunks = chunk_plan(experts, rows, stride, limit)
            .into_iter()
            .enumerate()
            .map(|(ci, (e0, e1, r0, r1))| {
                let n_rows = (e1 - e0) * (r1 - r0);
                let usage = wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::COPY_SRC;
                WeightChunk {
                    weights: gpu.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some(&format!("expert slots {} chunk {ci}", enc.spelling())),
                        size: (n_rows * stride).max(16) as u64,
                        usage,
                        mapped_at_creation: false,
                    }),
                    scales: gpu.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some(&format!("expert slot scales {} chunk {ci}", enc.spelling())),
                        size: (n_rows * spr * 4).max(16) as u64,
                        usage,
                        mapped_at_creation: false,
                    }),
                    e0: e0 as u32,
                    e1: e1 as u32,
                    r0: r0 as u32,
                    r1: r1 as u32,
                }
            })
            .collect();
        Ok(GpuWeights {
            enc,
            experts,
            rows,
            cols,
            chunks,
        })
    }

    /// Overwrite expert slot `e` with one expert's FORMATS.md bytes through `queue.write_buffer`
    /// (so the write lands before the next submission's commands and after every earlier
    /// submission's). `data` is the expert's `rows` rows as consecutive pieces of whole rows
    /// (e.g. gate rows then up rows); `scales` likewise (little-endian f32 bytes, empty for
    /// f32/bf16). Returns the bytes read from `data` and `scales`.
    ///
    /// Errors: `e` out of range, or pieces that do not add up to `rows` whole rows.
    pub fn write_expert(
        &self,
        queue: &wgpu::Queue,
        e: usize,
        data: &[&[u8]],
        scales: &[&[u8]],
    ) -> Result<u64, DispatchError> {
        let (rb, stride) = (self.enc.bytes_per_row(self.cols), self.row_stride());
        let n = self.expert_segments(e, data, scales, |seg| {
            if seg.weights && (rb != stride || slab_layout::reorders_bits(self.enc)) {
                let rows = slab_layout::gpu_rows(self.enc, seg.src, rb, stride);
                queue.write_buffer(seg.buf, seg.offset, &rows);
            } else {
                queue.write_buffer(seg.buf, seg.offset, seg.src);
            }
            Ok(())
        })?;
        Ok(n)
    }

    /// [`GpuWeights::write_expert`] through staging views the caller fills (in parallel with
    /// [`run_staged`]): one [`StagedCopy`] per piece of at most `max_copy` bytes (at least one
    /// whole row) is pushed onto `out`, its view taken from `stager` (the queue's staging, or a
    /// [`super::staging::StagingRing`] buffer). Weight rows that differ on the GPU (zero padding,
    /// the int3-g64 bit order) are converted by the copy itself. The data reach the slot at the
    /// next submission after the copies ran and were dropped (with a ring: after
    /// [`super::staging::StagingRing::finish`]'s copies). Returns the bytes read from `data` and
    /// `scales`.
    ///
    /// Errors: those of [`GpuWeights::write_expert`], and a staging view that could not be had.
    #[allow(clippy::too_many_arguments)]
    pub fn stage_expert<'s>(
        &self,
        stager: &mut Stager<'_>,
        e: usize,
        data: &[&'s [u8]],
        scales: &[&'s [u8]],
        max_copy: usize,
        out: &mut Vec<StagedCopy<'s>>,
    ) -> Result<u64, DispatchError> {
        let (enc, rb, stride) = (
            self.enc,
            self.enc.bytes_per_row(self.cols),
            self.row_stride(),
        );
        let reorders = slab_layout::reorders_bits(enc);
        // unpadded int3-g64 rows go as stored and are reordered on the GPU where the stager can
        let on_gpu = reorders && rb == stride && stager.reorders_on_gpu();
        let converts = rb != stride || (reorders && !on_gpu);
        let max_copy = max_copy.max(4) & !3;
        self.expert_segments(e, data, scales, |seg| {
            if seg.weights && on_gpu {
                if let Stager::Ring(r) = stager {
                    r.repack_int3(seg.buf, seg.offset, seg.src.len() as u64)?;
                }
            }
            // converted weight pieces are whole rows (source `rb`, destination `stride` each)
            let (piece, dst_piece, rows) = if seg.weights && converts {
                let n = (max_copy / rb).max(1);
                (n * rb, n * stride, Some(RowCopy { enc, rb, stride }))
            } else {
                (max_copy, max_copy, None)
            };
            for (k, part) in seg.src.chunks(piece).enumerate() {
                let len = rows.map_or(part.len(), |r| part.len() / r.rb * r.stride);
                let view = stager.view(seg.buf, seg.offset + (k * dst_piece) as u64, len as u64)?;
                out.push(StagedCopy::new(view, part, rows));
            }
            Ok(())
        })
    }

    /// GPU bytes of one expert slot's weights and scales (the staging a [`GpuWeights::stage_expert`]
    /// of one expert takes: padded rows, unpadded scales).
    pub fn slot_bytes(&self) -> u64 {
        (self.rows * self.row_stride() + 4 * self.enc.scale_count(self.rows, self.cols)) as u64
    }

    /// Padded GPU row stride in bytes.
    fn row_stride(&self) -> usize {
        gpu_row_stride(self.enc, self.cols)
    }

    /// Check one expert's pieces (whole rows adding up to `rows`, slot in range), then hand `f`
    /// every (chunk buffer, byte offset, source bytes) segment they map to: weight rows at the
    /// padded stride, scale rows packed. Returns the bytes of `data` and `scales`.
    fn expert_segments<'s>(
        &self,
        e: usize,
        data: &[&'s [u8]],
        scales: &[&'s [u8]],
        mut f: impl FnMut(Segment<'_, 's>) -> Result<(), DispatchError>,
    ) -> Result<u64, DispatchError> {
        let enc = self.enc;
        let rb = enc.bytes_per_row(self.cols);
        let sb = 4 * enc.scales_per_row(self.cols);
        let stride = self.row_stride();
        if e >= self.experts {
            return Err(DispatchError::Shape(format!(
                "expert slot {e} out of range (the slab has {})",
                self.experts
            )));
        }
        let total: usize = data.iter().map(|d| d.len()).sum();
        let total_s: usize = scales.iter().map(|d| d.len()).sum();
        if total != self.rows * rb
            || total_s != self.rows * sb
            || data.iter().any(|d| d.len() % rb != 0)
            || (sb > 0 && scales.iter().any(|d| d.len() % sb != 0))
        {
            return Err(DispatchError::Shape(format!(
                "{} expert [{}, {}] needs {} weight and {} scale bytes in whole rows, got {total} and {total_s}",
                enc.spelling(),
                self.rows,
                self.cols,
                self.rows * rb,
                self.rows * sb
            )));
        }
        for c in self
            .chunks
            .iter()
            .filter(|c| (c.e0..c.e1).contains(&(e as u32)))
        {
            let (r0, r1) = (c.r0 as usize, c.r1 as usize);
            let base_row = (e - c.e0 as usize) * (r1 - r0);
            for (ps, per, dst_per, buf, weights) in [
                (data, rb, stride, &c.weights, true),
                (scales, sb, sb, &c.scales, false),
            ] {
                if per == 0 {
                    continue;
                }
                let mut pr0 = 0;
                for p in ps {
                    let pr1 = pr0 + p.len() / per;
                    let (a, b) = (pr0.max(r0), pr1.min(r1));
                    if a < b {
                        f(Segment {
                            buf,
                            offset: ((base_row + a - r0) * dst_per) as u64,
                            src: &p[(a - pr0) * per..(b - pr0) * per],
                            weights,
                        })?;
                    }
                    pr0 = pr1;
                }
            }
        }
        Ok((total + total_s) as u64)
    }

    /// The encoding of the uploaded bytes.
    pub fn encoding(&self) -> Encoding {
        self.enc
    }
    /// Number of experts E.
    pub fn experts(&self) -> usize {
        self.experts
    }
    /// Rows O per expert.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Columns I.
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// The binding-sized chunks (normally one).
    pub fn chunks(&self) -> &[WeightChunk] {
        &self.chunks
    }
    /// FORMATS.md bytes (weights + scales) of ONE expert: what a GEMV over it must read.
    pub fn expert_bytes(&self) -> u64 {
        (self.rows * self.enc.bytes_per_row(self.cols)
            + 4 * self.enc.scale_count(self.rows, self.cols)) as u64
    }
}

/// Where a run of one expert's rows goes: a chunk buffer, a byte offset in it, and the source
/// rows (weight rows unpadded; the destination stride is the padded one).
struct Segment<'b, 's> {
    buf: &'b wgpu::Buffer,
    offset: u64,
    src: &'s [u8],
    weights: bool,
}

/// Check a slab's shape against the registry and the adapter; returns the padded GPU row stride,
/// the scales per row and the chunk limit (`limit` capped by [`default_limit`]).
fn slab_geometry(
    gpu: &Gpu,
    enc: Encoding,
    experts: usize,
    rows: usize,
    cols: usize,
    limit: u64,
) -> Result<(usize, usize, u64), DispatchError> {
    dispatch::resolve(enc.format.ordinal())?;
    if experts == 0 || rows == 0 || cols == 0 {
        return Err(DispatchError::Shape(format!(
            "empty weight tensor {experts}×[{rows}, {cols}]"
        )));
    }
    if experts > u32::MAX as usize || rows > u32::MAX as usize || cols > u32::MAX as usize {
        return Err(DispatchError::Shape("dimensions must fit in u32".into()));
    }
    let stride = gpu_row_stride(enc, cols);
    let limit = limit.min(default_limit(gpu));
    if (stride as u64) > limit {
        return Err(DispatchError::Shape(format!(
            "one row of {} [{rows}, {cols}] takes {stride} bytes, more than a binding ({limit} bytes)",
            enc.spelling()
        )));
    }
    Ok((stride, enc.scales_per_row(cols), limit))
}

/// `(e0, e1, r0, r1)` of every binding-sized chunk of a slab: whole experts per chunk when one
/// expert fits `limit`, else each expert split by rows.
fn chunk_plan(
    experts: usize,
    rows: usize,
    stride: usize,
    limit: u64,
) -> Vec<(usize, usize, usize, usize)> {
    let expert_bytes = (rows * stride) as u64;
    let mut plan = Vec::new();
    if expert_bytes <= limit {
        let per = (limit / expert_bytes).max(1) as usize;
        for e0 in (0..experts).step_by(per) {
            plan.push((e0, (e0 + per).min(experts), 0, rows));
        }
    } else {
        let per = (limit / stride as u64) as usize;
        for e in 0..experts {
            for r0 in (0..rows).step_by(per) {
                plan.push((e, e + 1, r0, (r0 + per).min(rows)));
            }
        }
    }
    plan
}

/// Largest chunk: the binding limit, the buffer limit and 2³¹ − 1 bytes (offsets past 2³¹ break
/// on several backends), rounded down to 256 bytes.
pub fn default_limit(gpu: &Gpu) -> u64 {
    let l = gpu
        .max_binding()
        .min(gpu.limits.max_buffer_size)
        .min((1u64 << 31) - 1);
    l & !255
}
