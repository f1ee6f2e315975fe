//! Chat: TMLv0 rendering and parsing, the KV continuation of a session, `chat` driven through stdin.

pub mod chat_cli;
pub mod chat_input_fuzz;
pub mod chat_reference;
pub mod chat_render;
pub mod chat_session;
