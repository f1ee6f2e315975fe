//! Replacing an earlier conversion: what in a destination directory the writer may prove it wrote
//! ([`previous_conversion`]), and the swap that puts a new container in its place
//! ([`swap_into_place`]) so that a kill at any moment leaves the old or the new container whole.
//!
//! A file is provably ours when it is a `model*.safetensors` whose header carries the container
//! stamp (`__metadata__[STAMP_KEY]`, which no source checkpoint has), the index of such shards, a
//! side file the writer adds (`config.json`, `tokenizer.json`, ... as named by the caller) in a
//! directory whose weights are all stamped, or the usage file `generate` keeps beside a model.
//! Anything else (a source or damaged checkpoint, a partial download, a user's file) is refused by
//! name, `--force` included: nothing is deleted that the writer cannot prove it wrote.
//!
//! The new container is written into a sibling staging directory (`OUT.PID.tmp`, removed on a
//! signal like every temporary of ours) and exchanged with `OUT` in one atomic rename
//! (`renameat2(RENAME_EXCHANGE)` on Linux, `renamex_np(RENAME_SWAP)` on macOS); the old tree, now
//! at the staging name, is removed afterwards. Where no atomic exchange exists (other systems, file
//! systems that refuse it) `OUT` is first renamed to `OUT.PID.old`: a kill between the two
//! renames leaves the old container whole there, and the next run renames it back
//! ([`recover_interrupted_swap`]).

use super::stamp::STAMP_KEY;
use crate::model::usage::USAGE_FILE;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// A point of [`swap_into_place`] where a test can stop the process as a kill would (in-process,
/// without any cleanup): the destination must hold a whole container afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwapStep {
    /// The staging directory is complete; nothing is renamed yet.
    BeforeSwap,
    /// The new container is in place; the old tree is still at the staging name.
    BeforeRemovingOld,
    /// Fallback path only: the old container is at `OUT.PID.old`, the new one still staged.
    BetweenRenames,
}

/// Whether `name` is a weight file or the index of a container: `model*.safetensors` or
/// `model.safetensors.index.json`.
pub fn is_container_file(name: &str) -> bool {
    name.starts_with("model")
        && (name.ends_with(".safetensors") || name == "model.safetensors.index.json")
}

/// Whether `name` is a temporary of the writer's (`FINAL.PID.tmp`) for a container file or one
/// of `side_files`.
pub fn is_our_temporary(name: &str, side_files: &[&str]) -> bool {
    crate::tempfiles::parse_tmp_name(std::ffi::OsStr::new(name))
        .is_some_and(|(f, _)| is_container_file(f) || side_files.contains(&f))
}

/// Whether the safetensors file at `path` carries the container stamp in its header; `Err` with
/// the reason when the header cannot be read (too short, not JSON, not an object).
fn has_stamp(path: &Path) -> std::result::Result<bool, String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .map_err(|_| "shorter than a safetensors header".to_string())?;
    let n = u64::from_le_bytes(len);
    if n > 100_000_000 {
        return Err(format!("header length {n} exceeds 100 MB"));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header)
        .map_err(|_| format!("truncated inside its {n}-byte header"))?;
    let v: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| format!("header JSON: {e}"))?;
    Ok(v.get("__metadata__")
        .and_then(|m| m.get(STAMP_KEY))
        .is_some())
}

/// The files of a previous conversion in `dst` (sorted), each proved ours (module docs); empty
/// when `dst` holds no container file. `side_files` are the names the writer adds beside the
/// weights. Errors name the first file that is not provably ours: a source checkpoint, a damaged
/// or partial one, or any other file or directory when the folder holds a conversion.
pub fn previous_conversion(dst: &Path, side_files: &[&str]) -> Result<Vec<PathBuf>> {
    let Ok(rd) = std::fs::read_dir(dst) else {
        return Ok(vec![]);
    };
    let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    entries.sort();
    let name_of = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    if !entries
        .iter()
        .any(|p| name_of(p).is_some_and(|n| is_container_file(&n)))
    {
        return Ok(vec![]);
    }
    let refuse = |p: &Path, why: String| -> anyhow::Error {
        anyhow::anyhow!(
            "{}: {why}; refusing to replace {} (only a conversion of inkling-wgpu's own, every \
             file of it, is ever replaced, even with --force; move the file away or choose \
             another --out)",
            p.display(),
            dst.display()
        )
    };
    for p in &entries {
        let name = name_of(p).unwrap_or_default();
        if is_our_temporary(&name, side_files) {
            // a temporary of ours (a dead run's is removed once the checks pass)
            continue;
        }
        if name.ends_with(".safetensors") && name.starts_with("model") {
            match has_stamp(p) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(refuse(
                        p,
                        "a source checkpoint (no container stamp), not a conversion".into(),
                    ))
                }
                Err(why) => return Err(refuse(p, format!("a damaged weight file ({why})"))),
            }
        } else if name == "model.safetensors.index.json" {
            check_index(p, dst).map_err(|why| refuse(p, why))?;
        } else if !(side_files.contains(&name.as_str())
            || name == USAGE_FILE
            || name == format!("{USAGE_FILE}.lock"))
        {
            return Err(refuse(p, "not a file of a conversion".into()));
        }
    }
    Ok(entries)
}

