//! Error envelopes of the OpenAI API (`{"error":{"message","type","param","code"}}` with the HTTP
//! status), and request bodies parsed into typed values with errors that name the JSON path of the
//! field they are about (`messages[1].role`), or say where a body that is not UTF-8, not JSON or
//! not an object goes wrong.
use serde_json::{json, Value};
use std::borrow::Cow;

/// An error response: HTTP status and the envelope's fields.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    /// The JSON path of the field the error is about (`messages[0].content`), if any.
    pub param: Option<Cow<'static, str>>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(Cow::Borrowed),
            code: None,
        }
    }

    /// A 400 about the field at JSON path `path` (built at run time: `messages[3].role`); the
    /// message starts with the path.
    pub fn bad_field(message: impl std::fmt::Display, path: String) -> ApiError {
        ApiError {
            message: format!("`{path}`: {message}"),
            param: Some(Cow::Owned(path)),
            ..ApiError::bad_request("", None)
        }
    }

    pub fn new(status: u16, kind: &'static str, code: &'static str, message: String) -> ApiError {
        ApiError {
            status,
            message,
            kind,
            param: None,
            code: Some(code),
        }
    }

    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// `T` from a request body that must be a JSON object. Errors name the JSON path of the field
/// (`param` and the message); a body that is not UTF-8, not JSON or not an object says so, with
/// the byte, or line and column, where it goes wrong.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if let Err(e) = std::str::from_utf8(body) {
        return Err(ApiError::bad_request(
            format!(
                "the request body is not valid UTF-8 (at byte {})",
                e.valid_up_to()
            ),
            None,
        ));
    }
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object ({...})",
            None,
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let v = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        // `?` stands for a segment serde_path_to_error could not name (a key that is not a string)
        let path = e.path().to_string();
        let path = path.trim_end_matches(".?").trim_end_matches('?');
        let known = !matches!(path, "" | ".");
        json_error(known.then(|| path.to_string()), e.into_inner())
    })?;
    de.end().map_err(|e| json_error(None, e))?;
    Ok(v)
}

/// A serde_json error at JSON path `field` → a 400 naming the field (type and value errors) or
/// saying that the body is not valid JSON (syntax errors, with line and column).
fn json_error(field: Option<String>, e: serde_json::Error) -> ApiError {
    let at = format!("line {} column {}", e.line(), e.column());
    let full = e.to_string();
    let what = full.strip_suffix(&format!(" at {at}")).unwrap_or(&full);
    // serde reports a missing field at the object holding it: name the field itself
    let missing = what
        .strip_prefix("missing field `")
        .and_then(|m| m.strip_suffix('`'));
    let field = match (missing, field) {
        (Some(m), Some(p)) => Some(format!("{p}.{m}")),
        (Some(m), None) => Some(m.to_string()),
        (None, f) => f,
    };
    let in_field = field
        .as_ref()
        .map_or(String::new(), |p| format!(" (in `{p}`)"));
    // a number beyond f64 (`1e400`) is a syntax error to serde_json, but the field is what is wrong
    let data = e.classify() == serde_json::error::Category::Data || what == "number out of range";
    let message = if data {
        match &field {
            Some(p) => format!("invalid `{p}`: {what} (at {at})"),
            None => format!("invalid request body: {what} (at {at})"),
        }
    } else if what.contains("surrogate") || what.contains("hex escape") {
        // serde_json's words for a `\u` escape of a lone UTF-16 surrogate (`"\ud800"`), which
        // no UTF-8 string can hold
        format!(
            "the request body is not valid JSON text at {at}{in_field}: a \\u escape is a lone \
             UTF-16 surrogate (such as \\ud800), which is not a character and cannot be UTF-8 \
             ({what})"
        )
    } else {
        format!("the request body is not valid JSON at {at}{in_field}: {what}")
    };
    ApiError {
        param: field.map(Cow::Owned),
        ..ApiError::bad_request(message, None)
    }
}
