//! Where `generate`'s prompt text comes from: `--prompt TEXT`, `--prompt -` (standard input),
//! `--prompt-file PATH`, or, with none of them (nor `--prompt-ids`), standard input when it is
//! not a terminal and not empty (`echo hi | inkling-wgpu generate`). Text read from a file or a pipe must be
//! UTF-8; it is used as it is (a trailing newline is part of the prompt, as in llama.cpp's
//! `--file`).
use anyhow::{bail, Context};
use std::io::{IsTerminal, Read};
use std::path::Path;

/// The prompt text, or `None` when there is none to read (no flag and stdin is a terminal).
/// A file or pipe is read up to `max_bytes` (more cannot fit the model's context: see
/// `generate`), so `--prompt-file /dev/zero` is an error, not an unbounded read. Errors name the
/// source: `--prompt-file PATH` or `standard input`.
pub fn prompt_text(
    prompt: Option<&str>,
    prompt_file: Option<&Path>,
    max_bytes: u64,
) -> anyhow::Result<Option<String>> {
    match (prompt, prompt_file) {
        (Some(_), Some(_)) => bail!("give --prompt or --prompt-file, not both"),
        (Some("-"), None) => read_stdin(max_bytes).map(Some),
        (Some(t), None) => Ok(Some(t.to_string())),
        (None, Some(p)) => {
            let what = format!("--prompt-file {}", p.display());
            let f = std::fs::File::open(p).with_context(|| what.clone())?;
            let bytes = read_bounded(f, max_bytes, &what)?;
            utf8(bytes, &what).map(Some)
        }
        // an empty pipe (or /dev/null) is no prompt at all
        (None, None) if !std::io::stdin().is_terminal() => {
            read_stdin(max_bytes).map(|t| Some(t).filter(|t| !t.is_empty()))
        }
        (None, None) => Ok(None),
    }
}

fn read_stdin(max_bytes: u64) -> anyhow::Result<String> {
    let bytes = read_bounded(
        std::io::stdin().lock(),
        max_bytes,
        "the prompt on standard input",
    )?;
    utf8(bytes, "the prompt on standard input")
}

/// All of `r`, or an error naming `what` once it passes `max_bytes`.
fn read_bounded(r: impl Read, max_bytes: u64, what: &str) -> anyhow::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    r.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {what}"))?;
    if bytes.len() as u64 > max_bytes {
        bail!(
            "{what} holds more than {max_bytes} bytes, more text than the model's context can \
             take as a prompt"
        );
    }
    Ok(bytes)
}

/// `bytes` as UTF-8, or an error naming `source` and the byte offset of the first invalid byte.
fn utf8(bytes: Vec<u8>, source: &str) -> anyhow::Result<String> {
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{source} is not UTF-8 text (invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        )
    })
}
