//! `serve`: the OpenAI-compatible server driven by the official client.

pub mod serve_openai;
pub mod test_python;
