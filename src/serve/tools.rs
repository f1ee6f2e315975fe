//! Tool calling: OpenAI `tools` and `tool_choice` validated into what the renderer writes (the
//! tool declaration block, a forced tool-call prefix), and the model's tool-call blocks
//! (`<|message_model|>NAME<|content_invoke_tool_json|>{"name":NAME,"args":{…}}<|end_message|>`)
//! parsed from the generated ids into OpenAI `tool_calls` (name, arguments as a JSON string).
use super::error::ApiError;
use crate::chat::specials::Specials;
use crate::model::text::TextStream;
use serde_json::{json, Value};
use tokenizers::Tokenizer;

/// One declared function.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolDecl {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
}

/// What `tool_choice` asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Choice {
    /// Never call a tool (the tool-call token is banned from sampling).
    None,
    /// The model decides.
    Auto,
    /// Call this function: the generation prompt ends with its tool-call prefix.
    Named(String),
}

/// The tools of a chat request, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct Tools {
    pub decls: Vec<ToolDecl>,
    pub choice: Choice,
    /// `parallel_tool_calls` (default true): when false, generation ends after the first call.
    pub parallel: bool,
}

/// `tools`, `tool_choice` and `parallel_tool_calls` of a body; `None` when there are no tools
/// (then `tool_choice` may only be absent or `"none"`).
pub fn parse(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<&Value>,
) -> Result<Option<Tools>, ApiError> {
    let bad = |m: String, p: String| ApiError::bad_field(m, p);
    let decls = match tools {
        None | Some(Value::Null) => vec![],
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, t)| decl(t, i))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(bad("expected an array of tools".into(), "tools".into())),
    };
    for (i, d) in decls.iter().enumerate() {
        if decls[..i].iter().any(|e| e.name == d.name) {
            return Err(bad(
                format!("the function name {:?} is declared twice", d.name),
                format!("tools[{i}].function.name"),
            ));
        }
    }
    let parallel = match parallel {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(bad(
                "expected true or false".into(),
                "parallel_tool_calls".into(),
            ))
        }
    };
    let choice = match choice {
        None | Some(Value::Null) => Choice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Auto,
            // with one function, "required" is that function named
            "required" if decls.len() == 1 => Choice::Named(decls[0].name.clone()),
            "required" => {
                return Err(bad(
                    "tool_choice \"required\" is supported with one declared function only \
                         (choosing among several needs constrained decoding); name the function \
                         ({\"type\": \"function\", \"function\": {\"name\": ...}}) or use \
                         \"auto\""
                        .into(),
                    "tool_choice".into(),
                ))
            }
            other => {
                return Err(bad(
                    format!("unknown tool_choice {other:?} (none, auto, or a named function)"),
                    "tool_choice".into(),
                ))
            }
        },
        Some(v @ Value::Object(_)) => {
            let name = v
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str);
            let Some(name) = name else {
                return Err(bad(
                    "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}"
                        .into(),
                    "tool_choice.function.name".into(),
                ));
            };
            if v.get("type").and_then(Value::as_str) != Some("function") {
                return Err(bad(
                    "only tool_choice of type \"function\" is supported".into(),
                    "tool_choice.type".into(),
                ));
            }
            if !decls.iter().any(|d| d.name == name) {
                return Err(bad(
                    format!("tool_choice names {name:?}, which `tools` does not declare"),
                    "tool_choice.function.name".into(),
                ));
            }
            Choice::Named(name.to_string())
        }
        Some(_) => {
            return Err(bad(
                "expected \"none\", \"auto\" or a named function".into(),
                "tool_choice".into(),
            ))
        }
    };
    if decls.is_empty() {
        return match choice {
            Choice::Auto | Choice::None => Ok(None),
            Choice::Named(_) => unreachable!("a named choice is checked against the tools"),
        };
    }
    Ok(Some(Tools {
        decls,
        choice,
        parallel,
    }))
}

