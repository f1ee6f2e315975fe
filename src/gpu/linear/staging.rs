//! How host bytes reach the slots of a slab ([`super::slab::GpuWeights::stage_expert`]): each
//! piece gets a staging view ([`Stager`]), the copies into the views run on several threads
//! ([`run_staged`]), and the GPU copies the staging into the slots.
//!
//! Two kinds of staging:
//! * the queue's (`queue.write_buffer_with`): a fresh staging buffer per piece, copied at the next
//!   submission; simple, used for the one-off hot-set upload at start-up;
//! * a [`StagingRing`]: a few `MAP_WRITE | COPY_SRC` buffers allocated once and mapped again after
//!   each use, so the streaming uploads of every layer write into memory that is already
//!   allocated, mapped and faulted in (a fresh host-visible allocation per piece costs its page
//!   faults and the driver's pinning on every upload), and one buffer's transfer to the GPU runs
//!   while the host fills the next.
use crate::formats::Encoding;
use crate::gpu::call::{self, Dispatch};
use crate::gpu::dispatch::DispatchError;
use crate::gpu::kernel::{Bind, Kernel};
use crate::gpu::linear::slab_layout;
use crate::gpu::Gpu;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

/// Destination bytes converted at a time by a staged copy of converted rows (fits the L2 cache).
const CONVERT_BLOCK: usize = 256 << 10;

/// Sub-allocations in a ring buffer start at multiples of this (wgpu's map alignment is 8, its
/// copy alignment 4).
const RING_ALIGN: u64 = 256;

/// How a staged piece of whole weight rows becomes GPU rows ([`slab_layout::write_gpu_rows`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowCopy {
    pub enc: Encoding,
    /// FORMATS.md bytes per row (the source).
    pub rb: usize,
    /// GPU bytes per row (the staging view).
    pub stride: usize,
}

/// A staging view: the queue's, or a range of a mapped ring buffer.
pub enum StageView {
    Queue(wgpu::QueueWriteBufferView),
    Mapped(wgpu::BufferViewMut),
}

impl StageView {
    fn write(&mut self, at: usize, src: &[u8]) {
        match self {
            StageView::Queue(v) => v.slice(at..at + src.len()).copy_from_slice(src),
            StageView::Mapped(v) => v.slice(at..at + src.len()).copy_from_slice(src),
        }
    }
}

/// Where [`super::slab::GpuWeights::stage_expert`] takes its views.
pub enum Stager<'a> {
    /// `queue.write_buffer_with`: the data reach the GPU at the next submission.
    Queue(&'a wgpu::Queue),
    /// The current buffer of a ring ([`StagingRing::begin`] first): the data reach the GPU
    /// through the copies [`StagingRing::finish`] records.
    Ring(&'a mut StagingRing),
}

impl Stager<'_> {
    /// A view of `size` bytes that lands at `offset` of `dst`.
    pub(crate) fn view(
        &mut self,
        dst: &wgpu::Buffer,
        offset: u64,
        size: u64,
    ) -> Result<StageView, DispatchError> {
        let n = wgpu::BufferSize::new(size)
            .ok_or_else(|| DispatchError::Shape("empty expert piece".into()))?;
        match self {
            Stager::Queue(q) => q
                .write_buffer_with(dst, offset, n)
                .map(StageView::Queue)
                .ok_or_else(|| DispatchError::Shape("the queue refused a staging buffer".into())),
            Stager::Ring(r) => r.view(dst, offset, size).map(StageView::Mapped),
        }
    }

    /// Whether int3-g64 rows can be staged as stored and reordered on the GPU (a ring can).
    pub(crate) fn reorders_on_gpu(&self) -> bool {
        matches!(self, Stager::Ring(_))
    }
}

/// One pending copy of [`super::slab::GpuWeights::stage_expert`]: a staging view and the bytes
/// it must receive (converted to GPU rows on the way when `rows` says so). `Send`, so the copies
/// of several experts can run on several threads.
pub struct StagedCopy<'s> {
    view: StageView,
    src: &'s [u8],
    rows: Option<RowCopy>,
}

