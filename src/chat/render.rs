//! TMLv0 rendering: messages → prompt token ids, as `tml-renderers` 0.2.1 (`v0.Renderer`) writes
//! them. Grammar (from the official renderer, vLLM `inkling_encoding.py`, Dynamo `inkling.rs`):
//!
//! ```text
//! prompt  := {system block} effort block {message} [generation prompt]
//! block   := ROLE [header text] KIND text <|end_message|>
//! model   := {<|message_model|> KIND … <|end_message|>} <|content_model_end_sampling|>
//! effort  := <|message_system|><|content_text|>Thinking effort level: E<|end_message|>
//! ```
//!
//! The effort block goes before the first non-system message (last when every message is a system
//! message). Special tokens are emitted by id; text is encoded with special-token markup left as
//! plain text, so `<|end_message|>` typed by a user is six ordinary tokens, never a control token.
use super::specials::{Specials, SpecialsError};
use anyhow::{bail, Context};
use tokenizers::Tokenizer;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// `<|message_system|>` (OpenAI `system` and `developer`).
    System,
    /// `<|message_user|>`.
    User,
    /// `<|message_model|>` (OpenAI `assistant`).
    Model,
    /// `<|message_tool|>`, with the tool's name as the block header.
    Tool,
}

/// A tool call in a model message: rendered as
/// `<|message_model|>NAME<|content_invoke_tool_json|>{"name":NAME,"args":{…}}<|end_message|>`
/// (`args` with sorted keys, no spaces).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: serde_json::Value,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// Block header: the tool's name of a tool message.
    pub name: Option<String>,
    /// Tool calls of a model message (after its text block, if any).
    pub tool_calls: Vec<ToolCall>,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Message {
        Message {
            role,
            content: content.into(),
            name: None,
            tool_calls: Vec::new(),
        }
    }
}

/// The thinking-effort dial in thousandths, [0, 1]. Named efforts (vLLM
/// `_NAMED_REASONING_EFFORT`, Dynamo `resolve_reasoning_effort`): none 0.0, minimal 0.1, low 0.2,
/// medium 0.7, high 0.9, xhigh and max 0.99. The model's default is 0.9.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Effort(u16);

impl Effort {
    /// 0.9, the official renderer's `DEFAULT_EFFORT`.
    pub const DEFAULT: Effort = Effort(900);
    /// 0: no thinking.
    pub const NONE: Effort = Effort(0);

    /// A number in [0, 1] (rounded to thousandths), else an error saying what is accepted.
    pub fn from_value(v: f64) -> Result<Effort, String> {
        if !(v.is_finite() && (0.0..=1.0).contains(&v)) {
            return Err(format!(
                "thinking effort must be a number in [0, 1] or one of {}, got {v}",
                Self::NAMES
            ));
        }
        Ok(Effort((v * 1000.0).round() as u16))
    }

    const NAMES: &'static str = "none, minimal, low, medium, high, xhigh, max";

    /// A named effort or a number (`"high"`, `"0.5"`).
    pub fn parse(s: &str) -> Result<Effort, String> {
        let v = match s.trim().to_ascii_lowercase().as_str() {
            "none" => 0.0,
            "minimal" => 0.1,
            "low" => 0.2,
            "medium" => 0.7,
            "high" => 0.9,
            "xhigh" | "max" => 0.99,
            t => t.parse::<f64>().map_err(|_| {
                format!(
                    "thinking effort must be a number in [0, 1] or one of {}, got {s:?}",
                    Self::NAMES
                )
            })?,
        };
        Self::from_value(v)
    }

    /// The value in [0, 1].
    pub fn value(self) -> f64 {
        self.0 as f64 / 1000.0
    }

    /// The number as the official renderer writes it: at most two decimals (half up), trailing
    /// zeros and point dropped (0 → "0", 0.9 → "0.9", 0.333 → "0.33", 0.999 → "1").
    pub fn text(self) -> String {
        let h = (self.0 as u32 + 5) / 10;
        let (int, frac) = (h / 100, h % 100);
        match frac {
            0 => format!("{int}"),
            f if f % 10 == 0 => format!("{int}.{}", f / 10),
            f => format!("{int}.{f:02}"),
        }
    }
}

