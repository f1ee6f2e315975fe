//! The usage file: how often the router picked each `(layer, expert)`, recorded per model and stored
//! next to it ([`USAGE_FILE`]), used at start-up to rank the hot set that
//! [`crate::model::expert_cache::ExpertCache::pin`] keeps resident.
//!
//! The file is a cache of statistics, never required: a user can delete it, and
//! [`load_or_warn`] turns a missing, corrupt or foreign file into "no usage" plus one warning, so
//! it never stops a run. A [`fingerprint`] of the model directory ties the file to one model.
//!
//! Concurrent runs of one model merge their counts: [`Usage::save_merged`] holds an exclusive lock
//! on `PATH.lock` (an empty file created next to the usage file and left there) while it reads the
//! file, adds this run's counts and writes it back.
//!
//! Format (JSON, written atomically by [`Usage::save`]):
//! `{"format":"inkling-wgpu-usage/1","fingerprint":"<16 hex>","n_layers":L,"n_experts":E,
//! "counts":[[u64; E]; L]}`.
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The usage file's name in the model directory.
pub const USAGE_FILE: &str = "inkling-wgpu.usage.json";

/// The `format` tag of the current usage file version.
pub const USAGE_FORMAT: &str = "inkling-wgpu-usage/1";

/// A usage-file error: the file and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{}: {kind}", path.display())]
pub struct UsageError {
    /// The file (or directory, for [`fingerprint`]) concerned.
    pub path: PathBuf,
    /// What is wrong.
    pub kind: UsageErrorKind,
}

/// What is wrong with a usage file (see [`UsageError`]).
#[derive(Debug, thiserror::Error)]
pub enum UsageErrorKind {
    /// Reading, listing, writing or renaming failed.
    #[error("cannot {op}: {source}")]
    Io {
        /// `"read"`, `"list"`, `"write"`, `"rename"`, ...
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// Not valid JSON, or a field of the wrong JSON type / missing.
    #[error("not a valid usage file: {0}")]
    Json(#[source] serde_json::Error),
    /// The `format` tag is missing or not [`USAGE_FORMAT`].
    #[error("format tag is {found}, expected \"{USAGE_FORMAT}\"")]
    Format {
        /// The tag found, as JSON (`null` when missing).
        found: String,
    },
    /// A fingerprint, `n_layers` or `n_experts` different from the running model's.
    #[error("written for another model: {field} is {found}, this model's is {expected}")]
    Mismatch {
        field: &'static str,
        found: String,
        expected: String,
    },
    /// `counts` is not `n_layers × n_experts`.
    #[error("counts is not n_layers × n_experts: {0}")]
    Shape(String),
    /// The path is a directory, device, pipe or socket: never read (a pipe would block) nor
    /// replaced.
    #[error("not a regular file; leaving it alone")]
    NotAFile,
    /// [`Usage::save`] found a file that is not a usage file and refused to replace it.
    #[error("exists and is not an inkling-wgpu usage file; not overwriting it")]
    NotOurs,
}

impl UsageError {
    fn new(path: &Path, kind: UsageErrorKind) -> UsageError {
        UsageError {
            path: path.to_path_buf(),
            kind,
        }
    }
    fn io(path: &Path, op: &'static str, source: std::io::Error) -> UsageError {
        UsageError::new(path, UsageErrorKind::Io { op, source })
    }
}

/// Routing counts of one model: `counts[layer][expert]` = how many times the router picked that
/// expert (per token), saturating at `u64::MAX`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Usage {
    /// The model's [`fingerprint`].
    pub fingerprint: String,
    pub n_layers: usize,
    pub n_experts: usize,
    /// `[layer][expert]`, `n_layers × n_experts`.
    pub counts: Vec<Vec<u64>>,
}

/// The on-disk form.
#[derive(Serialize, Deserialize)]
struct UsageFile {
    format: String,
    fingerprint: String,
    n_layers: usize,
    n_experts: usize,
    counts: Vec<Vec<u64>>,
}

impl Usage {
    /// An all-zero table of `n_layers × n_experts` counts.
    pub fn new(fingerprint: &str, n_layers: usize, n_experts: usize) -> Usage {
        Usage {
            fingerprint: fingerprint.to_string(),
            n_layers,
            n_experts,
            counts: vec![vec![0; n_experts]; n_layers],
        }
    }

