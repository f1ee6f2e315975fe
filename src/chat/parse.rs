//! Model output → blocks. After the generation prompt (`<|message_model|>`) the model writes
//! self-describing blocks in any order (`<|content_thinking|>…<|end_message|>`,
//! `<|message_model|><|content_text|>…<|end_message|>`, …) and ends its turn with
//! `<|content_model_end_sampling|>`. It may also start right at a kind token, or inside a text
//! block when the prompt prefilled `<|content_text|>`. Each block's text is detokenised by its own
//! UTF-8-safe stream; special tokens are never part of any text. Text the model writes outside
//! any block (right after `<|message_model|>` or after a block's `<|end_message|>`, where a kind
//! token should come) is not dropped: it is given as answer text, and [`OutputParser::strayed`]
//! says so, for the caller's warning that the model does not follow the format.
use super::specials::Specials;
use crate::model::text::TextStream;
use tokenizers::Tokenizer;

/// Which block a piece of text belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Block {
    /// `<|content_thinking|>`: reasoning (OpenAI `reasoning_content`).
    Thinking,
    /// `<|content_text|>`: the answer.
    Text,
    /// Anything else (tool-call JSON): not shown. Text outside any block comes as [`Block::Text`].
    Other,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    pub block: Block,
    pub text: String,
}

/// Incremental parser of one model turn.
pub struct OutputParser<'t> {
    tok: &'t Tokenizer,
    sp: Specials,
    block: Block,
    stream: TextStream<'t>,
    ended: bool,
    /// The open block is a tool call's JSON (`<|content_invoke_tool_json|>`).
    tool: bool,
    /// Text outside any block was seen (and given as answer text).
    stray: bool,
    /// With tools declared: text outside any block, held until the next special token says
    /// whether it is a tool call's header (its name, dropped) or stray text.
    hold: Option<String>,
}

impl<'t> OutputParser<'t> {
    /// `in_text`: the prompt ended with `<|content_text|>` (the turn starts inside a text block).
    pub fn new(tok: &'t Tokenizer, sp: &Specials, in_text: bool) -> OutputParser<'t> {
        OutputParser {
            tok,
            sp: sp.clone(),
            block: if in_text { Block::Text } else { Block::Other },
            stream: TextStream::new(tok),
            ended: false,
            tool: false,
            stray: false,
            hold: None,
        }
    }

    /// For a turn with tools declared: text right after `<|message_model|>` may be a tool call's
    /// header (the tool's name before `<|content_invoke_tool_json|>`), so text outside any block
    /// is held until the next special token and given as answer text only when that is not the
    /// tool-call token. `in_call`: the prompt ends inside a tool call's JSON (a forced call).
    pub fn with_tools(mut self, in_call: bool) -> OutputParser<'t> {
        self.hold = Some(String::new());
        if in_call {
            self.block = Block::Other;
            self.tool = true;
        }
        self
    }

    /// Feed one generated id; the text it made final (at most one piece).
    pub fn push(&mut self, id: u32) -> anyhow::Result<Option<Piece>> {
        let sp = &self.sp;
        if !sp.is_special(id) {
            let text = self.stream.step(id)?;
            return Ok(self.piece(text));
        }
        let next = if id == sp.content_text {
            Block::Text
        } else if id == sp.content_thinking {
            Block::Thinking
        } else if id == sp.end_message
            || id == sp.message_model
            || id == sp.model_end_sampling
            || Some(id) == sp.invoke_tool_json
        {
            Block::Other
        } else {
            // another special (e.g. an image or unused slot): dropped, the block goes on
            return Ok(None);
        };
        if id == sp.model_end_sampling {
            self.ended = true;
        }
        let call = Some(id) == sp.invoke_tool_json;
        let tail = self.stream.finish()?;
        let mut piece = self.piece(tail);
        let held = self.hold.as_mut().map(std::mem::take).unwrap_or_default();
        if !held.is_empty() && !call {
            self.stray = true;
            piece = Some(Piece {
                block: Block::Text,
                text: held,
            });
        }
        self.tool = call;
        self.block = next;
        self.stream = TextStream::new(self.tok);
        Ok(piece)
    }

    /// At the end of generation: the open block's remaining text.
    pub fn finish(&mut self) -> anyhow::Result<Option<Piece>> {
        let tail = self.stream.finish()?;
        self.stream = TextStream::new(self.tok);
        let piece = self.piece(tail);
        match self.hold.as_mut().map(std::mem::take) {
            Some(held) if !held.is_empty() => {
                self.stray = true;
                Ok(Some(Piece {
                    block: Block::Text,
                    text: held,
                }))
            }
            _ => Ok(piece),
        }
    }

    /// The block the next ordinary token belongs to ([`Block::Other`] outside any block).
    pub fn block(&self) -> Block {
        self.block
    }

    /// Whether text outside any block was seen (given as [`Block::Text`]).
    pub fn strayed(&self) -> bool {
        self.stray
    }

    /// Whether `<|content_model_end_sampling|>` was seen.
    pub fn ended(&self) -> bool {
        self.ended
    }

    fn piece(&mut self, text: String) -> Option<Piece> {
        if text.is_empty() {
            return None;
        }
        let block = match self.block {
            Block::Other if !self.tool => {
                if let Some(h) = self.hold.as_mut() {
                    h.push_str(&text);
                    return None;
                }
                self.stray = true;
                Block::Text
            }
            b => b,
        };
        Some(Piece { block, text })
    }
}

/// Parse a whole turn: (thinking, text).
pub fn split_turn(
    tok: &Tokenizer,
    sp: &Specials,
    in_text: bool,
    ids: &[u32],
) -> anyhow::Result<(String, String)> {
    let mut p = OutputParser::new(tok, sp, in_text);
    let (mut thinking, mut text) = (String::new(), String::new());
    let mut add = |piece: Option<Piece>| {
        if let Some(pc) = piece {
            match pc.block {
                Block::Thinking => thinking.push_str(&pc.text),
                Block::Text => text.push_str(&pc.text),
                Block::Other => {}
            }
        }
    };
    for &id in ids {
        add(p.push(id)?);
    }
    add(p.finish()?);
    Ok((thinking, text))
}