/// Renders conversations for one tokenizer.
pub struct Renderer {
    /// The model's tokenizer with special-token markup encoded as plain text.
    plain: Tokenizer,
    sp: Specials,
}

impl Renderer {
    /// The specials are looked up by name (an error when the tokenizer lacks them).
    pub fn new(tok: &Tokenizer) -> Result<Renderer, SpecialsError> {
        let sp = Specials::from_tokenizer(tok)?;
        let mut plain = tok.clone();
        plain.set_encode_special_tokens(true);
        Ok(Renderer { plain, sp })
    }

    pub fn specials(&self) -> &Specials {
        &self.sp
    }

    /// `text` as ordinary tokens (no special token, whatever markup it contains).
    pub fn encode_text(&self, text: &str) -> anyhow::Result<Vec<u32>> {
        let enc = self
            .plain
            .encode(text, false)
            .map_err(|e| anyhow::anyhow!("encoding text: {e}"))?;
        let ids = enc.get_ids().to_vec();
        if let Some(id) = ids.iter().find(|&&id| self.sp.is_special(id)) {
            bail!(
                "text encoded to the special token {id}; refusing to render it as a control token"
            );
        }
        Ok(ids)
    }

    /// `ROLE [header] KIND text <|end_message|>`.
    fn block(
        &self,
        out: &mut Vec<u32>,
        role: u32,
        header: Option<&str>,
        kind: u32,
        text: &str,
    ) -> anyhow::Result<()> {
        out.push(role);
        if let Some(h) = header {
            out.extend(self.encode_text(h)?);
        }
        out.push(kind);
        out.extend(self.encode_text(text)?);
        out.push(self.sp.end_message);
        Ok(())
    }

    /// The tool declaration block that starts a prompt with tools:
    /// `<|message_system|>tool_declare<|content_xml|>JSON<|end_message|>`, where `JSON` is the
    /// declared functions as a sorted-key compact JSON array (`serve::tools::declaration_json`).
    pub fn tool_declaration(&self, json: &str) -> anyhow::Result<Vec<u32>> {
        let kind = self
            .sp
            .content_xml
            .context("the tokenizer has no <|content_xml|>, needed to declare tools")?;
        let mut out = Vec::new();
        self.block(
            &mut out,
            self.sp.message_system,
            Some("tool_declare"),
            kind,
            json,
        )?;
        Ok(out)
    }

    /// The ids of a forced call to `name` after the generation prompt's `<|message_model|>`:
    /// `NAME<|content_invoke_tool_json|>` and `json_prefix` (the call's JSON up to its arguments).
    pub fn tool_call_prefix(&self, name: &str, json_prefix: &str) -> anyhow::Result<Vec<u32>> {
        let kind = self
            .sp
            .invoke_tool_json
            .context("the tokenizer has no <|content_invoke_tool_json|>, needed to call a tool")?;
        let mut out = self.encode_text(name)?;
        out.push(kind);
        out.extend(self.encode_text(json_prefix)?);
        Ok(out)
    }

    /// `<|message_system|><|content_text|>Thinking effort level: E<|end_message|>`.
    pub fn effort_block(&self, effort: Effort) -> anyhow::Result<Vec<u32>> {
        let mut out = Vec::new();
        let text = format!("Thinking effort level: {}", effort.text());
        self.block(
            &mut out,
            self.sp.message_system,
            None,
            self.sp.content_text,
            &text,
        )?;
        Ok(out)
    }

    /// One message. A model message ends with `<|content_model_end_sampling|>`; its
    /// reasoning is not rendered (the official renderer drops `reasoning_content`).
    pub fn message(&self, m: &Message) -> anyhow::Result<Vec<u32>> {
        let sp = &self.sp;
        let mut out = Vec::new();
        match m.role {
            Role::System => self.block(
                &mut out,
                sp.message_system,
                None,
                sp.content_text,
                &m.content,
            )?,
            Role::User => {
                self.block(&mut out, sp.message_user, None, sp.content_text, &m.content)?
            }
            Role::Tool => self.block(
                &mut out,
                sp.message_tool,
                m.name.as_deref(),
                sp.content_text,
                &m.content,
            )?,
            Role::Model => {
                if !m.content.is_empty() || m.tool_calls.is_empty() {
                    self.block(
                        &mut out,
                        sp.message_model,
                        None,
                        sp.content_text,
                        &m.content,
                    )?;
                }
                for call in &m.tool_calls {
                    let kind = sp.invoke_tool_json.context(
                        "the tokenizer has no <|content_invoke_tool_json|>, needed to render a tool call",
                    )?;
                    let json = format!(
                        "{{\"name\":{},\"args\":{}}}",
                        serde_json::Value::String(call.name.clone()),
                        sorted_json(&call.arguments)
                    );
                    self.block(&mut out, sp.message_model, Some(&call.name), kind, &json)?;
                }
                out.push(sp.model_end_sampling);
            }
        }
        Ok(out)
    }