fn decl(t: &Value, i: usize) -> Result<ToolDecl, ApiError> {
    let bad = |m: &str, p: &str| ApiError::bad_field(m, format!("tools[{i}]{p}"));
    if t.get("type").and_then(Value::as_str) != Some("function") {
        return Err(bad(
            "only tools of type \"function\" are supported",
            ".type",
        ));
    }
    let Some(f) = t.get("function").filter(|f| f.is_object()) else {
        return Err(bad(
            "a function tool needs a `function` object",
            ".function",
        ));
    };
    if let Some(k) = t.as_object().and_then(|o| {
        o.keys()
            .find(|k| !["type", "function"].contains(&k.as_str()))
    }) {
        return Err(bad("not a field of a function tool", &format!(".{k}")));
    }
    let known = ["name", "description", "parameters", "strict"];
    if let Some(k) = f
        .as_object()
        .and_then(|o| o.keys().find(|k| !known.contains(&k.as_str())))
    {
        return Err(bad(
            "not a field of a function tool's `function`",
            &format!(".function.{k}"),
        ));
    }
    match f.get("strict") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) => {
            return Err(bad(
                "strict: true needs arguments constrained to the schema, which this server \
                 cannot do (no constrained decoding); leave it out or set it to false",
                ".function.strict",
            ))
        }
        Some(_) => return Err(bad("expected a boolean", ".function.strict")),
    }
    let name = match f.get("name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() && n.len() <= 64 => n.to_string(),
        _ => {
            return Err(bad(
                "the function needs a `name` (a non-empty string of at most 64 bytes)",
                ".function.name",
            ))
        }
    };
    let description = match f.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad("expected a string", ".function.description")),
    };
    let parameters = match f.get("parameters") {
        None | Some(Value::Null) => None,
        Some(p @ Value::Object(_)) => Some(p.clone()),
        Some(_) => return Err(bad("expected a JSON Schema object", ".function.parameters")),
    };
    Ok(ToolDecl {
        name,
        description,
        parameters,
    })
}

/// The text of the tool declaration block: the functions as a JSON array of
/// `{"description","name","parameters","type"}` objects, keys sorted, compact (as the reference
/// engines write it); absent description and parameters are left out.
pub fn declaration_json(decls: &[ToolDecl]) -> String {
    let items: Vec<Value> = decls
        .iter()
        .map(|d| {
            let mut o = json!({"name": d.name, "type": "function"});
            if let Some(s) = &d.description {
                o["description"] = json!(s);
            }
            if let Some(p) = &d.parameters {
                o["parameters"] = p.clone();
            }
            o
        })
        .collect();
    crate::chat::render::sorted_json(&Value::Array(items))
}

/// The JSON text a forced call to `name` starts with (after `<|content_invoke_tool_json|>`).
pub fn forced_json_prefix(name: &str) -> String {
    format!("{{\"name\":{},\"args\":", Value::String(name.to_string()))
}

/// A tool call the model wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    /// The arguments as a JSON string (compact, as the model wrote them when they are not JSON).
    pub arguments: String,
}

/// What [`CallParser`] reports of the calls, in order: a call's [`CallEvent::Start`] and its
/// [`CallEvent::Args`] pieces (when its text starts as `{"name":N,"args":`, as the model writes
/// calls), then its [`CallEvent::End`], whose arguments are then exactly the pieces joined. A
/// call whose text does not start that way comes as its `End` only.
#[derive(Clone, Debug, PartialEq)]
pub enum CallEvent {
    /// A call began: the function's name.
    Start(String),
    /// More of the arguments of the call begun last.
    Args(String),
    /// A call is complete.
    End(ParsedCall),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// After `<|message_model|>`: ordinary ids are a block header (a tool's name).
    Header,
    /// Inside a tool-call block.
    Call,
    /// Inside another block, or between blocks.
    Outside,
}

/// How far the head `{"name":N,"args":` of a call's JSON text has come.
#[derive(Debug, PartialEq)]
enum Head {
    /// Still a prefix of a head.
    Wait,
    /// The head: N and the byte offset where the arguments start.
    Args(String, usize),
    /// Not a head: the call comes whole at its end.
    No,
}

fn head(full: &str) -> Head {
    const OPEN: &str = "{\"name\":";
    const ARGS: &str = ",\"args\":";
    let prefix_of = |s: &str, of: &str| {
        if of.starts_with(s) {
            Head::Wait
        } else {
            Head::No
        }
    };
    let Some(rest) = full.strip_prefix(OPEN) else {
        return prefix_of(full, OPEN);
    };
    if !rest.starts_with('"') {
        return prefix_of(rest, "\"");
    }
    let (mut esc, mut close) = (false, None);
    for (i, b) in rest.bytes().enumerate().skip(1) {
        match b {
            _ if esc => esc = false,
            b'\\' => esc = true,
            b'"' => {
                close = Some(i);
                break;
            }
            _ => {}
        }
    }
    let Some(q) = close else { return Head::Wait };
    let Ok(name) = serde_json::from_str::<String>(&rest[..=q]) else {
        return Head::No;
    };
    let after = &rest[q + 1..];
    match after.strip_prefix(ARGS) {
        Some(_) => Head::Args(name, OPEN.len() + q + 1 + ARGS.len()),
        None => prefix_of(after, ARGS),
    }
}

/// Incremental parser of the tool-call blocks of one model turn (over ids).
pub struct CallParser<'t> {
    tok: &'t Tokenizer,
    sp: Specials,
    state: State,
    header: Vec<u32>,
    /// The open call's text: what the prompt prefilled (a forced call), then what was generated.
    text: String,
    /// Where the generated text starts in `text`.
    generated_at: usize,
    stream: TextStream<'t>,
    /// The header's name of the open call.
    name: String,
    /// The open call's head, once read (its name, where its arguments start), or `None`.
    args: Option<(String, usize)>,
    /// The open call's head will never be read.
    no_head: bool,
    /// Bytes of the arguments sent as [`CallEvent::Args`].
    sent: usize,
}

