//! `context_length_exceeded`: the limit it gives is the context the server's model runs with (as
//! its "model loaded" line says: `--ctx`, or the model's own), and its `param` names the request
//! field the prompt came from (`messages` for chat, `prompt` for completions).
use super::server::{post_json, Server};
use serde_json::{json, Value};

fn check(v: &Value, param: &str, ctx: usize) {
    let e = &v["error"];
    assert_eq!(e["code"], "context_length_exceeded", "{v}");
    assert_eq!(e["type"], "invalid_request_error", "{v}");
    assert_eq!(e["param"], param, "{v}");
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.starts_with(&format!(
            "This model's maximum context length is {ctx} tokens."
        )),
        "{msg}"
    );
}

#[test]
fn context_length_exceeded_names_the_field_and_the_context_in_use() {
    // a context below the fixture's max_position_embeddings (4096): the server runs with it
    let server = Server::start(&["--ctx", "100"]);
    let ctx = server.ctx;
    assert_eq!(ctx, 100);
    let asked = 200;
    let (code, v) = post_json(
        &server.addr,
        "/v1/completions",
        &json!({"prompt": [100, 101], "max_tokens": asked}),
    );
    assert_eq!(code, 400, "{v}");
    check(&v, "prompt", ctx);
    let (code, v) = post_json(
        &server.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": asked}),
    );
    assert_eq!(code, 400, "{v}");
    check(&v, "messages", ctx);
}
