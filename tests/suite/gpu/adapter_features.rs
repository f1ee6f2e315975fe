//! The features the suite's coverage depends on are present, so that coverage cannot vanish: the
//! subgroup kernel variants (`gemv_parity`, `gemv_tuning`, `gemv_segments`) and the timestamp
//! profile (`decode_profile`) run only where the device has `SUBGROUP` and `TIMESTAMP_QUERY`, and
//! lavapipe, the CI adapter, has both. An adapter without one of them FAILS here unless the run
//! says so explicitly with `INKLING_TEST_ALLOW_MISSING=subgroups,timestamps` (either or both).
use crate::ops_util::shared_gpu;

fn allowed_missing() -> Vec<String> {
    std::env::var("INKLING_TEST_ALLOW_MISSING")
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The shared device (the one every GPU test uses) was opened with subgroups and timestamp
/// queries.
#[test]
fn the_suite_device_has_subgroups_and_timestamps() {
    let gpu = shared_gpu();
    let allow = allowed_missing();
    let who = gpu.describe();
    for (name, present) in [
        ("subgroups", gpu.has_subgroups()),
        ("timestamps", gpu.has_timestamps()),
    ] {
        assert!(
            present || allow.iter().any(|a| a == name),
            "{who}: no {name}, so the tests that need them drop out; lavapipe (CI) has them. \
             Set INKLING_TEST_ALLOW_MISSING={name} to run without that coverage on purpose."
        );
    }
}
