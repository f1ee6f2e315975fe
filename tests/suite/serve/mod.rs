//! `serve`: the OpenAI-compatible server driven by the official client, and by plain HTTP
//! (context-length errors, graceful shutdown).

#[cfg(unix)]
pub mod context;
pub mod serve_openai;
#[cfg(unix)]
mod server;
#[cfg(unix)]
pub mod shutdown;
pub mod test_python;