/// Every shard the index at `path` names exists in `dst` (whose weight files are checked for the
/// stamp one by one); the reason otherwise (a partial download).
fn check_index(path: &Path, dst: &Path) -> std::result::Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("JSON: {e}"))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or("no weight_map object")?;
    for shard in map.values().filter_map(|s| s.as_str()) {
        if !dst.join(shard).is_file() {
            return Err(format!(
                "an index naming {shard}, which is missing (a partial download?)"
            ));
        }
    }
    Ok(())
}

/// The staging directory of a replacement of `dst` by this process: `DST.PID.tmp` beside it.
pub fn staging_dir(dst: &Path) -> PathBuf {
    crate::tempfiles::tmp_path(dst)
}

/// `DST.PID.old`: where the fallback path parks the old container between its two renames.
fn parked_dir(dst: &Path, pid: u32) -> PathBuf {
    let mut s = dst.as_os_str().to_owned();
    s.push(format!(".{pid}.old"));
    PathBuf::from(s)
}

/// After a kill between the two renames of the fallback path: `dst` is missing (or an empty
/// folder) and `DST.PID.old` of a dead process holds the old container, which is renamed back. Returns
/// whether it did. Also removes staging directories (`DST.PID.tmp`) of dead processes.
pub fn recover_interrupted_swap(dst: &Path) -> Result<bool> {
    let (Some(parent), Some(name)) = (dst.parent(), dst.file_name()) else {
        return Ok(false);
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let name = name.to_string_lossy().into_owned();
    let Ok(rd) = std::fs::read_dir(parent) else {
        return Ok(false);
    };
    let mut recovered = false;
    for e in rd.flatten() {
        let entry = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = entry.strip_prefix(&format!("{name}.")) else {
            continue;
        };
        let Some((pid, kind)) = rest.split_once('.') else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if pid == std::process::id()
            || crate::tempfiles::process_alive(pid)
            || !e.file_type().is_ok_and(|t| t.is_dir())
        {
            continue;
        }
        match kind {
            // missing, or an empty folder a caller created meanwhile (rename replaces it)
            "old" if std::fs::read_dir(dst).map_or(true, |mut d| d.next().is_none()) => {
                std::fs::rename(e.path(), dst).with_context(|| {
                    format!("restoring {} to {}", e.path().display(), dst.display())
                })?;
                eprintln!(
                    "note: {} was left by an interrupted replacement; restored to {}",
                    e.path().display(),
                    dst.display()
                );
                recovered = true;
            }
            "tmp" => {
                let _ = std::fs::remove_dir_all(e.path());
            }
            _ => {}
        }
    }
    Ok(recovered)
}

/// Exchange the complete container in `staging` with the previous one in `dst`, then remove the
/// old tree. `crash_at` stops there as a kill would (tests). Errors: a failed rename, naming both
/// paths (the old container is then still whole at `dst`, or at `DST.PID.old` on the fallback
/// path, which the next run restores).
pub fn swap_into_place(staging: &Path, dst: &Path, crash_at: Option<SwapStep>) -> Result<()> {
    let crash = |step: SwapStep| -> Result<()> {
        if crash_at == Some(step) {
            bail!("injected crash at {step:?}");
        }
        Ok(())
    };
    crash(SwapStep::BeforeSwap)?;
    if exchange(staging, dst).is_ok() {
        crash(SwapStep::BeforeRemovingOld)?;
    } else {
        let parked = parked_dir(dst, std::process::id());
        std::fs::rename(dst, &parked)
            .with_context(|| format!("renaming {} to {}", dst.display(), parked.display()))?;
        crash(SwapStep::BetweenRenames)?;
        if let Err(e) = std::fs::rename(staging, dst) {
            // put the old container back before reporting
            let _ = std::fs::rename(&parked, dst);
            return Err(e)
                .with_context(|| format!("renaming {} to {}", staging.display(), dst.display()));
        }
        crash(SwapStep::BeforeRemovingOld)?;
        let _ = std::fs::remove_dir_all(&parked);
    }
    // the old tree, now at the staging name (or already gone on the fallback path)
    crate::tempfiles::remove_tree(staging);
    Ok(())
}

/// Atomically exchange the directories `a` and `b` (both exist).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let ca = std::ffi::CString::new(a.as_os_str().as_bytes())?;
    let cb = std::ffi::CString::new(b.as_os_str().as_bytes())?;
    // SAFETY: both paths are NUL-terminated C strings that live across the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Atomically exchange the directories `a` and `b` (both exist).
#[cfg(target_vendor = "apple")]
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let ca = std::ffi::CString::new(a.as_os_str().as_bytes())?;
    let cb = std::ffi::CString::new(b.as_os_str().as_bytes())?;
    // SAFETY: both paths are NUL-terminated C strings that live across the call.
    let rc = unsafe { libc::renamex_np(ca.as_ptr(), cb.as_ptr(), libc::RENAME_SWAP) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// No atomic exchange on this system: the caller takes the two-rename path.
#[cfg(not(any(target_os = "linux", target_os = "android", target_vendor = "apple")))]
fn exchange(_a: &Path, _b: &Path) -> std::io::Result<()> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}
