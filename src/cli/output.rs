//! Standard output that never panics: [`outln!`] and [`out!`] return a [`StdoutError`] instead
//! of panicking as `println!` does when stdout is a closed pipe or a full disk.
//!
//! `main` turns a closed pipe ([`is_broken_pipe`]) into the ending a shell expects of a program
//! whose reader went away (`inkling-wgpu info | head -3`): no message, and on Unix death by
//! SIGPIPE (status 141 in the shell), as coreutils do ([`exit_broken_pipe`]); any other write
//! error is reported as an error naming standard output.
use std::io::{self, Write};

/// A failed write to standard output.
#[derive(Debug, thiserror::Error)]
#[error("writing to standard output: {0}")]
pub struct StdoutError(#[source] pub io::Error);

/// Write `args` to stdout and flush.
pub fn write_stdout(args: std::fmt::Arguments<'_>) -> Result<(), StdoutError> {
    let mut o = io::stdout().lock();
    o.write_fmt(args)
        .and_then(|_| o.flush())
        .map_err(StdoutError)
}

/// One line of a text report: on stdout, or on stderr when `json` (stdout then holds the JSON
/// document).
pub fn report_line(json: bool, line: &str) -> Result<(), StdoutError> {
    if json {
        eprintln!("{line}");
        Ok(())
    } else {
        write_stdout(format_args!("{line}\n"))
    }
}

/// Write raw bytes to stdout and flush.
pub fn write_stdout_bytes(bytes: &[u8]) -> Result<(), StdoutError> {
    let mut o = io::stdout().lock();
    o.write_all(bytes)
        .and_then(|_| o.flush())
        .map_err(StdoutError)
}

/// `print!` that returns `Result<(), StdoutError>`.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::output::write_stdout(format_args!($($arg)*))
    };
}

/// `println!` that returns `Result<(), StdoutError>`.
macro_rules! outln {
    () => {
        $crate::cli::output::write_stdout_bytes(b"\n")
    };
    ($($arg:tt)*) => {
        $crate::cli::output::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprintln!` that never panics ([`write_stderr`]).
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::cli::output::write_stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}

pub(crate) use {errln, out, outln};

/// Write `args` to stderr and flush, never panicking as `eprintln!` does when stderr is gone: a
/// closed pipe (its reader went away, `chat 2>&1 | head -c 5`) ends the process as a closed
/// stdout does ([`exit_broken_pipe`]); any other error is dropped, as there is nowhere left to
/// report it.
pub fn write_stderr(args: std::fmt::Arguments<'_>) {
    let mut e = io::stderr().lock();
    if let Err(err) = e.write_fmt(args).and_then(|_| e.flush()) {
        if err.kind() == io::ErrorKind::BrokenPipe {
            exit_broken_pipe()
        }
    }
}

/// Whether `e` is a write to standard output whose reader has gone (EPIPE).
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<StdoutError>()
            .is_some_and(|s| s.0.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// End the process as a program killed by a closed pipe: on Unix by SIGPIPE with its default
/// action (the shell reports 141), elsewhere with exit status 141.
pub fn exit_broken_pipe() -> ! {
    #[cfg(unix)]
    // SAFETY: restoring SIGPIPE's default action and raising it is what a C program writing to a
    // closed pipe gets; no handler of ours runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    std::process::exit(141)
}
