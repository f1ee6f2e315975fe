//! The OpenAI-compatible HTTP server behind `inkling-wgpu serve`.
//!
//! - [`engine`]: one thread owns the model; requests wait in a bounded queue and run one at a
//!   time, each cancelled when its client goes away or the server shuts down (queued or running).
//! - [`api`]: request parsing and validation, response bodies, OpenAI error envelopes.
//! - [`http`]: the axum routes, SSE streaming with comment pings, the body size limit, the
//!   graceful shutdown ([`http::Shutdown`]: queued and running requests end at once).
//! - [`timeout`]: the request-head read timeout (a listener wrapper for `axum::serve`).
pub mod api;
pub mod engine;
pub mod http;
pub mod timeout;