impl<'t> CallParser<'t> {
    /// A turn whose prompt ended with `<|message_model|>` (`in_text`: with `<|content_text|>`
    /// after it; `forced`: with the tool-call prefix of that function).
    pub fn new(
        tok: &'t Tokenizer,
        sp: &Specials,
        in_text: bool,
        forced: Option<&str>,
    ) -> CallParser<'t> {
        let (state, prefix, name) = match forced {
            Some(n) => (State::Call, forced_json_prefix(n), n.to_string()),
            None if in_text => (State::Outside, String::new(), String::new()),
            None => (State::Header, String::new(), String::new()),
        };
        CallParser {
            tok,
            sp: sp.clone(),
            state,
            header: vec![],
            generated_at: prefix.len(),
            text: prefix,
            stream: TextStream::new(tok),
            name,
            args: None,
            no_head: false,
            sent: 0,
        }
    }

    /// Feed one generated id: what it made known of the calls.
    pub fn push(&mut self, id: u32) -> anyhow::Result<Vec<CallEvent>> {
        let mut out = Vec::new();
        if !self.sp.is_special(id) {
            match self.state {
                State::Header => self.header.push(id),
                State::Call => {
                    let piece = self.stream.step(id)?;
                    self.text.push_str(&piece);
                    self.advance(&mut out);
                }
                State::Outside => {}
            }
            return Ok(out);
        }
        self.close(&mut out)?;
        if id == self.sp.message_model {
            self.state = State::Header;
            self.header.clear();
        } else if Some(id) == self.sp.invoke_tool_json {
            let name = self
                .tok
                .decode(&self.header, false)
                .map_err(|e| anyhow::anyhow!("decoding a tool call: {e}"))?;
            self.name = name.trim().to_string();
            self.header.clear();
            self.state = State::Call;
        } else {
            self.state = State::Outside;
        }
        Ok(out)
    }

    /// At the end of generation: a call left open (cut by the length limit or a stop).
    pub fn finish(&mut self) -> anyhow::Result<Vec<CallEvent>> {
        let mut out = Vec::new();
        self.close(&mut out)?;
        self.state = State::Outside;
        Ok(out)
    }

    /// Read the head when it is complete, then send the arguments written so far, holding back
    /// a tail of `}` and white space (the call object's own closing brace is among it).
    fn advance(&mut self, out: &mut Vec<CallEvent>) {
        if self.args.is_none() && !self.no_head {
            match head(&self.text) {
                Head::Wait => {}
                Head::No => self.no_head = true,
                Head::Args(n, at) => {
                    let n = if n.is_empty() { self.name.clone() } else { n };
                    out.push(CallEvent::Start(n.clone()));
                    self.args = Some((n, at));
                }
            }
        }
        if let Some((_, at)) = &self.args {
            let args = &self.text[*at..];
            let ready = args
                .trim_end_matches(|c: char| c == '}' || c.is_whitespace())
                .len();
            if ready > self.sent {
                out.push(CallEvent::Args(args[self.sent..ready].to_string()));
                self.sent = ready;
            }
        }
    }

    fn close(&mut self, out: &mut Vec<CallEvent>) -> anyhow::Result<()> {
        if self.state != State::Call {
            return Ok(());
        }
        let tail = self.stream.finish()?;
        self.text.push_str(&tail);
        self.advance(out);
        let text = std::mem::take(&mut self.text);
        let name = std::mem::take(&mut self.name);
        let call = match self.args.take() {
            Some((n, at)) => {
                // the arguments without the call object's closing brace
                let a = text[at..].trim_end();
                let inner = a.strip_suffix('}').unwrap_or(a);
                let parses = |s: &str| serde_json::from_str::<Value>(s).is_ok();
                let a = if parses(inner) || !parses(a) {
                    inner
                } else {
                    a
                };
                if a.len() > self.sent {
                    out.push(CallEvent::Args(a[self.sent..].to_string()));
                }
                ParsedCall {
                    name: n,
                    arguments: a.to_string(),
                }
            }
            None => call_of(
                &name,
                &text[..self.generated_at],
                &text[self.generated_at..],
            ),
        };
        out.push(CallEvent::End(call));
        self.stream = TextStream::new(self.tok);
        self.generated_at = 0;
        self.no_head = false;
        self.sent = 0;
        Ok(())
    }
}