    /// Count one routing of `expert` in `layer`. A key out of range is ignored (the table keeps its
    /// shape; a stale or foreign index must not stop a run).
    pub fn record(&mut self, layer: usize, expert: u32) {
        if let Some(c) = self
            .counts
            .get_mut(layer)
            .and_then(|row| row.get_mut(expert as usize))
        {
            *c = c.saturating_add(1);
        }
    }

    /// The keys ranked by count, descending, ties by (layer, expert) ascending, zero counts excluded.
    pub fn ranked(&self) -> Vec<(usize, usize)> {
        let mut keys: Vec<(u64, usize, usize)> = self
            .counts
            .iter()
            .enumerate()
            .flat_map(|(l, row)| {
                row.iter()
                    .enumerate()
                    .filter(|&(_, &c)| c > 0)
                    .map(move |(e, &c)| (c, l, e))
            })
            .collect();
        keys.sort_unstable_by(|a, b| b.0.cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
        keys.into_iter().map(|(_, l, e)| (l, e)).collect()
    }

    /// Read `path`. `Ok(None)` when the file does not exist. `Err` (naming the path and what is
    /// wrong) when it cannot be read, is not valid JSON, has the wrong `format` tag, a fingerprint /
    /// `n_layers` / `n_experts` different from the expected ones passed in, or counts that are not
    /// `n_layers × n_experts`.
    pub fn load(
        path: &Path,
        fingerprint: &str,
        n_layers: usize,
        n_experts: usize,
    ) -> Result<Option<Usage>, UsageError> {
        match fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(UsageError::io(path, "stat", e)),
            Ok(m) if !m.is_file() => return Err(UsageError::new(path, UsageErrorKind::NotAFile)),
            Ok(_) => {}
        }
        let text = match fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(UsageError::io(path, "read", e)),
        };
        let err = |kind| UsageError::new(path, kind);
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| err(UsageErrorKind::Json(e)))?;
        // The tag first, so a future format reports itself as such rather than as a missing field.
        let tag = value.get("format");
        if tag.and_then(|t| t.as_str()) != Some(USAGE_FORMAT) {
            let found = tag.map_or("null".to_string(), |t| t.to_string());
            return Err(err(UsageErrorKind::Format { found }));
        }
        let file: UsageFile =
            serde_json::from_value(value).map_err(|e| err(UsageErrorKind::Json(e)))?;
        let mismatch = |field, found: String, expected: String| {
            err(UsageErrorKind::Mismatch {
                field,
                found,
                expected,
            })
        };
        if file.fingerprint != fingerprint {
            return Err(mismatch(
                "fingerprint",
                file.fingerprint,
                fingerprint.to_string(),
            ));
        }
        if file.n_layers != n_layers {
            return Err(mismatch(
                "n_layers",
                file.n_layers.to_string(),
                n_layers.to_string(),
            ));
        }
        if file.n_experts != n_experts {
            return Err(mismatch(
                "n_experts",
                file.n_experts.to_string(),
                n_experts.to_string(),
            ));
        }
        if file.counts.len() != n_layers {
            return Err(err(UsageErrorKind::Shape(format!(
                "{} rows, expected {n_layers}",
                file.counts.len()
            ))));
        }
        if let Some((l, row)) = file
            .counts
            .iter()
            .enumerate()
            .find(|(_, row)| row.len() != n_experts)
        {
            return Err(err(UsageErrorKind::Shape(format!(
                "row {l} has {} counts, expected {n_experts}",
                row.len()
            ))));
        }
        Ok(Some(Usage {
            fingerprint: file.fingerprint,
            n_layers,
            n_experts,
            counts: file.counts,
        }))
    }

    /// Write atomically: a new temporary file next to `path` (`path.<pid>.tmp`, created only if
    /// absent, flushed to disk), then renamed over `path`, so a crash leaves the old file or the
    /// new one, never half of one; the temporary file is removed when a step fails, and one that a
    /// killed run left behind is removed by the next save.
    ///
    /// Refuses ([`UsageErrorKind::NotAFile`], [`UsageErrorKind::NotOurs`]) to replace anything
    /// but a missing path or a usage file (any model's: the file is a cache): a directory, device,
    /// pipe, or a file that is not JSON with the [`USAGE_FORMAT`] tag is left as it is.
    pub fn save(&self, path: &Path) -> Result<(), UsageError> {
        replaceable(path)?;
        let file = UsageFile {
            format: USAGE_FORMAT.to_string(),
            fingerprint: self.fingerprint.clone(),
            n_layers: self.n_layers,
            n_experts: self.n_experts,
            counts: self.counts.clone(),
        };
        let bytes = serde_json::to_vec(&file)
            .map_err(|e| UsageError::new(path, UsageErrorKind::Json(e)))?;
        if let (Some(dir), Some(name)) = (path.parent(), path.file_name()) {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            crate::tempfiles::remove_stale(dir, |f| std::ffi::OsStr::new(f) == name);
        }
        let tmp = crate::tempfiles::tmp_path(path);
        // never remove a file this call did not create
        let mut f =
            crate::tempfiles::create_new(&tmp).map_err(|e| UsageError::io(&tmp, "create", e))?;
        if let Err(e) = f.write_all(&bytes).and_then(|_| f.sync_all()) {
            drop(f);
            crate::tempfiles::discard(&tmp);
            return Err(UsageError::io(&tmp, "write", e));
        }
        drop(f);
        if let Err(e) = crate::tempfiles::rename_into_place(&tmp, path) {
            crate::tempfiles::discard(&tmp);
            return Err(UsageError::io(path, "rename the temporary file onto", e));
        }
        Ok(())
    }

    /// Save this run's counts merged with what other runs saved meanwhile: holding an exclusive
    /// lock on `PATH.lock`, re-read `path` (when it is a usage file of this model; else start from
    /// zero), add `self − base` (the counts this run added to the table `base` it started from;
    /// cells saturating, a cell below `base` adds nothing) and [`save`](Usage::save) the sum.
    /// Returns the table written. A path [`save`](Usage::save) would refuse is refused before the
    /// lock file is created; a lock that cannot be taken (the lock path is not a file, or a file
    /// system without locks) is an error, as are [`save`](Usage::save)'s.
    pub fn save_merged(&self, path: &Path, base: &Usage) -> Result<Usage, UsageError> {
        self.save_merged_holding(path, base, std::time::Duration::ZERO)
    }

    /// [`save_merged`](Usage::save_merged), holding the lock for `hold` between the read and the
    /// write (tests use it to make two saves overlap).
    pub fn save_merged_holding(
        &self,
        path: &Path,
        base: &Usage,
        hold: std::time::Duration,
    ) -> Result<Usage, UsageError> {
        // a path the save would refuse gets no lock file beside it either
        replaceable(path)?;
        let mut lock_path = path.as_os_str().to_owned();
        lock_path.push(".lock");
        let lock_path = PathBuf::from(lock_path);
        let lock = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(|e| UsageError::io(&lock_path, "open", e))?;
        lock.lock()
            .map_err(|e| UsageError::io(&lock_path, "lock", e))?;
        let on_disk = Usage::load(path, &self.fingerprint, self.n_layers, self.n_experts)
            .ok()
            .flatten();
        let mut merged =
            on_disk.unwrap_or_else(|| Usage::new(&self.fingerprint, self.n_layers, self.n_experts));
        for ((row, mine), was) in merged.counts.iter_mut().zip(&self.counts).zip(&base.counts) {
            for ((c, &m), &b) in row.iter_mut().zip(mine).zip(was) {
                *c = c.saturating_add(m.saturating_sub(b));
            }
        }
        if !hold.is_zero() {
            std::thread::sleep(hold);
        }
        let r = merged.save(path);
        drop(lock);
        r.map(|_| merged)
    }

    /// Merge another count table of the same shape (adds counts, saturating). Cells outside this
    /// table's shape are ignored; the fingerprints are not compared (the caller's business).
    pub fn merge(&mut self, other: &Usage) {
        for (row, orow) in self.counts.iter_mut().zip(&other.counts) {
            for (c, &o) in row.iter_mut().zip(orow) {
                *c = c.saturating_add(o);
            }
        }
    }
}

