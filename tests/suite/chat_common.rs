//! Shared by the `chat` and `serve` end-to-end tests: the one model they run on, and the
//! renderer of its tokenizer.
use inkling_wgpu::chat::Renderer;
use inkling_wgpu::model::text::load_tokenizer;
use std::path::PathBuf;
use tokenizers::Tokenizer;

/// The model of every chat/serve end-to-end test (a fixture directory whose tokenizer carries
/// Inkling's chat specials). Switch it to the bundled demo model once that exists.
pub const CHAT_MODEL: &str = "tests/fixtures/tiny-chat-f32";

pub fn chat_model() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(CHAT_MODEL)
}

pub fn tokenizer_and_renderer() -> (Tokenizer, Renderer) {
    let tok = load_tokenizer(&chat_model()).unwrap().unwrap();
    let r = Renderer::new(&tok).unwrap();
    (tok, r)
}

/// The stop ids `chat` and `serve` use: `<|content_model_end_sampling|>` and the model's EOS ids
/// (the rule every command shares, `cli::load::eos_ids`).
pub fn stop_ids(ck: &inkling_wgpu::model::Checkpoint, r: &Renderer) -> Vec<u32> {
    let tok = load_tokenizer(&ck.dir).unwrap();
    let mut ids = vec![r.specials().model_end_sampling];
    for id in inkling_wgpu::cli::load::eos_ids(ck, tok.as_ref()) {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

/// `tests/fixtures/tiny-chat-f32/chat_reference.json`, written by `tools/chat_reference.py` from
/// transformers 5.24.0: a two-turn conversation (effort 0.9) with the prompt ids rendered from
/// the TMLv0 grammar, the greedy continuation, its thinking and text, per command (`chat` keeps
/// the model's ids in its history, `serve` re-renders the OpenAI messages).
pub fn chat_reference() -> serde_json::Value {
    let p = chat_model().join("chat_reference.json");
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

/// The ids of a JSON array.
pub fn json_ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}
