//! Expert streaming on the GPU (see [`crate::model::stream`]): the slot pool, the routed experts
//! of one layer placed and run between submissions at the step's [`super::graph::Node::Routed`]
//! cut, and the CPU fallback when that fails.
use super::graph::{ffn_calls, FfnIo};
use super::resident::{zeroed, Activations, FfnSlab, Linear, Resident, ResidentMlp};
use crate::formats::QMatrix;
use crate::gpu::linear::route::LinearOptions;
use crate::gpu::linear::slab::GpuWeights;
use crate::gpu::linear::staging::{run_staged, StagedCopy, Stager, StagingRing};
use crate::gpu::{Call, Gpu};
use crate::model::expert_cache::{Assign, ExpertCache};
use crate::model::stream::{self, upload_threads, StreamState, StreamStats};
use crate::model::usage::Usage;
use crate::model::weights::{Ffn, Mlp, Weights};
use anyhow::{bail, ensure, Context, Result};
use std::collections::HashMap;
use std::time::Instant;

/// Largest single staged copy of an expert upload (pieces split so that one or two misses still
/// spread over the upload threads).
const UPLOAD_PIECE: usize = 4 << 20;

/// Staging buffers in the ring of misses: one filled by the host while the GPU copies another
/// and computes with a third.
const STAGING_BUFFERS: usize = 3;

/// The slot pool, the buffers of one routed part, and the host state of streaming.
pub(super) struct Streamer<'w> {
    /// `slots` experts of gate‖up `[2I, H]` and down `[H, I]`.
    pool: FfnSlab,
    inter: u32,
    /// Compacted pairs of one part, `(slot, token, weight_idx, 0)`.
    part_pairs: wgpu::Buffer,
    /// Down outputs of one part `[P, H]`, copied to the pairs' rows of `y_routed`.
    y_part: wgpu::Buffer,
    /// Recorded part FFNs by `(tokens, pairs)` (one recording serves every layer: the pool,
    /// the pairs and the activations are the same buffers).
    part_calls: HashMap<(u32, u32), Vec<Call>>,
    /// `MAP_READ` copy of the router's pairs of one layer (read back once per streamed layer).
    pairs_rb: wgpu::Buffer,
    /// Threads copying misses ([`upload_threads`]).
    threads: usize,
    /// The staging of the misses: [`STAGING_BUFFERS`] buffers of `batch` experts each.
    ring: StagingRing,
    /// Experts per upload batch (one ring buffer, one submission).
    batch: usize,
    /// How the part FFNs' GEMVs are built.
    linear: LinearOptions,
    host: StreamState<'w>,
}

/// One streamed layer's routed experts: which layer, its token count `t`, the hidden size, the
/// router's `(expert, token, weight_idx, pad)` pairs, and whether to inject a failure.
struct LayerJob<'p> {
    layer: usize,
    t: u32,
    hid: u32,
    pairs: &'p [[u32; 4]],
    fail: bool,
}

