//! Log-probabilities in OpenAI's schemas: per generated token its text, UTF-8 bytes and
//! log-probability, and the most likely alternatives. The values are the log-softmax of the
//! model's raw logits at that step ([`crate::model::generate::step_logprobs`]): before the
//! penalties, the logit bias and the temperature, so they do not depend on the sampling settings.
//!
//! - chat: `choices[].logprobs = {"content": [{token, logprob, bytes, top_logprobs: [{token,
//!   logprob, bytes}]}], "refusal": null}`;
//! - completions: `choices[].logprobs = {tokens, token_logprobs, top_logprobs: [{token: logprob}],
//!   text_offset}` (offsets in characters of the completion text).
use crate::model::generate::StepLogprobs;
use serde_json::{json, Map, Value};
use tokenizers::{DecoderWrapper, Tokenizer};

/// One generated token's log-probabilities, with text.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLp {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
    /// (token, bytes, logprob), most likely first.
    pub top: Vec<(String, Vec<u8>, f32)>,
}

/// GPT-2's byte-level alphabet, inverted: the byte each character of a vocabulary string stands
/// for (`None`: not a byte-level character).
fn byte_of(c: char) -> Option<u8> {
    let c = c as u32;
    let direct =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    if c < 256 && direct(c) {
        return Some(c as u8);
    }
    // the other bytes, in order, map to 256, 257, …
    let mut n = 256;
    for b in 0..256u32 {
        if !direct(b) {
            if n == c {
                return Some(b as u8);
            }
            n += 1;
        }
    }
    None
}

/// The UTF-8 bytes token `id` stands for (a piece of a character when the tokenizer split one).
pub fn token_bytes(tok: &Tokenizer, id: u32) -> Vec<u8> {
    let byte_level = matches!(tok.get_decoder(), Some(DecoderWrapper::ByteLevel(_)));
    let added = tok.get_added_tokens_decoder().contains_key(&id);
    if let (true, false, Some(s)) = (byte_level, added, tok.id_to_token(id)) {
        if let Some(b) = s.chars().map(byte_of).collect::<Option<Vec<u8>>>() {
            return b;
        }
    }
    if let (true, Some(s)) = (added, tok.id_to_token(id)) {
        return s.into_bytes();
    }
    tok.decode(&[id], false).unwrap_or_default().into_bytes()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The entry of token `id` chosen at a step with these log-probabilities.
pub fn entry(tok: &Tokenizer, id: u32, lp: &StepLogprobs) -> TokenLp {
    let bytes = token_bytes(tok, id);
    TokenLp {
        token: text(&bytes),
        logprob: lp.logprob,
        top: lp
            .top
            .iter()
            .map(|&(t, l)| {
                let b = token_bytes(tok, t);
                (text(&b), b, l)
            })
            .collect(),
        bytes,
    }
}

/// A log-probability as JSON: `-inf` (an id the model gives no mass) as -9999, OpenAI's floor.
fn num(l: f32) -> Value {
    json!(if l.is_finite() {
        l.max(-9999.0)
    } else {
        -9999.0
    })
}

/// `choices[].logprobs` of a chat response or chunk.
pub fn chat_json(entries: &[TokenLp]) -> Value {
    let content: Vec<Value> = entries
        .iter()
        .map(|e| {
            let top: Vec<Value> = e
                .top
                .iter()
                .map(|(t, b, l)| json!({"token": t, "logprob": num(*l), "bytes": b}))
                .collect();
            json!({"token": e.token, "logprob": num(e.logprob), "bytes": e.bytes, "top_logprobs": top})
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// Character offsets of completion tokens in the completion text, across chunks.
#[derive(Default)]
pub struct Offsets {
    bytes: Vec<u8>,
}

impl Offsets {
    /// The offset of the next token (characters of the whole characters so far), then counts it.
    fn next(&mut self, token: &[u8]) -> usize {
        let valid = match std::str::from_utf8(&self.bytes) {
            Ok(s) => s,
            Err(e) => std::str::from_utf8(&self.bytes[..e.valid_up_to()]).unwrap_or(""),
        };
        let at = valid.chars().count();
        self.bytes.extend_from_slice(token);
        at
    }
}

/// `choices[].logprobs` of a completion response or chunk.
pub fn completion_json(entries: &[TokenLp], offsets: &mut Offsets) -> Value {
    let tokens: Vec<&str> = entries.iter().map(|e| e.token.as_str()).collect();
    let lps: Vec<Value> = entries.iter().map(|e| num(e.logprob)).collect();
    let top: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut m = Map::new();
            for (t, _, l) in &e.top {
                // two alternatives of one lossy text keep the likelier
                m.entry(t.clone()).or_insert(num(*l));
            }
            Value::Object(m)
        })
        .collect();
    let off: Vec<usize> = entries.iter().map(|e| offsets.next(&e.bytes)).collect();
    json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": top, "text_offset": off})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_alphabet() {
        assert_eq!(byte_of('a'), Some(b'a'));
        assert_eq!(byte_of('Ġ'), Some(b' '));
        assert_eq!(byte_of('Ċ'), Some(b'\n'));
        assert_eq!(byte_of('\u{100}'), Some(0));
        assert_eq!(byte_of('\u{4e00}'), None);
    }

    #[test]
    fn offsets_count_whole_characters() {
        let mut o = Offsets::default();
        assert_eq!(o.next(b"ab"), 0);
        assert_eq!(o.next(&[0xe6]), 2);
        assert_eq!(o.next(&[0xa0, 0x86]), 2);
        assert_eq!(o.next(b"c"), 3);
    }
}