    /// The conversation without a generation prompt: `render_for_completion` (effort `None`) or
    /// `render_for_completion_with_effort` of the official renderer.
    pub fn render(&self, messages: &[Message], effort: Option<Effort>) -> anyhow::Result<Vec<u32>> {
        let mut out = Vec::new();
        let first_other = messages.iter().position(|m| m.role != Role::System);
        for (i, m) in messages.iter().enumerate() {
            if Some(i) == first_other {
                if let Some(e) = effort {
                    out.extend(self.effort_block(e)?);
                }
            }
            out.extend(self.message(m)?);
        }
        if first_other.is_none() {
            if let Some(e) = effort {
                out.extend(self.effort_block(e)?);
            }
        }
        Ok(out)
    }

    /// What the model's turn starts with: `<|message_model|>`, plus `<|content_text|>` when the
    /// effort is 0 (answer without a thinking block, as colibri prefills it).
    pub fn generation_prompt(&self, effort: Option<Effort>) -> Vec<u32> {
        let mut out = vec![self.sp.message_model];
        if effort == Some(Effort::NONE) {
            out.push(self.sp.content_text);
        }
        out
    }

    /// [`Renderer::render`] followed by [`Renderer::generation_prompt`].
    pub fn render_for_generation(
        &self,
        messages: &[Message],
        effort: Option<Effort>,
    ) -> anyhow::Result<Vec<u32>> {
        let mut out = self.render(messages, effort)?;
        out.extend(self.generation_prompt(effort));
        Ok(out)
    }

    /// Ids that close a model turn cut short (by `max_tokens` or a stop): `<|end_message|>` unless
    /// the turn already ends with one, then `<|content_model_end_sampling|>`. Empty when the turn
    /// ended with the stop token.
    pub fn close_model_turn(&self, turn: &[u32]) -> Vec<u32> {
        match turn.last() {
            Some(&id) if id == self.sp.model_end_sampling => vec![],
            Some(&id) if id == self.sp.end_message => vec![self.sp.model_end_sampling],
            _ => vec![self.sp.end_message, self.sp.model_end_sampling],
        }
    }
}

/// Compact JSON with object keys sorted at every level (Python `json.dumps(sort_keys=True,
/// separators=(",", ":"))`).
pub fn sorted_json(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let items: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), sorted_json(&map[k])))
                .collect();
            format!("{{{}}}", items.join(","))
        }
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(sorted_json).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effort_text_as_the_official_renderer() {
        for (v, t) in [
            (0.25, "0.25"),
            (0.333, "0.33"),
            (0.7, "0.7"),
            (0.99, "0.99"),
            (0.999, "1"),
            (1.0, "1"),
            (0.0, "0"),
            (0.9, "0.9"),
        ] {
            assert_eq!(Effort::from_value(v).unwrap().text(), t, "{v}");
        }
    }

    #[test]
    fn named_efforts() {
        for (n, v) in [
            ("none", 0.0),
            ("minimal", 0.1),
            ("low", 0.2),
            ("medium", 0.7),
            ("high", 0.9),
            ("xhigh", 0.99),
            ("max", 0.99),
            ("0.5", 0.5),
        ] {
            assert_eq!(Effort::parse(n).unwrap().value(), v, "{n}");
        }
        for bad in ["1.5", "-0.1", "nan", "extreme", ""] {
            assert!(Effort::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sorted_compact_json() {
        let v: serde_json::Value =
            serde_json::from_str(r#"{"b":1,"a":{"y":[1,{"d":2,"c":"x"}],"x":null}}"#).unwrap();
        assert_eq!(
            sorted_json(&v),
            r#"{"a":{"x":null,"y":[1,{"c":"x","d":2}]},"b":1}"#
        );
    }
}
