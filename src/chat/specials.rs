//! The chat special tokens of TMLv0, looked up by name (`<|message_user|>`, …) in the model's own
//! tokenizer. For a tokenizer of the real checkpoints (the o200k vocabulary, 199,998 BPE tokens)
//! the ids must also be those of Inkling's table (`tml-renderers` 0.2.1
//! `O200kBaseChatTokenizer.special_tokens()`); a small model may carry them at ids of its own.
use tokenizers::Tokenizer;

/// Number of BPE tokens of o200k_base (ids below Inkling's special table).
pub const O200K_BASE_TOKENS: usize = 199_998;

/// The specials a chat needs: (name, id in Inkling's table).
pub const REQUIRED: [(&str, u32); 8] = [
    ("<|message_user|>", 200_000),
    ("<|message_model|>", 200_001),
    ("<|message_system|>", 200_002),
    ("<|message_tool|>", 200_003),
    ("<|content_text|>", 200_004),
    ("<|content_model_end_sampling|>", 200_006),
    ("<|content_thinking|>", 200_008),
    ("<|end_message|>", 200_010),
];

/// Specials used when present: (name, id in Inkling's table).
pub const OPTIONAL: [(&str, u32); 3] = [
    ("<|endoftext|>", 199_999),
    ("<|content_invoke_tool_json|>", 200_049),
    ("<|content_xml|>", 200_024),
];

#[derive(Debug, thiserror::Error)]
pub enum SpecialsError {
    #[error(
        "the tokenizer has no Inkling chat special tokens ({missing}); `chat` and `serve` need a \
         model whose tokenizer.json carries TMLv0's specials (use `generate` for plain text)"
    )]
    Missing { missing: String },
    #[error(
        "the tokenizer has the o200k vocabulary but `{name}` is id {found}, not {expected} as in \
         Inkling's special-token table"
    )]
    WrongId {
        name: &'static str,
        found: u32,
        expected: u32,
    },
}

/// Ids of the TMLv0 specials in one tokenizer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Specials {
    pub message_user: u32,
    pub message_model: u32,
    pub message_system: u32,
    pub message_tool: u32,
    pub content_text: u32,
    /// `<|content_model_end_sampling|>`: the stop token (official `Renderer.stop()`).
    pub model_end_sampling: u32,
    pub content_thinking: u32,
    pub end_message: u32,
    pub endoftext: Option<u32>,
    pub invoke_tool_json: Option<u32>,
    /// `<|content_xml|>`: the kind of the tool declaration block.
    pub content_xml: Option<u32>,
    /// Every added special token of the tokenizer and every chat special above, sorted (never
    /// printed as text).
    pub all: Vec<u32>,
}

impl Specials {
    /// Look the specials up by name; for an o200k-sized vocabulary, check them against the table.
    pub fn from_tokenizer(tok: &Tokenizer) -> Result<Specials, SpecialsError> {
        let o200k = tok.get_vocab_size(false) >= O200K_BASE_TOKENS;
        let find = |name: &'static str, expected: u32| -> Result<Option<u32>, SpecialsError> {
            match tok.token_to_id(name) {
                Some(found) if o200k && found != expected => Err(SpecialsError::WrongId {
                    name,
                    found,
                    expected,
                }),
                other => Ok(other),
            }
        };
        let mut ids = Vec::new();
        let mut missing = Vec::new();
        for (name, expected) in REQUIRED {
            match find(name, expected)? {
                Some(id) => ids.push(id),
                None => missing.push(name),
            }
        }
        if !missing.is_empty() {
            return Err(SpecialsError::Missing {
                missing: format!("{} not found", missing.join(", ")),
            });
        }
        let mut all: Vec<u32> = tok
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        // the chat specials count as control tokens even where the tokenizer does not flag them
        all.extend(&ids);
        let optional = [
            find(OPTIONAL[0].0, OPTIONAL[0].1)?,
            find(OPTIONAL[1].0, OPTIONAL[1].1)?,
            find(OPTIONAL[2].0, OPTIONAL[2].1)?,
        ];
        all.extend(optional.iter().flatten());
        all.sort_unstable();
        all.dedup();
        Ok(Specials {
            message_user: ids[0],
            message_model: ids[1],
            message_system: ids[2],
            message_tool: ids[3],
            content_text: ids[4],
            model_end_sampling: ids[5],
            content_thinking: ids[6],
            end_message: ids[7],
            endoftext: optional[0],
            invoke_tool_json: optional[1],
            content_xml: optional[2],
            all,
        })
    }

    /// Whether `id` is a special token (a control token, never text).
    pub fn is_special(&self, id: u32) -> bool {
        self.all.binary_search(&id).is_ok()
    }
}
