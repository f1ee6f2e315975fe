//! Temporary files of our own: how they are named, how they are removed when the process is
//! interrupted (SIGHUP, SIGINT, SIGTERM) and how a later run removes the ones a dead process left behind.
//!
//! A temporary file is `FINAL.PID.tmp` (`FINAL` the path it will be renamed to, `PID` the writing
//! process). [`create`] makes it and registers it, [`rename_into_place`] renames it to `FINAL` and
//! forgets it, [`discard`] removes and forgets it. After [`remove_on_signal`], SIGHUP, SIGINT and
//! SIGTERM remove every registered file (and the new directories from [`track_new_dirs`], when
//! empty), then exit with status 128 + signal number, the shell convention.
//! [`remove_stale`] removes files named like ours whose process is gone (never our own, never one
//! whose process still runs, never a name outside the caller's list of final names).
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Files and directories removed on SIGHUP / SIGINT / SIGTERM.
#[derive(Default)]
struct Registry {
    files: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
    /// Temporary directories of ours, removed with all they hold.
    trees: Vec<PathBuf>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    files: Vec::new(),
    dirs: Vec::new(),
    trees: Vec::new(),
});

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// The temporary name of `final_path` for this process: `FINAL.PID.tmp`.
pub fn tmp_path(final_path: &Path) -> PathBuf {
    let mut s = final_path.as_os_str().to_owned();
    s.push(format!(".{}.tmp", std::process::id()));
    PathBuf::from(s)
}

/// Create (truncating) the temporary file `tmp` and register it for removal on a signal. The file
/// is created while the registry is held, so a signal never leaves an unregistered one behind.
pub fn create(tmp: &Path) -> io::Result<File> {
    let mut r = registry();
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(tmp)?;
    r.files.push(tmp.to_path_buf());
    Ok(f)
}

/// Like [`create`], but fails when `tmp` exists (never truncates a file this call did not make).
pub fn create_new(tmp: &Path) -> io::Result<File> {
    let mut r = registry();
    let f = OpenOptions::new().write(true).create_new(true).open(tmp)?;
    r.files.push(tmp.to_path_buf());
    Ok(f)
}

/// Create the temporary directory `tmp` (which must not exist) and register it for removal, with
/// everything in it, on a signal ([`remove_tree`] removes it otherwise).
pub fn create_tree(tmp: &Path) -> io::Result<()> {
    let mut r = registry();
    fs::create_dir(tmp)?;
    r.trees.push(tmp.to_path_buf());
    Ok(())
}

/// Remove the temporary directory `tmp` with everything in it (if it exists) and stop tracking it.
pub fn remove_tree(tmp: &Path) {
    let mut r = registry();
    let _ = fs::remove_dir_all(tmp);
    r.trees.retain(|p| p != tmp);
}

fn forget(r: &mut Registry, tmp: &Path) {
    r.files.retain(|p| p != tmp);
}

/// Rename the registered temporary file `tmp` to `final_path` and stop tracking it.
pub fn rename_into_place(tmp: &Path, final_path: &Path) -> io::Result<()> {
    let mut r = registry();
    fs::rename(tmp, final_path)?;
    forget(&mut r, tmp);
    Ok(())
}

/// Remove the temporary file `tmp` (if it exists) and stop tracking it.
pub fn discard(tmp: &Path) {
    let mut r = registry();
    let _ = fs::remove_file(tmp);
    forget(&mut r, tmp);
}

/// Write `bytes` to `path` atomically: a registered temporary file, then a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = tmp_path(path);
    let res = create(&tmp).and_then(|mut f| {
        io::Write::write_all(&mut f, bytes)?;
        f.sync_all()
    });
    match res.and_then(|_| rename_into_place(&tmp, path)) {
        Ok(()) => Ok(()),
        Err(e) => {
            discard(&tmp);
            Err(e)
        }
    }
}

/// The directories among `dir` and its ancestors that do not exist yet, outermost first, now
/// registered so that a signal removes them (when empty) once this run has created them. Call it
/// before a command creates `dir`; then [`remove_dirs`] on failure or [`keep_dirs`] on success.
pub fn track_new_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut missing = Vec::new();
    let mut d = Some(dir);
    while let Some(p) = d {
        if p.as_os_str().is_empty() || p.exists() {
            break;
        }
        missing.push(p.to_path_buf());
        d = p.parent();
    }
    missing.reverse();
    registry().dirs.extend(missing.iter().cloned());
    missing
}

