//! `serve`: the OpenAI-compatible server driven by the official client, its request parser on
//! hostile bodies (named errors, fuzzing), and the server under hostile clients.

pub mod hostile;
pub mod parser_fuzz;
pub mod request_errors;
pub mod serve_openai;
pub mod test_python;
