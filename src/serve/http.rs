//! Routes: `POST /v1/chat/completions`, `POST /v1/completions` (both streaming as SSE or not),
//! `GET /v1/models`, `GET /health` (503 while the model loads; request counts once it runs).
//! Request bodies are size-limited (413 past the limit) and parsed (and tokenised) on tokio's
//! blocking pool, off the runtime's one thread; every error is an OpenAI envelope (405 and 404
//! included).
//! A streamed response carries SSE comment pings (`: ping`) while it waits in the queue or its
//! prefill runs, so clients with idle timeouts keep the connection.
//! Once the server's [`Shutdown`] starts, every request queued or running ends at once (503, or an
//! SSE error event and `data: [DONE]`), new ones get 503 and `/health` answers 503.
use super::api::{self, ApiError, Limits, Request};
use super::job::{Event, Job, JobKind, Shared};
use super::logprobs::{self as lp, Offsets, TokenLp};
use super::tools::{CallEvent, ParsedCall};
use crate::chat::parse::Block;
use crate::chat::Renderer;
use crate::model::sampling::SamplingParams;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::sync::watch;

/// Everything a handler needs.
pub struct AppState {
    pub shared: Arc<Shared>,
    pub renderer: Arc<Renderer>,
    pub jobs: SyncSender<Job>,
    /// Requests that may be queued or running at once (`--parallel` + `--queue`); past it, 429.
    pub capacity: usize,
    pub shutdown: Arc<Shutdown>,
    pub model_id: String,
    /// `/v1/models`' `created`: when the model's config.json was last modified, Unix seconds (as
    /// Ollama reports a model's modification time), else when the server started.
    pub model_created: u64,
    /// The model's vocabulary size (prompt ids must be below it).
    pub vocab: usize,
    /// [`crate::model::text::longest_token_bytes`] of the tokenizer (bounds prompt text in bytes).
    pub longest_token_bytes: usize,
    /// Sampling when a request does not say.
    pub sampling: SamplingParams,
    /// Interval of SSE comment pings.
    pub ping: Duration,
    /// The number in the next response id (`chatcmpl-…` / `cmpl-…`, 16 hex digits): it starts at a
    /// random value per server start, so ids stay distinct across restarts, and counts up.
    pub next_id: AtomicU64,
    /// Largest request body in bytes (`serve --max-body-bytes`; past it, 413).
    pub max_body: usize,
}

/// The server's shutdown (started by SIGINT or SIGTERM, `cli::serve`): once started, requests in
/// the queue or running end early, new ones are refused, and the HTTP server (given
/// [`Shutdown::started`]) stops accepting connections and returns when the open ones have ended.
pub struct Shutdown {
    /// What started it (such as `"SIGINT"`); `None` while the server runs.
    reason: watch::Sender<Option<&'static str>>,
    /// Accepted requests it ended before their answer was complete.
    ended: AtomicU64,
}

impl Default for Shutdown {
    fn default() -> Shutdown {
        Shutdown {
            reason: watch::Sender::new(None),
            ended: AtomicU64::new(0),
        }
    }
}

impl Shutdown {
    /// Start the shutdown, naming its cause; once started, later calls change nothing.
    pub fn start(&self, reason: &'static str) {
        self.reason.send_if_modified(|r| {
            let first = r.is_none();
            if first {
                *r = Some(reason);
            }
            first
        });
    }

    /// Its cause, once started.
    pub fn reason(&self) -> Option<&'static str> {
        *self.reason.borrow()
    }

    /// A future that resolves when the shutdown starts (at once when it has).
    pub fn started(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.reason.subscribe();
        async move {
            let gone = rx.wait_for(Option::is_some).await.is_err();
            if gone {
                // the Shutdown was dropped unstarted: it can no longer start
                std::future::pending::<()>().await;
            }
        }
    }

    /// How many accepted requests the shutdown ended before their answer was complete.
    pub fn ended_early(&self) -> u64 {
        self.ended.load(Ordering::SeqCst)
    }
}

/// The error of requests ended or refused by the shutdown (503).
fn shutting_down() -> ApiError {
    ApiError::new(
        503,
        "server_error",
        "shutting_down",
        "the server is shutting down".into(),
    )
}