/// Remove the directories [`track_new_dirs`] returned, innermost first, each only when empty,
/// and stop tracking them.
pub fn remove_dirs(created: &[PathBuf]) {
    let mut r = registry();
    for d in created.iter().rev() {
        let _ = fs::remove_dir(d);
        r.dirs.retain(|p| p != d);
    }
}

/// Stop tracking directories from [`track_new_dirs`] (they now hold a finished result).
pub fn keep_dirs(created: &[PathBuf]) {
    registry().dirs.retain(|p| !created.contains(p));
}

/// Remove everything registered, innermost directory last. Holds the registry, so no new
/// temporary file can be created meanwhile.
fn remove_registered(r: &mut Registry) {
    for f in r.files.drain(..) {
        let _ = fs::remove_file(f);
    }
    for t in r.trees.drain(..) {
        let _ = fs::remove_dir_all(t);
    }
    for d in r.dirs.drain(..).rev() {
        let _ = fs::remove_dir(d);
    }
}

/// From now on, SIGHUP (the terminal closed), SIGINT and SIGTERM remove every registered temporary
/// file and directory and end the process with status 128 + the signal number (129, 130, 143).
/// Idempotent. On platforms without
/// these signals it does nothing.
pub fn remove_on_signal() -> io::Result<()> {
    #[cfg(unix)]
    {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        static INSTALLED: std::sync::Once = std::sync::Once::new();
        let mut result = Ok(());
        INSTALLED.call_once(|| {
            result = signal_hook::iterator::Signals::new([SIGHUP, SIGINT, SIGTERM]).map(
                |mut signals| {
                    std::thread::spawn(move || {
                        if let Some(sig) = signals.forever().next() {
                            let mut r = registry();
                            remove_registered(&mut r);
                            std::process::exit(128 + sig);
                        }
                    });
                },
            );
        });
        result
    }
    #[cfg(not(unix))]
    Ok(())
}

/// Whether process `pid` exists (on platforms where that cannot be told: assumed to).
pub fn process_alive(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return true;
        };
        // SAFETY: kill with signal 0 only checks for existence and permission.
        let rc = unsafe { libc::kill(pid, 0) };
        rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

/// The `(final name, pid)` of a file named like one of ours, `FINAL.PID.tmp`.
pub fn parse_tmp_name(name: &OsStr) -> Option<(&str, u32)> {
    let stem = name.to_str()?.strip_suffix(".tmp")?;
    let (final_name, pid) = stem.rsplit_once('.')?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((final_name, pid.parse().ok()?))
}

/// Remove temporary files in `dir` named `FINAL.PID.tmp` for which `is_ours(FINAL)` holds and
/// whose process `PID` no longer exists (never this process's). Returns the removed paths; a
/// directory that cannot be listed removes nothing.
pub fn remove_stale(dir: &Path, is_ours: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let me = std::process::id();
    let mut removed = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name();
        let Some((final_name, pid)) = parse_tmp_name(&name) else {
            continue;
        };
        let is_file = e.file_type().is_ok_and(|t| t.is_file());
        if is_file && is_ours(final_name) && pid != me && !process_alive(pid) {
            let p = e.path();
            if fs::remove_file(&p).is_ok() {
                removed.push(p);
            }
        }
    }
    removed.sort();
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tmp_names_parse_back() {
        let p = tmp_path(Path::new("/x/model.safetensors"));
        let name = p.file_name().unwrap();
        assert_eq!(
            parse_tmp_name(name),
            Some(("model.safetensors", std::process::id()))
        );
        assert_eq!(parse_tmp_name(OsStr::new("a.json.tmp")), None);
        assert_eq!(parse_tmp_name(OsStr::new("a.json.12x.tmp")), None);
        assert_eq!(
            parse_tmp_name(OsStr::new("a.json.77.tmp")),
            Some(("a.json", 77))
        );
    }

    #[test]
    fn this_process_is_alive() {
        assert!(process_alive(std::process::id()));
    }
}
