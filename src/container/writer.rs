//! Writing one safetensors shard in an exact tensor order, with alignment.
//!
//! The `safetensors` crate's serializer orders tensors by dtype and name and cannot pad, so the
//! header and data are written here. The result is an ordinary safetensors file: the header is
//! padded with spaces (allowed by the format) so that the data buffer starts on a 4096-byte
//! boundary, and alignment gaps inside the buffer are filled by U8 tensors `__pad__.N` so that the
//! buffer has no holes. The file is written as `NAME.PID.tmp`; the caller renames it once every shard
//! is complete.

use super::{PAD_PREFIX, SLAB_ALIGN};
use safetensors::Dtype;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// One tensor of a shard plan.
#[derive(Clone, Debug)]
pub struct PlannedTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Required alignment of the tensor's first byte (relative to the data buffer, which itself
    /// starts 4096-aligned in the file, so also absolute).
    pub align: usize,
}

impl PlannedTensor {
    pub fn nbytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.bitsize() / 8
    }
}

/// Faults injected into a container write, so tests can reach the clean-up paths; none by
/// default. Counts are tensor bytes over all shards of one write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FailPlan {
    /// A write that would pass this many bytes writes up to it, then fails with
    /// "injected write failure after N bytes".
    pub fail_after_bytes: Option<u64>,
    /// A write that would pass this many bytes flushes what came before, then waits forever (until
    /// a signal ends the process), so a test can interrupt a write while its temporary files exist.
    pub stall_after_bytes: Option<u64>,
    /// Stop a replacement of an earlier conversion at this step as a kill would: no cleanup
    /// (`super::replace::SwapStep`).
    pub crash_at: Option<super::replace::SwapStep>,
}

/// Bytes of every tensor written so far, shared by all shards of one conversion, and the faults
/// to inject.
#[derive(Clone, Debug, Default)]
pub struct WriteBudget {
    pub written: u64,
    pub fail: FailPlan,
}

fn dtype_name(d: Dtype) -> String {
    format!("{d:?}")
}

/// A shard being written to `FINAL.PID.tmp`.
pub struct ShardWriter {
    out: BufWriter<File>,
    tmp: PathBuf,
    /// (name, start, end) relative to the data buffer, pads included, in write order.
    layout: Vec<(String, usize, usize)>,
    next: usize,
    pos: usize,
}

/// One laid-out tensor: name, dtype, shape, start, end (relative to the data buffer).
pub type LaidOut = (String, Dtype, Vec<usize>, usize, usize);

/// Where each tensor will sit: pads inserted; returns (layout, data length).
pub fn layout(tensors: &[PlannedTensor]) -> (Vec<LaidOut>, usize) {
    let mut out = Vec::new();
    let mut cur = 0usize;
    let mut npad = 0;
    for t in tensors {
        let a = t.align.max(1);
        let aligned = cur.div_ceil(a) * a;
        if aligned > cur {
            out.push((
                format!("{PAD_PREFIX}{npad}"),
                Dtype::U8,
                vec![aligned - cur],
                cur,
                aligned,
            ));
            npad += 1;
        }
        let n = t.nbytes();
        out.push((
            t.name.clone(),
            t.dtype,
            t.shape.clone(),
            aligned,
            aligned + n,
        ));
        cur = aligned + n;
    }
    (out, cur)
}

/// The header JSON for a layout, padded with spaces so that `8 + len` is a multiple of 4096.
pub fn header(layout: &[LaidOut], metadata: &[(String, String)]) -> Vec<u8> {
    let mut h = String::from("{");
    h.push_str("\"__metadata__\":{");
    for (i, (k, v)) in metadata.iter().enumerate() {
        if i > 0 {
            h.push(',');
        }
        h.push_str(&serde_json::to_string(k).unwrap());
        h.push(':');
        h.push_str(&serde_json::to_string(v).unwrap());
    }
    h.push('}');
    for (name, dtype, shape, s, e) in layout {
        h.push(',');
        h.push_str(&serde_json::to_string(name).unwrap());
        h.push_str(&format!(
            ":{{\"dtype\":\"{}\",\"shape\":{},\"data_offsets\":[{s},{e}]}}",
            dtype_name(*dtype),
            serde_json::to_string(shape).unwrap()
        ));
    }
    h.push('}');
    let total = 8 + h.len();
    let pad = (SLAB_ALIGN - total % SLAB_ALIGN) % SLAB_ALIGN;
    h.extend(std::iter::repeat_n(' ', pad));
    h.into_bytes()
}