/// The application: routes, body limit ([`AppState::max_body`] bytes), state.
pub fn router(state: Arc<AppState>) -> Router {
    let max_body = state.max_body;
    Router::new()
        .route("/", get(page))
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// The chat page (`src/serve/page.html`, one self-contained file: no external resources).
pub const PAGE: &str = include_str!("page.html");

async fn page() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE).into_response()
}

fn json_response(status: u16, v: &Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

fn error_response(e: &ApiError) -> Response {
    let mut r = json_response(e.status, &e.body());
    if e.status == 429 {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

pub fn unix_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.shutdown.reason().is_some() {
        return json_response(503, &json!({"status": "shutting down"}));
    }
    if !st.shared.ready.load(Ordering::SeqCst) {
        return json_response(503, &json!({"status": "loading model"}));
    }
    let mut v = json!({"status": "ok"});
    v["counts"] = st.shared.counters.to_json();
    v["slots"] = st.shared.slots_json();
    let experts = *st.shared.experts.lock().unwrap_or_else(|e| e.into_inner());
    v["experts"] = match experts {
        Some(x) => x.to_json(),
        None => json!({ "resident": true }),
    };
    json_response(200, &v)
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    json_response(
        200,
        &json!({"object": "list", "data": [{
            "id": st.model_id, "object": "model", "created": st.model_created, "owned_by": "inkling-wgpu",
        }]}),
    )
}

async fn not_found() -> Response {
    error_response(&ApiError::new(
        404,
        "invalid_request_error",
        "not_found",
        "no such endpoint (POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health)"
            .into(),
    ))
}

/// A known path with the wrong method (axum keeps its `Allow` header).
async fn method_not_allowed() -> Response {
    error_response(&ApiError::new(
        405,
        "invalid_request_error",
        "method_not_allowed",
        "this endpoint does not take that method (POST /v1/chat/completions, POST \
         /v1/completions, GET /v1/models, GET /health)"
            .into(),
    ))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Completion,
}

async fn chat(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    handle(st, body, Endpoint::Chat).await
}

async fn completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(st, body, Endpoint::Completion).await
}

/// What every response body of one request carries.
struct Meta {
    id: String,
    created: u64,
    model: String,
    endpoint: Endpoint,
    include_usage: bool,
    return_token_ids: bool,
    prompt: Vec<u32>,
    /// Log-probabilities were asked for.
    logprobs: bool,
}

impl Meta {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id, "object": self.object(chunk), "created": self.created,
            "model": self.model, "choices": choices,
        })
    }
}