impl<'w> Streamer<'w> {
    /// A pool of `slots` expert slots (weight buffers of at most `limit` bytes) for `w`'s routed
    /// experts, with parts of up to `max_chunk · max_topk` pairs, whose calls are built under
    /// `linear`. Errors: no sparse layer, or
    /// routed experts of different shapes or encodings.
    pub fn new(
        gpu: &Gpu,
        w: &'w Weights<'w>,
        slots: usize,
        limit: u64,
        max_chunk: usize,
        max_topk: usize,
        linear: LinearOptions,
    ) -> Result<Streamer<'w>> {
        let cfg = &w.config;
        let hid = cfg.hidden_size;
        let (f0, inter) = w
            .layers
            .iter()
            .find_map(|l| match &l.mlp {
                Mlp::Moe(m) => Some((&m.experts[0], m.experts[0].gate.rows)),
                Mlp::Dense(_) => None,
            })
            .context("expert streaming needs a sparse layer")?;
        let (enc, denc) = (f0.gate.enc, f0.down.enc);
        // one pool serves every layer: every routed expert must have its shape and encoding
        for (i, l) in w.layers.iter().enumerate() {
            let Mlp::Moe(m) = &l.mlp else { continue };
            for (e, f) in m.experts.iter().enumerate() {
                let same = |q: &QMatrix<'_>, like: &QMatrix<'_>| {
                    q.enc == like.enc && q.rows == like.rows && q.cols == like.cols
                };
                ensure!(
                    same(&f.gate, &f0.gate) && same(&f.up, &f0.gate) && same(&f.down, &f0.down),
                    "expert streaming needs one shape and encoding for every routed expert; \
                     layer {i} expert {e} differs from the first ({} / {} [{}, {}] vs {} / {} [{}, {}])",
                    f.gate.enc.spelling(),
                    f.down.enc.spelling(),
                    f.gate.rows,
                    f.gate.cols,
                    enc.spelling(),
                    denc.spelling(),
                    f0.gate.rows,
                    f0.gate.cols
                );
            }
        }
        let gu = GpuWeights::empty_with_limit(gpu, enc, slots, 2 * inter, hid, limit)
            .context("allocating the expert slots (gate_up)")?;
        let dn = GpuWeights::empty_with_limit(gpu, denc, slots, hid, inter, limit)
            .context("allocating the expert slots (down)")?;
        let p = max_chunk * max_topk;
        // a layer's decode misses in two batches: the first one's transfer overlaps the second
        // one's host copy
        // one expert's staging: its bytes, and up to a ring alignment per piece (at most one
        // piece per 4 MiB and one more per weight or scale segment of each chunk)
        let bytes = gu.slot_bytes() + dn.slot_bytes();
        let segments = 2 * (gu.chunks().len() + dn.chunks().len()) as u64;
        let per_expert = bytes + 256 * (bytes.div_ceil(UPLOAD_PIECE as u64) + segments + 4);
        let fit = (gpu.limits.max_buffer_size / per_expert).max(1) as usize;
        let batch = max_topk.div_ceil(2).clamp(1, fit);
        let ring = StagingRing::new(gpu, STAGING_BUFFERS, batch as u64 * per_expert);
        Ok(Streamer {
            pool: FfnSlab {
                gate_up: Linear::from_weights(gu),
                down: Linear::from_weights(dn),
                n: slots,
            },
            inter: inter as u32,
            part_pairs: gpu.storage("expert part pairs", 16 * p as u64),
            y_part: zeroed(gpu, "expert part outputs", p * hid),
            part_calls: HashMap::new(),
            pairs_rb: gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("router pairs readback"),
                size: 16 * p as u64,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            threads: upload_threads(),
            ring,
            batch,
            linear,
            host: StreamState {
                experts: w
                    .layers
                    .iter()
                    .map(|l| match &l.mlp {
                        Mlp::Moe(x) => &x.experts[..],
                        Mlp::Dense(_) => &[][..],
                    })
                    .collect(),
                cache: ExpertCache::new(cfg.num_hidden_layers, cfg.n_routed_experts, slots)
                    .map_err(|e| anyhow::anyhow!("{e}"))?,
                usage: Usage::new("", cfg.num_hidden_layers, cfg.n_routed_experts),
                stats: StreamStats::default(),
                fail_at: None,
                warned: false,
            },
        })
    }

    /// Record into `u` from now on and pin its hottest experts (up to half the slots when there
    /// are at least twice `max_topk` of them), uploaded in batches of about 1 GiB. An upload that
    /// fails is a warning: the run goes on without the hot set.
    pub fn load_hot_set(&mut self, gpu: &Gpu, u: Usage, max_topk: usize) {
        let h = &mut self.host;
        let n = self.pool.n;
        let max_pinned = if n >= 2 * max_topk { n / 2 } else { 0 };
        let t0 = Instant::now();
        // only keys the model has (a count on a dense layer cannot be pinned)
        let hot: Vec<(usize, usize)> = u
            .ranked()
            .into_iter()
            .filter(|&(l, e)| h.experts.get(l).is_some_and(|x| e < x.len()))
            .collect();
        let loads = h.cache.pin(&hot, max_pinned);
        // staged in batches of about 1 GiB (a submission each), inside error scopes
        let oom = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let invalid = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let (pool, threads) = (&self.pool, self.threads);
        let res = (|| -> Result<u64> {
            let (mut total, mut batch_bytes, mut batch) = (0, 0, Vec::new());
            for (layer, a) in &loads {
                let n = stage_expert(
                    &mut Stager::Queue(&gpu.queue),
                    pool,
                    h.experts[*layer],
                    *a,
                    &mut batch,
                )?;
                total += n;
                batch_bytes += n;
                if batch_bytes >= 1 << 30 {
                    run_staged(std::mem::take(&mut batch), threads);
                    gpu.queue.submit([]);
                    batch_bytes = 0;
                }
            }
            run_staged(batch, threads);
            Ok(total)
        })();
        let scoped = [
            pollster::block_on(invalid.pop()),
            pollster::block_on(oom.pop()),
        ];
        match (res, scoped) {
            (Ok(n), [None, None]) => h.stats.startup_bytes = n,
            (res, [v, o]) => {
                let why = match (res, v.or(o)) {
                    (Err(e), _) => format!("{e:#}"),
                    (Ok(_), Some(e)) => e.to_string(),
                    (Ok(_), None) => unreachable!("matched above"),
                };
                eprintln!(
                    "warning: the hot set from the usage file could not be uploaded ({why}); \
                     going on without it"
                );
                for (_, a) in &loads {
                    h.cache.forget(a.slot);
                }
            }
        }
        h.stats.startup_s = t0.elapsed().as_secs_f64();
        h.usage = u;
    }

    /// Record the routed parts of a one-token step (1 to top-k pairs, in every layer), so that
    /// their pipelines are built with the model and a decode builds none.
    pub fn build_decode_parts(&mut self, gpu: &Gpu, res: &Resident) -> Result<()> {
        for n in 1..=res.max_topk as u32 {
            self.part_call(gpu, &res.acts, 1, n)?;
        }
        Ok(())
    }

    /// Record the FFN of a part of `n` pairs in a step of `t` tokens (once).
    fn part_call(&mut self, gpu: &Gpu, a: &Activations, t: u32, n: u32) -> Result<()> {
        if !self.part_calls.contains_key(&(t, n)) {
            let io = FfnIo {
                x: &a.xn,
                tokens: t,
                pairs: &self.part_pairs,
                n_pairs: n,
                gu: &a.gu,
                act: &a.act,
                y: &self.y_part,
                linear: &self.linear,
            };
            let ops = ["streamed routed gate_up", "streamed routed down"];
            let calls = ffn_calls(gpu, &self.pool, self.inter, io, ops)?;
            self.part_calls.insert((t, n), calls);
        }
        Ok(())
    }

    /// Counters of the run so far.
    pub fn stats(&self) -> StreamStats {
        let c = self.host.cache.counters();
        StreamStats {
            slots: self.host.cache.slots(),
            hits: c.hits,
            misses: c.misses,
            pinned: self.host.cache.pinned_count(),
            ..self.host.stats
        }
    }

    /// The routing counts recorded so far.
    pub fn usage(&self) -> &Usage {
        &self.host.usage
    }

    /// Make the GPU part of `layer`'s routed experts fail in the step that feeds position `pos`.
    pub fn inject_failure(&mut self, pos: usize, layer: usize) {
        self.host.fail_at = Some((pos, layer));
    }

    /// The cut at `layer`'s routed experts in a step of `t` tokens from position `pos`: submit
    /// `enc` with a copy of the router's pairs, read them back, place and run the routed experts
    /// (or recompute them on the CPU after a GPU failure); returns a fresh encoder for the rest of
    /// the step.
    pub fn cut(
        &mut self,
        gpu: &Gpu,
        res: &Resident,
        (layer, t, pos): (usize, u32, usize),
        mut enc: wgpu::CommandEncoder,
    ) -> Result<wgpu::CommandEncoder> {
        let ResidentMlp::Moe(moe) = &res.layers[layer].mlp else {
            unreachable!("a routed cut sits in a sparse layer")
        };
        let top_k = moe.top_k;
        let a = &res.acts;
        // the router's pairs travel in the same submission into a persistent readback buffer
        let bytes = 16 * (t * top_k) as u64;
        enc.copy_buffer_to_buffer(&a.pairs, 0, &self.pairs_rb, 0, bytes);
        gpu.queue.submit([enc.finish()]);
        let t0 = Instant::now();
        let raw = gpu
            .map_read(&self.pairs_rb, bytes)
            .with_context(|| format!("reading back the router's choices of layer {layer}"))?;
        self.host.stats.routing_wait_s += t0.elapsed().as_secs_f64();
        let pairs: Vec<[u32; 4]> = bytemuck::pod_collect_to_vec(&raw);
        for p in &pairs {
            self.host.usage.record(layer, p[0]);
        }
        let fail = match self.host.fail_at {
            Some((p, l)) if l == layer && (pos..pos + t as usize).contains(&p) => {
                self.host.fail_at = None;
                true
            }
            _ => false,
        };
        // GPU errors of the layer (out of memory, validation) come back here instead of
        // reaching wgpu's uncaptured-error handler, which panics
        let oom = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let invalid = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let job = LayerJob {
            layer,
            t,
            hid: res.hidden,
            pairs: &pairs,
            fail,
        };
        let r = self.on_gpu(gpu, a, &job);
        let scoped = [
            pollster::block_on(invalid.pop()),
            pollster::block_on(oom.pop()),
        ];
        let r = match (r, scoped) {
            (Err(e), _) => Err(e),
            (Ok(()), [Some(e), _] | [None, Some(e)]) => {
                Err(anyhow::anyhow!("the GPU reported an error: {e}"))
            }
            (Ok(()), [None, None]) => Ok(()),
        };
        if let Err(e) = r {
            // what this layer's plan installed may not be on the GPU
            self.host.cache.forget_layer(layer);
            self.on_cpu(gpu, a, &job, &e)?;
        }
        Ok(gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("inkling step (continued)"),
            }))
    }

    /// One layer's routed experts on the GPU through the slot pool: rounds from the cache, each
    /// round's hits then loads as their own submissions. On an error the caller forgets the
    /// layer's slots ([`ExpertCache::forget_layer`]): what this plan installed may not have
    /// reached the GPU.
    fn on_gpu(&mut self, gpu: &Gpu, a: &Activations, job: &LayerJob<'_>) -> Result<()> {
        let LayerJob {
            layer,
            t,
            hid,
            pairs,
            fail,
        } = *job;
        if fail {
            // the test hook: the layer's GPU work fails before any of it ran
            bail!("injected GPU failure (layer {layer})");
        }
        let experts: Vec<u32> = pairs.iter().map(|p| p[0]).collect();
        let rounds = self
            .host
            .cache
            .plan_layer(layer, &experts)
            .map_err(|e| anyhow::anyhow!("layer {layer}: {e}"))?;
        for round in &rounds {
            for part in stream::round_parts(&round.assign) {
                let slot_of: HashMap<u32, u32> = part.iter().map(|x| (x.expert, x.slot)).collect();
                let mut compact: Vec<[u32; 4]> = Vec::new();
                let mut rows: Vec<usize> = Vec::new();
                for (p, pr) in pairs.iter().enumerate() {
                    if let Some(&slot) = slot_of.get(&pr[0]) {
                        compact.push([slot, pr[1], pr[2], 0]);
                        rows.push(p);
                    }
                }
                let n = compact.len() as u32;
                gpu.queue
                    .write_buffer(&self.part_pairs, 0, bytemuck::cast_slice(&compact));
                self.part_call(gpu, a, t, n)?;
                // the loads in batches of one staging buffer, each its own submission (its
                // transfer runs while the host copies the next); the part's FFN goes with the last
                let batches: Vec<&[Assign]> = if part[0].load {
                    part.chunks(self.batch).collect()
                } else {
                    vec![&[]]
                };
                for (bi, batch) in batches.iter().enumerate() {
                    let mut enc =
                        gpu.device
                            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                                label: Some("streamed experts"),
                            });
                    if !batch.is_empty() {
                        self.ring.begin(gpu)?;
                        let t0 = Instant::now();
                        let mut copies = Vec::new();
                        for &x in batch.iter() {
                            let from = self.host.experts[layer];
                            let mut stager = Stager::Ring(&mut self.ring);
                            self.host.stats.bytes_read +=
                                stage_expert(&mut stager, &self.pool, from, x, &mut copies)?;
                            self.host.stats.uploads += 1;
                        }
                        run_staged(copies, self.threads);
                        let dt = t0.elapsed().as_secs_f64();
                        self.host.stats.upload_s += dt;
                        if t == 1 {
                            self.host.stats.decode_upload_s += dt;
                        }
                        self.ring.finish(gpu, &mut enc);
                    }
                    if bi + 1 == batches.len() {
                        let calls = &self.part_calls[&(t, n)];
                        record_part(&mut enc, calls, &self.y_part, &a.y_routed, &rows, hid);
                    }
                    let idx = gpu.queue.submit([enc.finish()]);
                    if !batch.is_empty() {
                        self.ring.submitted(idx);
                    }
                }
            }
        }
        Ok(())
    }

    /// The CPU fallback of one layer's routed experts after a GPU failure: read the layer's MoE
    /// input back, compute every pair's expert FFN on the CPU from the mapped bytes
    /// ([`crate::model::cpu::expert_ffn`]), and write the rows of `y_routed`. Warns once per model.
    fn on_cpu(
        &mut self,
        gpu: &Gpu,
        a: &Activations,
        job: &LayerJob<'_>,
        why: &anyhow::Error,
    ) -> Result<()> {
        let LayerJob {
            layer,
            t,
            hid,
            pairs,
            ..
        } = *job;
        let h = &mut self.host;
        if !h.warned {
            eprintln!(
                "warning: the GPU step of layer {layer}'s routed experts failed ({why:#}); \
                 recomputing it on the CPU from the mapped weights (further fallbacks are counted in the stats)"
            );
            h.warned = true;
        }
        h.stats.cpu_fallbacks += 1;
        let hd = hid as usize;
        let x = gpu
            .read_f32(&a.xn, t as usize * hd)
            .with_context(|| format!("CPU fallback of layer {layer}: the GPU is unreachable"))?;
        let experts = h.experts[layer];
        let mut y = Vec::with_capacity(pairs.len() * hd);
        for pr in pairs {
            let (e, tok) = (pr[0] as usize, pr[1] as usize);
            let f = experts.get(e).with_context(|| {
                format!("layer {layer}: the router chose expert {e}, which does not exist")
            })?;
            ensure!(
                tok < t as usize,
                "layer {layer}: a pair names token {tok} of {t}"
            );
            y.extend(crate::model::cpu::expert_ffn(
                f,
                &x[tok * hd..(tok + 1) * hd],
            ));
        }
        gpu.queue
            .write_buffer(&a.y_routed, 0, bytemuck::cast_slice(&y));
        Ok(())
    }
}

