//! Named limit profiles: clamp a device to the limits and features of a GPU class we cannot test
//! on directly (Apple M1 through wgpu's Metal backend, a browser's WebGPU defaults, a device
//! without subgroups), so the kernels and the model run on lavapipe as they would there.
//!
//! Pick one with `INKLING_LIMITS=apple-m1|webgpu|no-subgroups` (read by [`crate::gpu::Gpu::new`])
//! or [`crate::gpu::Gpu::with_profile`]. The device then gets, per limit, the worse of the
//! adapter's value and the profile's (`wgpu::Limits::or_worse_values_from`), so a profile never
//! asks the adapter for more than it has.

use std::fmt;

/// Environment variable naming a [`LimitProfile`] for [`crate::gpu::Gpu::new`].
pub const ENV: &str = "INKLING_LIMITS";

/// A named set of device limits and features.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LimitProfile {
    /// What wgpu 30's Metal backend reports for an Apple M1-class GPU (Apple7 family, macOS);
    /// see [`apple_m1_limits`]. Subgroups stay on (Apple7 has SIMD-scoped operations).
    AppleM1,
    /// The WebGPU defaults every browser guarantees, `wgpu::Limits::default()` (16 KiB of
    /// workgroup memory, 256 invocations, 8 storage buffers per stage, 128 MiB per storage
    /// binding, 256 MiB per buffer). Features are the adapter's.
    WebGpu,
    /// The adapter's limits without the `SUBGROUP` feature (every kernel takes its
    /// shared-memory reduction).
    NoSubgroups,
}

impl LimitProfile {
    /// Every profile, in the order of the tests.
    pub const ALL: [LimitProfile; 3] = [
        LimitProfile::AppleM1,
        LimitProfile::WebGpu,
        LimitProfile::NoSubgroups,
    ];

    /// The profile's name (`apple-m1`, `webgpu`, `no-subgroups`).
    pub fn name(self) -> &'static str {
        match self {
            LimitProfile::AppleM1 => "apple-m1",
            LimitProfile::WebGpu => "webgpu",
            LimitProfile::NoSubgroups => "no-subgroups",
        }
    }

    /// The profile called `name`; the error lists the names.
    pub fn parse(name: &str) -> Result<LimitProfile, String> {
        LimitProfile::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| {
                let names: Vec<_> = LimitProfile::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "unknown limit profile {name:?}; expected one of {}",
                    names.join(", ")
                )
            })
    }

    /// The profile named by [`ENV`], if set and not empty.
    pub fn from_env() -> Result<Option<LimitProfile>, String> {
        match std::env::var(ENV) {
            Ok(v) if !v.is_empty() => LimitProfile::parse(&v)
                .map(Some)
                .map_err(|e| format!("{ENV}: {e}")),
            _ => Ok(None),
        }
    }

    /// The profile's own limits (`None`: the adapter's).
    pub fn limits(self) -> Option<wgpu::Limits> {
        match self {
            LimitProfile::AppleM1 => Some(apple_m1_limits()),
            LimitProfile::WebGpu => Some(wgpu::Limits::default()),
            LimitProfile::NoSubgroups => None,
        }
    }

    /// The device's limits under this profile: the worse of `adapter`'s and the profile's.
    pub fn clamp_limits(self, adapter: &wgpu::Limits) -> wgpu::Limits {
        match self.limits() {
            Some(p) => adapter.clone().or_worse_values_from(&p),
            None => adapter.clone(),
        }
    }

    /// The device's features under this profile.
    pub fn clamp_features(self, features: wgpu::Features) -> wgpu::Features {
        match self {
            LimitProfile::NoSubgroups => {
                features - (wgpu::Features::SUBGROUP | wgpu::Features::SUBGROUP_BARRIER)
            }
            _ => features,
        }
    }

    /// Whether devices of this class can have subgroups.
    pub fn subgroups(self) -> bool {
        self != LimitProfile::NoSubgroups
    }
}