async fn handle(st: Arc<AppState>, body: Result<Bytes, BytesRejection>, ep: Endpoint) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(rej) => {
            let status = rej.status().as_u16();
            let message = if status == 413 {
                format!(
                    "{}: the request body is over this server's limit of {} bytes (serve \
                     --max-body-bytes)",
                    rej.body_text(),
                    st.max_body
                )
            } else {
                rej.body_text()
            };
            return error_response(&ApiError {
                status,
                message,
                kind: "invalid_request_error",
                param: None,
                code: None,
            });
        }
    };
    let c = &st.shared.counters;
    c.requests.fetch_add(1, Ordering::Relaxed);
    if st.shutdown.reason().is_some() {
        return error_response(&shutting_down());
    }
    let ctx = match (st.shared.stop_ids.get(), st.shared.ctx.get()) {
        (Some(_), Some(&ctx)) if st.shared.ready.load(Ordering::SeqCst) => ctx,
        _ => {
            return error_response(&ApiError::new(
                503,
                "server_error",
                "model_loading",
                "the model is still loading; retry when GET /health answers 200".into(),
            ))
        }
    };
    // parsing and tokenising take time in proportion to the body (up to the body limit): on the
    // blocking pool, so that other connections are served meanwhile
    let left = CancelledBeforeQueue(Some(&c.cancelled));
    let parsed = tokio::task::spawn_blocking({
        let st = st.clone();
        move || parse(&st, ctx, &body, ep)
    })
    .await;
    left.disarm();
    let req: Request = match parsed {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return error_response(&e),
        Err(e) => return error_response(&engine_error(format!("parsing the request failed: {e}"))),
    };
    let (tx, rx) = unbounded_channel();
    let job = Job {
        prompt: req.prompt.clone(),
        params: req.params.clone(),
        stop: req.stop.clone(),
        kind: match ep {
            Endpoint::Chat => JobKind::Chat {
                in_text: req.in_text,
            },
            Endpoint::Completion => JobKind::Completion,
        },
        logit: req.logit.clone(),
        tools: req.tools.clone(),
        events: tx,
    };
    // counted here, uncounted by the engine when the job ends (`Shared::admitted`)
    let full = st.shared.admitted.fetch_add(1, Ordering::SeqCst) >= st.capacity;
    let sent = if full {
        Err(TrySendError::Full(job))
    } else {
        st.jobs.try_send(job)
    };
    if sent.is_err() {
        st.shared.job_ended();
    }
    match sent {
        Ok(()) => {}
        Err(TrySendError::Full(_)) => {
            c.rejected.fetch_add(1, Ordering::Relaxed);
            return error_response(&ApiError::new(
                429,
                "rate_limit_error",
                "queue_full",
                "the request queue is full; retry later".into(),
            ));
        }
        Err(TrySendError::Disconnected(_)) => {
            return error_response(&ApiError::new(
                503,
                "server_error",
                "engine_stopped",
                "the engine has stopped".into(),
            ))
        }
    }
    let n = st.next_id.fetch_add(1, Ordering::Relaxed);
    let meta = Meta {
        id: match ep {
            Endpoint::Chat => format!("chatcmpl-{n:016x}"),
            Endpoint::Completion => format!("cmpl-{n:016x}"),
        },
        created: unix_time(),
        model: st.model_id.clone(),
        endpoint: ep,
        include_usage: req.include_usage,
        return_token_ids: req.return_token_ids,
        prompt: req.prompt,
        logprobs: req.logit.logprobs.is_some(),
    };
    let feed = Feed {
        rx,
        shutdown: Some(Box::pin(st.shutdown.started())),
        owner: st.shutdown.clone(),
    };
    if req.stream {
        let chunks = Chunks {
            feed,
            meta,
            pending: VecDeque::new(),
            done: false,
            calls: 0,
            call_open: false,
            offsets: Offsets::default(),
        };
        Sse::new(chunks)
            .keep_alive(KeepAlive::new().interval(st.ping).text("ping"))
            .into_response()
    } else {
        collect(feed, meta).await
    }
}

/// A request's view of its job: the engine's events, cut short by the server's shutdown.
struct Feed {
    rx: UnboundedReceiver<Event>,
    /// [`Shutdown::started`] until it resolves, then `None`.
    shutdown: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    owner: Arc<Shutdown>,
}

/// What a [`Feed`] gives next.
enum Next {
    Event(Event),
    /// The engine dropped the job without a last event.
    Gone,
    /// The shutdown ended the request (given once, then again on every poll).
    ShuttingDown,
}

impl Feed {
    /// The next event; the shutdown is seen before any event still waiting.
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Next> {
        let Some(sd) = self.shutdown.as_mut() else {
            return Poll::Ready(Next::ShuttingDown);
        };
        if sd.as_mut().poll(cx).is_ready() {
            self.shutdown = None;
            // the job's sender now reads closed: the engine skips it if queued, halts it at its
            // next token if running (as when the client goes away)
            self.rx.close();
            self.owner.ended.fetch_add(1, Ordering::SeqCst);
            return Poll::Ready(Next::ShuttingDown);
        }
        match self.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(ev)) => Poll::Ready(Next::Event(ev)),
            Poll::Ready(None) => Poll::Ready(Next::Gone),
        }
    }

    async fn next(&mut self) -> Next {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }
}