/// Record one part's FFN (`calls`) and the copies of its outputs (`y_part` row j) to the pairs'
/// rows of `y_routed` (`rows[j]`), rows of `hid` f32.
fn record_part(
    enc: &mut wgpu::CommandEncoder,
    calls: &[Call],
    y_part: &wgpu::Buffer,
    y_routed: &wgpu::Buffer,
    rows: &[usize],
    hid: u32,
) {
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("streamed experts"),
            timestamp_writes: None,
        });
        for c in calls {
            c.record_in_pass(&mut pass);
        }
    }
    let row = 4 * hid as u64;
    for (j, &p) in rows.iter().enumerate() {
        enc.copy_buffer_to_buffer(y_part, j as u64 * row, y_routed, p as u64 * row, row);
    }
}

/// Stage routed expert `a.expert` for slot `a.slot` through `stager` (the copies are pushed onto
/// `copies`, run by the caller); returns the bytes it reads from the mapped weights.
fn stage_expert<'s>(
    stager: &mut Stager<'_>,
    pool: &FfnSlab,
    experts: &'s [Ffn<'s>],
    a: Assign,
    copies: &mut Vec<StagedCopy<'s>>,
) -> Result<u64> {
    let f = experts
        .get(a.expert as usize)
        .with_context(|| format!("routed expert {} does not exist", a.expert))?;
    let (gu, gus, dn, dns) = stream::expert_pieces(f);
    let s = a.slot as usize;
    let mut n = pool
        .gate_up
        .w
        .stage_expert(stager, s, &gu, &gus, UPLOAD_PIECE, copies)
        .context("staging an expert's gate_up for its slot")?;
    n += pool
        .down
        .w
        .stage_expert(stager, s, &[dn], &[dns], UPLOAD_PIECE, copies)
        .context("staging an expert's down for its slot")?;
    Ok(n)
}
