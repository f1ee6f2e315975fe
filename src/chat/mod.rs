//! Inkling's chat format, TMLv0, as the official renderer (`tml-renderers`) writes it.
//!
//! - [`specials`]: the chat special tokens, found by name in the model's tokenizer.
//! - [`render`]: messages → prompt token ids (specials by id, text never parsed for markup).
//! - [`parse`]: generated ids → thinking and text blocks (specials never printed).
//! - [`stop`]: stop strings held back while they could still match.
//! - [`session`]: generation that keeps the KV cache and conv states when a prompt extends the
//!   sequence the model already holds.
pub mod parse;
pub mod render;
pub mod session;
pub mod specials;
pub mod stop;

pub use parse::{Block, OutputParser, Piece};
pub use render::{Effort, Message, Renderer, Role};
pub use session::Session;
pub use specials::Specials;
