//! The bundled default model: the files of one small checkpoint embedded in the binary at build
//! time and written once to a per-user cache directory, so `generate` without `--model` works
//! wherever the binary is (after `cargo install`, with the checkout moved or deleted).
//!
//! Which model: `bundled_dir!` (the checkout directory, relative to the crate root) and the file
//! list in [`FILES`]; changing the default model means changing those two lines of this file.
//!
//! Where: `$XDG_CACHE_HOME/inkling-wgpu/bundled-HASH/` (else `~/.cache/...` on Unix,
//! `~/Library/Caches/...` on macOS, `%LOCALAPPDATA%\inkling-wgpu\...` on Windows, else under the
//! system's temporary directory), HASH the FNV-1a 64 of the embedded names and bytes, so a binary
//! with another bundled model uses another directory. The directory is written under a temporary
//! name and renamed into place, and reused while its files equal the embedded ones.
use anyhow::Context;
use std::path::{Path, PathBuf};

/// The bundled model's name (the last component of [`bundled_dir!`]; `serve`'s model id).
pub const NAME: &str = "austen-demo";

/// The bundled model's directory in the checkout, relative to the crate root.
macro_rules! bundled_dir {
    () => {
        "tests/fixtures/austen-demo"
    };
}

/// `(file name, bytes)` of each embedded file of [`bundled_dir!`].
macro_rules! embed {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/", bundled_dir!(), "/", $name)))),*]
    };
}

/// The embedded files of the bundled model.
pub const FILES: &[(&str, &[u8])] = embed!(
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "model.safetensors"
);

/// The bundled model's directory in the checkout this binary was built from (tests read the
/// fixture there; the binary itself uses [`materialize`]).
pub fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(bundled_dir!())
}

/// FNV-1a 64 over each embedded file's name, length (u64 LE) and bytes, as 16 hex digits.
pub fn content_hash() -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for (name, bytes) in FILES {
        eat(name.as_bytes());
        eat(&(bytes.len() as u64).to_le_bytes());
        eat(bytes);
    }
    format!("{h:016x}")
}

/// The per-user cache directory (see the module docs); without the variables that name one, a
/// directory in the system's temporary directory.
pub fn cache_root() -> PathBuf {
    user_cache_root().unwrap_or_else(|| std::env::temp_dir().join("inkling-wgpu-cache"))
}

fn user_cache_root() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let base = if cfg!(windows) {
        var("LOCALAPPDATA")
    } else if let Some(x) = var("XDG_CACHE_HOME") {
        Some(x)
    } else if cfg!(target_os = "macos") {
        var("HOME").map(|h| h.join("Library/Caches"))
    } else {
        var("HOME").map(|h| h.join(".cache"))
    };
    base.map(|b| b.join("inkling-wgpu"))
}

/// Whether `dir` holds exactly the embedded files (byte for byte).
fn is_complete(dir: &Path) -> bool {
    FILES
        .iter()
        .all(|(name, bytes)| std::fs::read(dir.join(name)).is_ok_and(|b| b == *bytes))
}

/// The bundled model as a directory on disk: the cache directory when it is complete, else written
/// now. Errors say where it tried and what to pass instead.
pub fn materialize() -> anyhow::Result<PathBuf> {
    let root = cache_root();
    let dir = root.join(format!("bundled-{}", content_hash()));
    if is_complete(&dir) {
        return Ok(dir);
    }
    write_into(&root, &dir).with_context(|| {
        format!(
            "no --model given, and the bundled model could not be written to {}; pass --model DIR \
             (a checkpoint directory with config.json, *.safetensors and tokenizer.json)",
            dir.display()
        )
    })?;
    Ok(dir)
}

/// Write [`FILES`] into `root/NAME.PID.tmp`, then rename it to `dir` (replacing an incomplete
/// `dir`). Another process finishing first is fine: its directory is complete.
fn write_into(root: &Path, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    let tmp = crate::tempfiles::tmp_path(dir);
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let written = (|| -> anyhow::Result<()> {
        for (name, bytes) in FILES {
            let p = tmp.join(name);
            std::fs::write(&p, bytes).with_context(|| format!("writing {}", p.display()))?;
        }
        if dir.exists() && !is_complete(dir) {
            std::fs::remove_dir_all(dir)
                .with_context(|| format!("removing the incomplete {}", dir.display()))?;
        }
        match std::fs::rename(&tmp, dir) {
            Ok(()) => Ok(()),
            Err(_) if is_complete(dir) => Ok(()),
            Err(e) => {
                Err(e).with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))
            }
        }
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    written
}