/// The temporary name of a shard being written (`FINAL.PID.tmp`, see [`crate::tempfiles`]).
pub fn tmp_path(final_path: &Path) -> PathBuf {
    crate::tempfiles::tmp_path(final_path)
}

impl ShardWriter {
    /// Create `final_path.PID.tmp` (registered for removal on SIGINT / SIGTERM, see
    /// [`crate::tempfiles`]) and write the header.
    pub fn create(
        final_path: &Path,
        tensors: &[PlannedTensor],
        metadata: &[(String, String)],
    ) -> io::Result<Self> {
        let (lay, _) = layout(tensors);
        let hdr = header(&lay, metadata);
        let tmp = tmp_path(final_path);
        let mut out = BufWriter::with_capacity(1 << 20, crate::tempfiles::create(&tmp)?);
        out.write_all(&(hdr.len() as u64).to_le_bytes())?;
        out.write_all(&hdr)?;
        let layout = lay.into_iter().map(|(n, _, _, s, e)| (n, s, e)).collect();
        Ok(ShardWriter {
            out,
            tmp,
            layout,
            next: 0,
            pos: 0,
        })
    }

    /// Write the next planned tensor (padding before it is written automatically).
    pub fn write(&mut self, name: &str, bytes: &[u8], budget: &mut WriteBudget) -> io::Result<()> {
        while self.next < self.layout.len()
            && self.layout[self.next].0.starts_with(PAD_PREFIX)
            && self.layout[self.next].0 != name
        {
            let (_, s, e) = self.layout[self.next].clone();
            self.emit(&vec![0u8; e - s], budget)?;
            self.next += 1;
        }
        let Some((want, s, e)) = self.layout.get(self.next).cloned() else {
            return Err(io::Error::other(format!(
                "shard writer: tensor {name} is not in the plan"
            )));
        };
        if want != name || e - s != bytes.len() || s != self.pos {
            return Err(io::Error::other(format!(
                "shard writer: expected {want} ({} bytes), got {name} ({} bytes)",
                e - s,
                bytes.len()
            )));
        }
        self.emit(bytes, budget)?;
        self.next += 1;
        Ok(())
    }

    fn emit(&mut self, bytes: &[u8], budget: &mut WriteBudget) -> io::Result<()> {
        if budget
            .fail
            .stall_after_bytes
            .is_some_and(|l| budget.written + bytes.len() as u64 > l)
        {
            self.out.flush()?;
            loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        }
        if let Some(limit) = budget.fail.fail_after_bytes {
            if budget.written + bytes.len() as u64 > limit {
                let part = (limit - budget.written.min(limit)) as usize;
                self.out.write_all(&bytes[..part])?;
                self.out.flush()?;
                budget.written += part as u64;
                return Err(io::Error::other(format!(
                    "injected write failure after {limit} bytes"
                )));
            }
        }
        self.out.write_all(bytes)?;
        self.pos += bytes.len();
        budget.written += bytes.len() as u64;
        Ok(())
    }

    /// Flush and sync; every planned tensor must have been written. Returns the temp path.
    pub fn finish(mut self) -> io::Result<PathBuf> {
        if self.next != self.layout.len() {
            return Err(io::Error::other(format!(
                "shard writer: {} of {} tensors written",
                self.next,
                self.layout.len()
            )));
        }
        self.out.flush()?;
        self.out.get_ref().sync_all()?;
        Ok(self.tmp)
    }

    /// Path of the temp file.
    pub fn tmp(&self) -> &Path {
        &self.tmp
    }
}

/// Write a whole shard from in-memory tensors (in the given order) to `path` through a temp file.
/// Used by tests and small tools; conversions stream through [`ShardWriter`] instead.
pub fn write_shard(
    path: &Path,
    tensors: &[(PlannedTensor, Vec<u8>)],
    metadata: &[(String, String)],
) -> io::Result<()> {
    let plan: Vec<PlannedTensor> = tensors.iter().map(|t| t.0.clone()).collect();
    let mut w = ShardWriter::create(path, &plan, metadata)?;
    let mut budget = WriteBudget::default();
    for (t, b) in tensors {
        w.write(&t.name, b, &mut budget)?;
    }
    let tmp = w.finish()?;
    crate::tempfiles::rename_into_place(&tmp, path)
}