impl<'s> StagedCopy<'s> {
    pub(crate) fn new(view: StageView, src: &'s [u8], rows: Option<RowCopy>) -> StagedCopy<'s> {
        StagedCopy { view, src, rows }
    }

    /// Bytes to read from the source.
    pub fn len(&self) -> usize {
        self.src.len()
    }

    /// Whether there is nothing to copy.
    pub fn is_empty(&self) -> bool {
        self.src.is_empty()
    }

    /// Copy the bytes into the staging view (reading a mapped file here is where the page
    /// cache or the disk is read), as GPU rows where they differ. Returns the view: dropping a
    /// queue view queues its GPU-side copy; a ring view must be dropped before
    /// [`StagingRing::finish`].
    pub fn run(mut self) -> StageView {
        match self.rows {
            // converted in blocks of rows through a small buffer (the view is write-only)
            Some(r) => {
                let per = (CONVERT_BLOCK / r.stride).max(1);
                let mut tmp = vec![0u8; per * r.stride];
                for (k, rows) in self.src.chunks(per * r.rb).enumerate() {
                    let n = rows.len() / r.rb * r.stride;
                    slab_layout::write_gpu_rows(r.enc, rows, r.rb, r.stride, &mut tmp[..n]);
                    self.view.write(k * per * r.stride, &tmp[..n]);
                }
            }
            None => self.view.write(0, self.src),
        }
        self.view
    }
}

/// Run staged copies on up to `threads` threads (inline when there is little to copy), so the
/// reads of several experts (page cache or NVMe) and their copies proceed in parallel. The views
/// are dropped (queue views: their GPU copies queued) on the calling thread, inside whatever
/// error scope it has pushed.
pub fn run_staged(copies: Vec<StagedCopy<'_>>, threads: usize) {
    let total: usize = copies.iter().map(|c| c.len()).sum();
    let threads = threads.clamp(1, copies.len().max(1));
    if threads == 1 || total < (4 << 20) {
        copies.into_iter().for_each(|c| drop(c.run()));
        return;
    }
    // largest first onto the least loaded thread
    let mut copies = copies;
    copies.sort_by_key(|c| std::cmp::Reverse(c.len()));
    let mut bins: Vec<(usize, Vec<StagedCopy<'_>>)> =
        (0..threads).map(|_| (0, Vec::new())).collect();
    for c in copies {
        let b = bins.iter_mut().min_by_key(|b| b.0).expect("threads ≥ 1");
        b.0 += c.len();
        b.1.push(c);
    }
    let views: Vec<Vec<StageView>> = std::thread::scope(|s| {
        let handles: Vec<_> = bins
            .into_iter()
            .map(|(_, bin)| s.spawn(move || bin.into_iter().map(StagedCopy::run).collect()))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("an upload copy thread panicked"))
            .collect()
    });
    drop(views);
}

/// A ring buffer's state, set by its map callback.
const MAPPED: u8 = 0;
const PENDING: u8 = 1;
const FAILED: u8 = 2;

struct RingBuffer {
    buf: wgpu::Buffer,
    state: Arc<AtomicU8>,
    /// The submission that last read it (waited for before it is written again).
    last: Option<wgpu::SubmissionIndex>,
}

/// A ring of staging buffers that stay allocated (see the module docs). Per batch of pieces:
/// [`StagingRing::begin`] (waits until the next buffer is mapped again), views through
/// [`Stager::Ring`], [`run_staged`], [`StagingRing::finish`] into an encoder (unmaps, records the
/// copies to the slots), submit, [`StagingRing::submitted`] (maps it again once the GPU is done).
pub struct StagingRing {
    bufs: Vec<RingBuffer>,
    size: u64,
    cur: usize,
    /// Bytes handed out in the current buffer.
    used: u64,
    /// `(destination, destination offset, ring offset, size)` of the current batch.
    copies: Vec<(wgpu::Buffer, u64, u64, u64)>,
    /// `(destination, byte offset, bytes)` of int3-g64 rows copied as stored, reordered on the
    /// GPU after the copies ([`Int3RepackKey`]).
    repacks: Vec<(wgpu::Buffer, u64, u64)>,
    open: bool,
}

impl StagingRing {
    /// `n` buffers of `size` bytes each (mapped at creation).
    pub fn new(gpu: &Gpu, n: usize, size: u64) -> StagingRing {
        let size = size.next_multiple_of(RING_ALIGN);
        let bufs = (0..n.max(1))
            .map(|i| RingBuffer {
                buf: gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(&format!("expert upload staging {i}")),
                    size,
                    usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: true,
                }),
                state: Arc::new(AtomicU8::new(MAPPED)),
                last: None,
            })
            .collect();
        StagingRing {
            bufs,
            size,
            cur: 0,
            used: 0,
            copies: Vec::new(),
            repacks: Vec::new(),
            open: false,
        }
    }

    /// Bytes one batch can take, counting each piece's alignment: a batch of pieces whose sizes,
    /// each rounded up to 256 bytes, add up to at most this fits.
    pub fn capacity(&self) -> u64 {
        self.size
    }

    /// Start a batch in the next buffer, waiting for the GPU to finish the submission that read
    /// it last. Errors: a failed map of that buffer, or a device lost while waiting.
    pub fn begin(&mut self, gpu: &Gpu) -> Result<(), DispatchError> {
        let next = (self.cur + 1) % self.bufs.len();
        let b = &mut self.bufs[next];
        if b.state.load(Ordering::Acquire) == PENDING {
            let wait = wgpu::PollType::Wait {
                submission_index: b.last.take(),
                timeout: None,
            };
            gpu.device
                .poll(wait)
                .map_err(|e| DispatchError::Shape(format!("waiting for an upload buffer: {e}")))?;
        }
        match b.state.load(Ordering::Acquire) {
            MAPPED => {}
            PENDING => {
                return Err(DispatchError::Shape(
                    "an upload buffer was not mapped again after its submission".into(),
                ))
            }
            _ => {
                return Err(DispatchError::Shape(
                    "mapping an upload buffer failed".into(),
                ))
            }
        }
        self.cur = next;
        self.used = 0;
        self.copies.clear();
        self.repacks.clear();
        self.open = true;
        Ok(())
    }

    /// A view of `size` bytes of the current buffer, copied to `dst` at `offset` by
    /// [`StagingRing::finish`]. Errors: no batch begun, or the batch is full.
    fn view(
        &mut self,
        dst: &wgpu::Buffer,
        offset: u64,
        size: u64,
    ) -> Result<wgpu::BufferViewMut, DispatchError> {
        if !self.open {
            return Err(DispatchError::Shape(
                "an upload view outside a staging batch".into(),
            ));
        }
        let at = self.used;
        let end = at + size.next_multiple_of(RING_ALIGN);
        if end > self.size {
            return Err(DispatchError::Shape(format!(
                "an upload batch of more than {} bytes (the staging buffer)",
                self.size
            )));
        }
        self.used = end;
        self.copies.push((dst.clone(), offset, at, size));
        self.bufs[self.cur]
            .buf
            .slice(at..at + size)
            .get_mapped_range_mut()
            .map_err(|e| DispatchError::Shape(format!("mapping an upload buffer: {e:?}")))
    }

    /// Reorder the int3-g64 groups of `bytes` bytes at `offset` of `dst` on the GPU after this
    /// batch's copies (the rows were staged as stored). Errors: no batch begun, or a range that is
    /// not whole 4-byte words.
    pub(crate) fn repack_int3(
        &mut self,
        dst: &wgpu::Buffer,
        offset: u64,
        bytes: u64,
    ) -> Result<(), DispatchError> {
        if !self.open || !offset.is_multiple_of(4) || !bytes.is_multiple_of(24) {
            return Err(DispatchError::Shape(format!(
                "an int3-g64 reorder of {bytes} bytes at {offset} outside a batch or groups"
            )));
        }
        self.repacks.push((dst.clone(), offset, bytes));
        Ok(())
    }

    /// Unmap the current buffer (every view of it must be dropped: [`run_staged`] does) and
    /// record its copies into `enc`, then the int3-g64 reorders ([`StagingRing::repack_int3`]).
    pub fn finish(&mut self, gpu: &Gpu, enc: &mut wgpu::CommandEncoder) {
        let b = &self.bufs[self.cur];
        b.buf.unmap();
        for (dst, offset, at, size) in self.copies.drain(..) {
            enc.copy_buffer_to_buffer(&b.buf, at, &dst, offset, size);
        }
        if !self.repacks.is_empty() {
            let dispatches = self
                .repacks
                .drain(..)
                .map(|(dst, offset, bytes)| {
                    let groups = (bytes / 24) as u32;
                    let wg = groups.div_ceil(256).clamp(1, call::MAX_GROUPS_PER_DIM);
                    let p = Int3RepackParams {
                        offset: (offset / 4) as u32,
                        groups,
                        stride: wg * 256,
                        _p: 0,
                    };
                    Dispatch::new(gpu, &Int3RepackKey, &p, &[(1, &dst)], [wg, 1, 1])
                })
                .collect();
            call::Call::new(call::Label::op("int3 reorder"), dispatches).record(enc);
        }
        self.open = false;
    }

    /// The submission `idx` reads the current buffer: map it again once the GPU is done.
    pub fn submitted(&mut self, idx: wgpu::SubmissionIndex) {
        let b = &mut self.bufs[self.cur];
        b.state.store(PENDING, Ordering::Release);
        b.last = Some(idx);
        let state = b.state.clone();
        b.buf.slice(..).map_async(wgpu::MapMode::Write, move |r| {
            state.store(if r.is_ok() { MAPPED } else { FAILED }, Ordering::Release);
        });
    }
}

/// WGSL of the in-place int3-g64 reorder.
const INT3_REPACK_WGSL: &str = include_str!("../../../wgsl/int3_repack.wgsl");

/// The pipeline of the in-place int3-g64 reorder of streamed uploads (`wgsl/int3_repack.wgsl`).
/// Label `staging/int3-repack`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Int3RepackKey;

/// The `Params` of int3_repack.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Int3RepackParams {
    /// u32 word of the first group.
    pub offset: u32,
    /// Groups to reorder.
    pub groups: u32,
    /// Threads in the whole dispatch.
    pub stride: u32,
    pub _p: u32,
}

impl std::fmt::Display for Int3RepackKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("staging/int3-repack")
    }
}

impl Kernel for Int3RepackKey {
    type Params = Int3RepackParams;
    fn entry(&self) -> &'static str {
        "main"
    }
    fn bindings(&self) -> Vec<(u32, Bind)> {
        vec![(0, Bind::Uniform), (1, Bind::Write)]
    }
    fn source(&self) -> String {
        INT3_REPACK_WGSL.to_string()
    }
}
