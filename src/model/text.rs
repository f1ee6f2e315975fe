//! Tokenizer side: loading `tokenizer.json`, the tokenizer's own EOS, and UTF-8-safe streaming.
use super::error::{ModelError, Result};
use std::path::Path;
use std::str::FromStr;
use tokenizers::Tokenizer;

/// Load `DIR/tokenizer.json`; `Ok(None)` when the directory has none.
pub fn load_tokenizer(dir: &Path) -> Result<Option<Tokenizer>> {
    let file = dir.join("tokenizer.json");
    if !file.exists() {
        return Ok(None);
    }
    let text =
        crate::read_capped(&file, crate::MAX_TOKENIZER_FILE).map_err(|e| ModelError::Io {
            file: file.clone(),
            source: e,
        })?;
    // the JSON syntax first: tokenizers 0.22 panics (`expect("Helper")`) on a syntax error inside
    // the decoder section instead of returning an error
    if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&text) {
        return Err(ModelError::Json { file, source: e });
    }
    let parsed = std::panic::catch_unwind(|| Tokenizer::from_str(&text));
    let bad = |msg: String| ModelError::BadField {
        file: file.clone(),
        field: "(tokenizer)".into(),
        msg,
    };
    match parsed {
        Ok(r) => r.map(Some).map_err(|e| bad(e.to_string())),
        Err(_) => Err(bad(
            "the tokenizers library could not read it (it panicked)".into(),
        )),
    }
}

/// The EOS token named by `tokenizer_config.json` (`eos_token`: string or `{content}`), as an id.
pub fn tokenizer_eos_ids(dir: &Path, tok: &Tokenizer) -> Vec<u32> {
    let Ok(text) = crate::read_capped(&dir.join("tokenizer_config.json"), crate::MAX_SIDE_FILE)
    else {
        return vec![];
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
        return vec![];
    };
    let name = match v.get("eos_token") {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(serde_json::Value::Object(o)) => {
            o.get("content").and_then(|c| c.as_str()).map(str::to_owned)
        }
        _ => None,
    };
    name.and_then(|n| tok.token_to_id(&n)).into_iter().collect()
}

/// Incremental detokeniser: feed ids one by one, get the text that became final (never a split
/// UTF-8 character). Wraps the tokenizers crate's `DecodeStream`.
pub struct TextStream<'t> {
    inner: tokenizers::tokenizer::DecodeStream<
        't,
        tokenizers::ModelWrapper,
        tokenizers::NormalizerWrapper,
        tokenizers::PreTokenizerWrapper,
        tokenizers::PostProcessorWrapper,
        tokenizers::DecoderWrapper,
    >,
    tok: &'t Tokenizer,
    ids: Vec<u32>,
    emitted: String,
}

impl<'t> TextStream<'t> {
    /// Special tokens are kept (`skip_special_tokens = false`), like the reference decode.
    pub fn new(tok: &'t Tokenizer) -> Self {
        TextStream {
            inner: tok.decode_stream(false),
            tok,
            ids: Vec::new(),
            emitted: String::new(),
        }
    }

    /// Text made final by `id` (possibly empty).
    pub fn step(&mut self, id: u32) -> anyhow::Result<String> {
        self.ids.push(id);
        let piece = self
            .inner
            .step(id)
            .map_err(|e| anyhow::anyhow!("decoding token {id}: {e}"))?
            .unwrap_or_default();
        self.emitted.push_str(&piece);
        Ok(piece)
    }

    /// At the end of the sequence: whatever the full decode has beyond the text emitted so far
    /// (an incomplete UTF-8 tail decodes to U+FFFD here, as `Tokenizer::decode` gives it), so that
    /// everything emitted equals the full decode. Empty when the stream ended on a whole character.
    pub fn finish(&mut self) -> anyhow::Result<String> {
        let full = self
            .tok
            .decode(&self.ids, false)
            .map_err(|e| anyhow::anyhow!("decoding: {e}"))?;
        let rest = full
            .strip_prefix(self.emitted.as_str())
            .unwrap_or("")
            .to_string();
        self.emitted.push_str(&rest);
        Ok(rest)
    }
}

/// An upper bound on the UTF-8 bytes of text one token of `tok` can stand for: the longest
/// vocabulary or added-token string, in bytes. Vocabulary strings are never shorter than the text
/// they decode to (byte-level BPE maps each byte to one character of 1–2 bytes; `▁` stands for a
/// space, `<0xNN>` for one byte), so text of more than `ctx` × this many bytes encodes to more than
/// `ctx` tokens. That needs a tokenizer without a normalizer (which could shrink text before it
/// is split, as Inkling's byte-level BPE has none); with one, there is no bound (`usize::MAX`).
pub fn longest_token_bytes(tok: &Tokenizer) -> usize {
    if tok.get_normalizer().is_some() {
        return usize::MAX;
    }
    let longest = tok.get_vocab(true).keys().map(String::len).max();
    longest.unwrap_or(usize::MAX).max(1)
}