/// Whether [`Usage::save`] may write `path`: a missing path or a usage file (any model's); else
/// the refusal ([`UsageErrorKind::NotAFile`], [`UsageErrorKind::NotOurs`]).
fn replaceable(path: &Path) -> Result<(), UsageError> {
    match fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(UsageError::io(path, "stat", e)),
        Ok(m) if !m.is_file() => Err(UsageError::new(path, UsageErrorKind::NotAFile)),
        Ok(_) => {
            let ours = fs::read(path)
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .is_some_and(|v| v.get("format").and_then(|t| t.as_str()) == Some(USAGE_FORMAT));
            if ours {
                Ok(())
            } else {
                Err(UsageError::new(path, UsageErrorKind::NotOurs))
            }
        }
    }
}

/// FNV-1a 64.
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// A model fingerprint: FNV-1a 64 (hex, 16 chars) over the bytes of `dir/config.json` followed by,
/// for each `*.safetensors` file in `dir` sorted by name, its file name and its length in bytes
/// (u64 LE). Symbolic links are followed (a Hugging Face snapshot links its files). Errors name the
/// file (or `dir` when it cannot be listed).
///
/// Cheap by design (no weight bytes are read): it tells models apart, it does not verify them.
pub fn fingerprint(dir: &Path) -> Result<String, UsageError> {
    let mut h = Fnv::new();
    let config = dir.join("config.json");
    let bytes = fs::read(&config).map_err(|e| UsageError::io(&config, "read", e))?;
    h.update(&bytes);
    let mut shards = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| UsageError::io(dir, "list", e))? {
        let entry = entry.map_err(|e| UsageError::io(dir, "list", e))?;
        let name = entry.file_name();
        if !name.as_encoded_bytes().ends_with(b".safetensors") {
            continue;
        }
        // an entry that cannot be followed (a dangling link) is not a shard the model reads
        if let Ok(meta) = fs::metadata(entry.path()) {
            if meta.is_file() {
                shards.push((name, meta.len()));
            }
        }
    }
    shards.sort();
    for (name, len) in shards {
        h.update(name.as_encoded_bytes());
        h.update(&len.to_le_bytes());
    }
    Ok(format!("{:016x}", h.0))
}

/// Load for use at start-up: like [`Usage::load`] but any error becomes `None` plus ONE warning line
/// on stderr, `warning: ignoring usage file {path}: {reason}`, so a corrupt file or another model's
/// file never stops a run. A missing file is `None` without a warning.
pub fn load_or_warn(
    path: &Path,
    fingerprint: &str,
    n_layers: usize,
    n_experts: usize,
) -> Option<Usage> {
    match Usage::load(path, fingerprint, n_layers, n_experts) {
        Ok(u) => u,
        Err(e) => {
            eprintln!(
                "warning: ignoring usage file {}: {}",
                path.display(),
                e.kind
            );
            None
        }
    }
}