/// `body` as a request of endpoint `ep` (parsed, validated, tokenised).
fn parse(st: &AppState, ctx: usize, body: &[u8], ep: Endpoint) -> Result<Request, ApiError> {
    let lim = Limits {
        model_id: &st.model_id,
        ctx,
        stop_ids: st.shared.stop_ids.get().map_or(&[], Vec::as_slice),
        vocab: st.vocab,
        sampling: st.sampling,
        longest_token_bytes: st.longest_token_bytes,
    };
    match ep {
        Endpoint::Chat => api::chat_request(body, &st.renderer, &lim),
        Endpoint::Completion => api::completion_request(body, &st.renderer, &lim),
    }
}

/// Counts a request as cancelled when its handler is dropped (the client went away) while the
/// request is still being parsed, before its job reaches the engine (which counts the ones it
/// sees cancelled).
struct CancelledBeforeQueue<'a>(Option<&'a AtomicU64>);

impl CancelledBeforeQueue<'_> {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CancelledBeforeQueue<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.0 {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The final choice fields: `finish_reason`, and `token_ids` when asked.
fn finish_fields(meta: &Meta, choice: &mut Value, finish: &str, ids: &[u32]) {
    choice["finish_reason"] = json!(finish);
    if meta.return_token_ids {
        choice["token_ids"] = json!(ids);
        choice["prompt_token_ids"] = json!(meta.prompt);
    }
}

fn engine_error(msg: String) -> ApiError {
    ApiError::new(500, "server_error", "engine_error", msg)
}

/// A non-streamed response: wait for the whole answer (503 when the shutdown comes first).
/// Dropped with its connection, which drops the receiver and so cancels the job.
async fn collect(mut feed: Feed, meta: Meta) -> Response {
    let (mut text, mut thinking) = (String::new(), String::new());
    let mut lps: Vec<TokenLp> = Vec::new();
    let mut calls: Vec<Value> = Vec::new();
    loop {
        let ev = match feed.next().await {
            Next::Event(ev) => ev,
            Next::Gone => break,
            Next::ShuttingDown => return error_response(&shutting_down()),
        };
        match ev {
            Event::Started => {}
            Event::Delta {
                block,
                text: t,
                logprobs,
            } => {
                match block {
                    Block::Thinking => thinking.push_str(&t),
                    _ => text.push_str(&t),
                }
                lps.extend(logprobs);
            }
            Event::Tool(CallEvent::End(c)) => calls.push(call_json(&meta, calls.len(), &c)),
            Event::Tool(_) => {}
            Event::Error(m) => return error_response(&engine_error(m)),
            Event::Done {
                finish,
                prompt_tokens,
                cached_tokens,
                generated_ids,
            } => {
                let mut choice = match meta.endpoint {
                    Endpoint::Chat => {
                        let mut m = json!({"role": "assistant", "content": text});
                        if !thinking.is_empty() {
                            m["reasoning_content"] = json!(thinking);
                        }
                        if !calls.is_empty() {
                            if text.is_empty() {
                                m["content"] = Value::Null;
                            }
                            m["tool_calls"] = json!(calls);
                        }
                        let l = meta.logprobs.then(|| lp::chat_json(&lps));
                        json!({"index": 0, "message": m, "logprobs": l})
                    }
                    Endpoint::Completion => {
                        let l = meta
                            .logprobs
                            .then(|| lp::completion_json(&lps, &mut Offsets::default()));
                        json!({"index": 0, "text": text, "logprobs": l})
                    }
                };
                finish_fields(&meta, &mut choice, finish, &generated_ids);
                let mut v = meta.envelope(false, json!([choice]));
                v["usage"] = api::usage(prompt_tokens, generated_ids.len(), cached_tokens);
                return json_response(200, &v);
            }
        }
    }
    error_response(&engine_error(
        "the engine ended the request without an answer".into(),
    ))
}

/// A tool call of choice 0 as OpenAI gives it (`index`-th of the answer).
fn call_json(meta: &Meta, index: usize, c: &ParsedCall) -> Value {
    json!({
        "id": format!("call_{}_{index}", meta.id),
        "type": "function",
        "function": {"name": c.name, "arguments": c.arguments},
    })
}

