//! `serve`: the OpenAI-compatible server driven by the official client, by plain HTTP
//! (context-length errors, graceful shutdown), its request parser on hostile bodies (named
//! errors, fuzzing), and the server under hostile clients.

// Linux only: Debian's chromium and chromium-driver (.ci/run installs them)
#[cfg(target_os = "linux")]
pub mod chat_page;
#[cfg(unix)]
pub mod context;
pub mod engine_batch;
pub mod engine_tools;
#[cfg(unix)]
pub mod hostile;
pub mod parser_fuzz;
pub mod request_errors;
pub mod request_fields;
#[cfg(unix)]
pub mod serve_bench;
#[cfg(unix)]
pub mod serve_concurrent;
#[cfg(unix)]
pub mod serve_logprobs;
pub mod serve_openai;
#[cfg(unix)]
pub mod serve_reference;
#[cfg(unix)]
pub mod serve_tools;
#[cfg(unix)]
mod server;
#[cfg(unix)]
pub mod shutdown;
pub mod test_python;