impl fmt::Display for LimitProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The limits wgpu 30's Metal backend reports for an Apple M1-class GPU on macOS, from
/// `wgpu-hal-30.0.2/src/metal/adapter.rs`; limits it leaves unbounded stay unbounded here:
///
/// * workgroup memory 32 KiB: `max_total_threadgroup_memory` (`32 << 10`, adapter.rs:1012-1019),
///   reported as `max_compute_workgroup_storage_size` (adapter.rs:1440);
/// * 1024 invocations per workgroup and per dimension: `max_threads_per_group`
///   (adapter.rs:997-1005), reported at adapter.rs:1441-1444;
/// * 29 storage and 29 uniform buffers per stage: `MAX_BUFFERS - 2` (adapter.rs:54, :1390);
/// * buffer and storage-binding size: `device.maxBufferLength()`, read from the device at run
///   time (adapter.rs:897-903, reported at :1424-1428); the profile takes the 1 GiB that the
///   same code assumes for macOS without the query (adapter.rs:900), a lower bound for an M1;
/// * uniform offset alignment 256 on macOS (adapter.rs:887-891), storage offset alignment 32
///   (adapter.rs:1431), 65535 workgroups per dimension (adapter.rs:1446).
pub fn apple_m1_limits() -> wgpu::Limits {
    wgpu::Limits {
        max_compute_workgroup_storage_size: 32 << 10,
        max_compute_invocations_per_workgroup: 1024,
        max_compute_workgroup_size_x: 1024,
        max_compute_workgroup_size_y: 1024,
        max_compute_workgroup_size_z: 1024,
        max_storage_buffers_per_shader_stage: 29,
        max_uniform_buffers_per_shader_stage: 29,
        max_buffer_size: 1 << 30,
        max_storage_buffer_binding_size: 1 << 30,
        max_uniform_buffer_binding_size: 1 << 30,
        min_uniform_buffer_offset_alignment: 256,
        min_storage_buffer_offset_alignment: 32,
        max_compute_workgroups_per_dimension: 0xFFFF,
        ..wgpu::Limits::unlimited()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_choices() {
        for p in LimitProfile::ALL {
            assert_eq!(LimitProfile::parse(p.name()), Ok(p));
        }
        let e = LimitProfile::parse("m1").unwrap_err();
        assert!(e.contains("apple-m1, webgpu, no-subgroups"), "{e}");
    }

    #[test]
    fn clamping_takes_the_worse_value_of_adapter_and_profile() {
        let adapter = wgpu::Limits {
            max_compute_workgroup_storage_size: 65536,
            max_storage_buffers_per_shader_stage: 16,
            min_storage_buffer_offset_alignment: 64,
            ..Default::default()
        };
        let l = LimitProfile::AppleM1.clamp_limits(&adapter);
        assert_eq!(l.max_compute_workgroup_storage_size, 32768);
        // the adapter's 256 invocations stay: a profile never raises a limit
        assert_eq!(l.max_compute_invocations_per_workgroup, 256);
        assert_eq!(l.max_storage_buffers_per_shader_stage, 16);
        assert_eq!(l.min_storage_buffer_offset_alignment, 64);
        let w = LimitProfile::WebGpu.clamp_limits(&adapter);
        assert_eq!(w.max_compute_workgroup_storage_size, 16384);
        assert_eq!(w.max_storage_buffers_per_shader_stage, 8);
        assert_eq!(w.min_storage_buffer_offset_alignment, 256);
        let f = wgpu::Features::SUBGROUP | wgpu::Features::TIMESTAMP_QUERY;
        assert_eq!(
            LimitProfile::NoSubgroups.clamp_features(f),
            wgpu::Features::TIMESTAMP_QUERY
        );
        assert_eq!(LimitProfile::AppleM1.clamp_features(f), f);
    }
}
