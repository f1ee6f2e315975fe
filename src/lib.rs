//! inkling-wgpu: Inkling mixture-of-experts language models on any GPU through wgpu.
//!
//! Layout: [`formats`] (registry and CPU reference), [`container`] (stamped quantised containers
//! and checkpoint tensor names), [`gpu`] (device, kernels, dispatcher), [`model`] (config,
//! weights, forward), [`chat`] (the TMLv0 chat format), [`serve`] (the OpenAI-compatible HTTP
//! server), [`cli`] (the `inkling-wgpu` command).
pub mod bundled;
pub mod chat;
pub mod cli;
pub mod container;
pub mod formats;
pub mod gpu;
pub mod model;
pub mod progress;
pub mod serve;
pub mod tempfiles;

/// The most bytes a JSON side file (config.json, generation_config.json, tokenizer_config.json, a
/// shard index) is read up to: real ones are a few KiB to a few MiB.
pub const MAX_SIDE_FILE: u64 = 64 << 20;
/// The most bytes `tokenizer.json` is read up to (the o200k tokenizer is about 27 MiB).
pub const MAX_TOKENIZER_FILE: u64 = 512 << 20;

/// The text of `path`, refused (`InvalidData`) when it is not a regular file (a FIFO, a device such
/// as `/dev/zero`, also through a symlink) or past `cap` bytes, instead of blocking or reading
/// without end.
pub fn read_capped(path: &std::path::Path, cap: u64) -> std::io::Result<String> {
    use std::io::Read;
    // a FIFO would block the open, a device (/dev/zero) never ends: regular files only
    if !std::fs::metadata(path)?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(cap + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > cap {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {}: not a file of this kind", human_bytes(cap)),
        ));
    }
    Ok(text)
}

/// `n` bytes as `B`, `KiB`, `MiB`, `GiB` or `TiB` (powers of 1024, two decimals above bytes).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// Directory of the bundled default model in the checkout ([`bundled::source_dir`]:
/// `tests/fixtures/austen-demo`, a small Inkling trained on Jane Austen's novels, int4-g64 routed
/// experts, made by `tools/make_demo_model.py`); the binary runs it from its embedded copy
/// ([`bundled::materialize`]).
pub fn bundled_model_dir() -> std::path::PathBuf {
    bundled::source_dir()
}
