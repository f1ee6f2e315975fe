//! Where `generate`'s prompt text comes from: `--prompt TEXT`, `--prompt -` (standard input),
//! `--prompt-file PATH`, or, with none of them (nor `--prompt-ids`), standard input when it is
//! not a terminal and not empty (`echo hi | inkling-wgpu generate`). Text read from a file or a pipe must be
//! UTF-8; it is used as it is (a trailing newline is part of the prompt, as in llama.cpp's
//! `--file`).
use anyhow::{bail, Context};
use std::io::{IsTerminal, Read};
use std::path::Path;

/// The prompt text, or `None` when there is none to read (no flag and stdin is a terminal).
/// Errors name the source: `--prompt-file PATH` or `standard input`.
pub fn prompt_text(
    prompt: Option<&str>,
    prompt_file: Option<&Path>,
) -> anyhow::Result<Option<String>> {
    match (prompt, prompt_file) {
        (Some(_), Some(_)) => bail!("give --prompt or --prompt-file, not both"),
        (Some("-"), None) => read_stdin().map(Some),
        (Some(t), None) => Ok(Some(t.to_string())),
        (None, Some(p)) => {
            let bytes =
                std::fs::read(p).with_context(|| format!("--prompt-file {}", p.display()))?;
            utf8(bytes, &format!("--prompt-file {}", p.display())).map(Some)
        }
        // an empty pipe (or /dev/null) is no prompt at all
        (None, None) if !std::io::stdin().is_terminal() => {
            read_stdin().map(|t| Some(t).filter(|t| !t.is_empty()))
        }
        (None, None) => Ok(None),
    }
}

fn read_stdin() -> anyhow::Result<String> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .read_to_end(&mut bytes)
        .context("reading the prompt from standard input")?;
    utf8(bytes, "the prompt on standard input")
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