/// A call from its block's header name and JSON text (`prefix` prefilled, `body` generated).
/// `{"name":N,"args":A}` gives N and A; other text gives the header name and the text itself as
/// the arguments (OpenAI's arguments need not be valid JSON: clients are told to check them).
pub fn call_of(header: &str, prefix: &str, body: &str) -> ParsedCall {
    let full = format!("{prefix}{body}");
    if let Ok(Value::Object(o)) = serde_json::from_str::<Value>(full.trim()) {
        let name = o
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .unwrap_or(header);
        let args = o.get("args").or_else(|| o.get("arguments"));
        if let Some(a) = args {
            return ParsedCall {
                name: name.to_string(),
                arguments: match a {
                    // arguments already given as a JSON string
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                },
            };
        }
    }
    // a forced call: the generated text is the arguments and the object's closing brace
    let args = if prefix.is_empty() {
        full.trim()
    } else {
        body.trim()
    };
    let args = match args.strip_suffix('}') {
        Some(a) if !prefix.is_empty() && serde_json::from_str::<Value>(a).is_ok() => a,
        _ => args,
    };
    ParsedCall {
        name: header.to_string(),
        arguments: args.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_heads() {
        assert_eq!(head(""), Head::Wait);
        assert_eq!(head("{\"na"), Head::Wait);
        assert_eq!(head("{\"name\":\"get_w"), Head::Wait);
        assert_eq!(head("{\"name\":\"a\\\"b\",\"ar"), Head::Wait);
        assert_eq!(
            head("{\"name\":\"a\\\"b\",\"args\":{"),
            Head::Args("a\"b".into(), 22)
        );
        assert_eq!(head("{\"name\": \"f\""), Head::No);
        assert_eq!(head("{\"args\":{}}"), Head::No);
        assert_eq!(head("not json"), Head::No);
    }

    #[test]
    fn calls_from_block_text() {
        let c = call_of("f", "", r#"{"name":"get_weather","args":{"city":"SF"}}"#);
        assert_eq!(c.name, "get_weather");
        assert_eq!(c.arguments, r#"{"city":"SF"}"#);
        let c = call_of(
            "get_weather",
            r#"{"name":"get_weather","args":"#,
            r#"{"a":1}}"#,
        );
        assert_eq!(c.arguments, r#"{"a":1}"#);
        let c = call_of("g", r#"{"name":"g","args":"#, "{\"a\":1");
        assert_eq!((c.name.as_str(), c.arguments.as_str()), ("g", "{\"a\":1"));
        let c = call_of("h", "", "not json");
        assert_eq!((c.name.as_str(), c.arguments.as_str()), ("h", "not json"));
    }

    #[test]
    fn strict_and_unknown_keys_of_a_declaration_are_refused_by_name() {
        let with = |f: Value| json!([{"type": "function", "function": f}]);
        let ok = with(json!({"name": "f", "strict": false}));
        assert!(parse(Some(&ok), None, None).is_ok());
        for (f, param) in [
            (
                json!({"name": "f", "strict": true}),
                "tools[0].function.strict",
            ),
            (
                json!({"name": "f", "strict": 1}),
                "tools[0].function.strict",
            ),
            (json!({"name": "f", "foo": 1}), "tools[0].function.foo"),
        ] {
            let e = parse(Some(&with(f)), None, None).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param));
        }
        let extra = json!([{"type": "function", "function": {"name": "f"}, "x": 1}]);
        let e = parse(Some(&extra), None, None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].x"));
    }

    #[test]
    fn tool_choice_required_and_unknown_names_are_refused() {
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        let t = parse(Some(&tools), Some(&json!("required")), None)
            .unwrap()
            .unwrap();
        assert_eq!(t.choice, Choice::Named("f".into()));
        let two = json!([{"type": "function", "function": {"name": "f"}},
                         {"type": "function", "function": {"name": "g"}}]);
        let e = parse(Some(&two), Some(&json!("required")), None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        let e = parse(None, Some(&json!("required")), None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        let named = json!({"type": "function", "function": {"name": "g"}});
        let e = parse(Some(&tools), Some(&named), None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice.function.name"));
        let e = parse(None, Some(&named), None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice.function.name"));
        let t = parse(Some(&tools), Some(&json!("none")), Some(&json!(false)))
            .unwrap()
            .unwrap();
        assert_eq!((t.choice, t.parallel), (Choice::None, false));
        let e = parse(Some(&json!([{"type": "code"}])), None, None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].type"));
    }

    #[test]
    fn declarations_are_sorted_compact_json() {
        let d = ToolDecl {
            name: "get_weather".into(),
            description: Some("Weather".into()),
            parameters: Some(json!({"type": "object", "properties": {"city": {"type": "string"}}})),
        };
        assert_eq!(
            declaration_json(&[d]),
            r#"[{"description":"Weather","name":"get_weather","parameters":{"properties":{"city":{"type":"string"}},"type":"object"},"type":"function"}]"#
        );
    }
}
