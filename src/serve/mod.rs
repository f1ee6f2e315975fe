//! The OpenAI-compatible HTTP server behind `inkling-wgpu serve`.
//!
//! - [`engine`]: one thread owns the model; requests wait in a bounded queue and run together
//!   in sequence slots (continuous batching: one decode step for all running requests), each
//!   cancelled when its client goes away or the server shuts down (queued or running).
//! - [`job`]: the request jobs, their events, the state `/health` shows.
//! - [`output`]: one request's generated ids → text, tool-call and log-probability events.
//! - [`api`]: request parsing and validation into an engine job, `usage`.
//! - [`error`]: OpenAI error envelopes; bodies parsed with errors naming the field's JSON path.
//! - [`fields`]: which request fields each endpoint implements, takes as metadata or refuses.
//! - [`logprobs`]: log-probabilities in OpenAI's chat and completions schemas.
//! - [`tools`]: tool declarations and `tool_choice`, tool-call blocks parsed into `tool_calls`.
//! - [`http`]: the axum routes, SSE streaming with comment pings, the body size limit, the
//!   graceful shutdown ([`http::Shutdown`]: queued and running requests end at once).
//! - [`timeout`]: the request-head read timeout (a listener wrapper for `axum::serve`).
pub mod api;
pub mod engine;
pub mod error;
pub mod fields;
pub mod http;
pub mod job;
pub mod logprobs;
pub mod output;
pub mod timeout;
pub mod tools;