/// A streamed response: engine events → SSE chunks, then `data: [DONE]` (after an error event
/// when the shutdown ends it). Dropped with its connection, which drops the receiver and so
/// cancels the job.
struct Chunks {
    feed: Feed,
    meta: Meta,
    pending: VecDeque<SseEvent>,
    done: bool,
    /// Tool calls streamed so far.
    calls: usize,
    /// A call's start was streamed and its end not yet.
    call_open: bool,
    /// Text offsets of completion log-probabilities.
    offsets: Offsets,
}

impl Chunks {
    fn push(&mut self, v: &Value) {
        self.pending
            .push_back(SseEvent::default().data(v.to_string()));
    }

    fn delta(&self, delta: Value) -> Value {
        let choice = match self.meta.endpoint {
            Endpoint::Chat => {
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": null})
            }
            Endpoint::Completion => {
                json!({"index": 0, "text": delta["content"], "logprobs": null, "finish_reason": null})
            }
        };
        self.meta.envelope(true, json!([choice]))
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Started => {
                if self.meta.endpoint == Endpoint::Chat {
                    let v = self.delta(json!({"role": "assistant", "content": ""}));
                    self.push(&v);
                }
            }
            Event::Delta {
                block,
                text,
                logprobs,
            } => {
                let key = match (block, self.meta.endpoint) {
                    (Block::Thinking, Endpoint::Chat) => "reasoning_content",
                    (Block::Thinking, Endpoint::Completion) => return,
                    _ => "content",
                };
                let mut v = self.delta(json!({ key: text }));
                if self.meta.logprobs && block == Block::Text {
                    v["choices"][0]["logprobs"] = match self.meta.endpoint {
                        Endpoint::Chat => lp::chat_json(&logprobs),
                        Endpoint::Completion => lp::completion_json(&logprobs, &mut self.offsets),
                    };
                }
                self.push(&v);
            }
            Event::Tool(e) => {
                let index = self.calls;
                let call = match e {
                    // the id, type and name first, then the arguments piece by piece
                    CallEvent::Start(name) => {
                        self.call_open = true;
                        let c = ParsedCall {
                            name,
                            arguments: String::new(),
                        };
                        call_json(&self.meta, index, &c)
                    }
                    CallEvent::Args(a) => json!({"function": {"arguments": a}}),
                    CallEvent::End(c) => {
                        self.calls += 1;
                        if std::mem::take(&mut self.call_open) {
                            return;
                        }
                        // a call that did not stream: whole in one delta
                        call_json(&self.meta, index, &c)
                    }
                };
                let mut call = call;
                call["index"] = json!(index);
                let v = self.delta(json!({ "tool_calls": [call] }));
                self.push(&v);
            }
            Event::Done {
                finish,
                prompt_tokens,
                cached_tokens,
                generated_ids,
            } => {
                let mut v = self.delta(json!({}));
                if self.meta.endpoint == Endpoint::Completion {
                    v["choices"][0]["text"] = json!("");
                }
                finish_fields(&self.meta, &mut v["choices"][0], finish, &generated_ids);
                if self.meta.include_usage {
                    v["usage"] = Value::Null;
                }
                self.push(&v);
                if self.meta.include_usage {
                    let mut u = self.meta.envelope(true, json!([]));
                    u["usage"] = api::usage(prompt_tokens, generated_ids.len(), cached_tokens);
                    self.push(&u);
                }
                self.pending.push_back(SseEvent::default().data("[DONE]"));
                self.done = true;
            }
            Event::Error(m) => {
                self.push(&engine_error(m).body());
                self.done = true;
            }
        }
    }
}

impl futures_core::Stream for Chunks {
    type Item = Result<SseEvent, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(e) = this.pending.pop_front() {
                return Poll::Ready(Some(Ok(e)));
            }
            if this.done {
                return Poll::Ready(None);
            }
            match this.feed.poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Next::Event(ev)) => this.on_event(ev),
                Poll::Ready(Next::Gone) => {
                    let e = engine_error("the engine ended the request without an answer".into());
                    this.push(&e.body());
                    this.done = true;
                }
                Poll::Ready(Next::ShuttingDown) => {
                    this.push(&shutting_down().body());
                    this.pending.push_back(SseEvent::default().data("[DONE]"));
                    this.done = true;
                }
            }
        }
    }
}
