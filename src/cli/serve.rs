//! `inkling-wgpu serve`: an OpenAI-compatible HTTP server (axum on a single-threaded tokio
//! runtime). The model loads on the engine thread while the server already answers
//! (`/health` 503 until it is ready). Binds to loopback unless `--host` says otherwise.
//!
//! SIGINT or SIGTERM shuts the server down: no new connections or requests, every request queued
//! or running ends at once (`serve::http::Shutdown`), then one line on stderr and exit status 0.
//! A second signal meanwhile ends the process at once (status 130 for SIGINT, 143 for SIGTERM).
use super::load::{open_tokenizer, sampling, with_chat_model, ModelArgs};
use crate::model::{GenerationConfig, TextConfig};
use crate::serve::engine::{self, Shared};
use crate::serve::http::{router, AppState, Shutdown};
use crate::serve::timeout::HeadTimeout;
use anyhow::Context;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long the shutdown waits for the engine thread to put its model down (a running job halts
/// at its next token) before the process exits anyway.
const ENGINE_GRACE: Duration = Duration::from_secs(10);

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to bind. The default, loopback, accepts only this machine; 0.0.0.0 accepts any
    /// (there is no authentication).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// TCP port (0 = any free port; the bound address is printed).
    #[arg(allow_negative_numbers = true, long, default_value_t = 8080)]
    pub port: u16,
    /// Requests decoded together, 1 to 256 (sequence slots, each with its own KV cache of --ctx
    /// tokens; llama.cpp's server `--parallel`). Requests past them wait in the queue.
    #[arg(allow_negative_numbers = true, long, default_value_t = 4, value_parser = super::values::parse_slots)]
    pub parallel: usize,
    /// Requests that may wait for a free slot; past that, 429 with Retry-After.
    #[arg(allow_negative_numbers = true, long, default_value_t = 8)]
    pub queue: usize,
    /// Largest request body in bytes (413 past it).
    #[arg(allow_negative_numbers = true, long, default_value_t = 4 << 20, value_parser = super::values::parse_tokens)]
    pub max_body_bytes: usize,
    /// Interval of the SSE comment pings sent while a streamed request waits or prefills, in ms.
    #[arg(allow_negative_numbers = true, long, default_value_t = 5000, value_parser = super::values::parse_positive)]
    pub ping_ms: u64,
    /// Time a client has to send each request head (request line and headers), in ms; past it
    /// the connection is closed. Bodies and responses are not timed.
    #[arg(allow_negative_numbers = true, long, default_value_t = crate::serve::timeout::DEFAULT_HEAD_TIMEOUT.as_millis() as u64,
          value_parser = super::values::parse_positive)]
    pub header_timeout_ms: u64,
    /// Model id in the API (default: the model directory's name; `austen-demo` for the bundled model).
    #[arg(long, value_parser = super::values::parse_model_id)]
    pub model_id: Option<String>,
    /// Defaults of requests that set no `min_p`, `repetition_penalty` or `repeat_last_n`.
    #[command(flatten)]
    pub penalties: super::penalties::PenaltyArgs,
}

/// Threads that parse and tokenise requests at the same time (tokio's blocking pool).
const PARSE_THREADS: usize = 4;

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let dir = args.model.dir()?;
    let (tok, renderer) = open_tokenizer(&dir)?;
    let config = TextConfig::from_dir(&dir)?;
    // a --ctx past the model's is refused (exit 2) before the model loads; the engine thread
    // computes the same context from the checkpoint (`Shared::ctx`)
    args.model.context(&config)?;
    // so are expert placement flags the device cannot take
    args.model.placement.placement(args.model.device)?;
    let generation = GenerationConfig::from_dir(&dir)?.unwrap_or_default();
    let defaults = args.penalties.apply(
        sampling(&dir, &generation, None, None, None)?,
        &dir,
        &generation,
    )?;
    let model_id = args.model_id.clone().or_else(|| {
        // the bundled model's cache directory is named by its hash; its id is its own name
        args.model
            .model
            .is_none()
            .then(|| crate::bundled::NAME.to_string())
    });
    let model_id = model_id.unwrap_or_else(|| {
        let canon = dir.canonicalize().unwrap_or_else(|_| dir.clone());
        canon
            .file_name()
            .map_or("model".into(), |n| n.to_string_lossy().into_owned())
    });
    let longest_token_bytes = crate::model::text::longest_token_bytes(&tok);
    let (tok, renderer) = (Arc::new(tok), Arc::new(renderer));
    let shared = Arc::new(Shared::default());
    let shutdown = Arc::new(Shutdown::default());
    #[cfg(unix)]
    shut_down_on_signals(shutdown.clone())?;
    // bound before the model loads, so a bad --host or a busy --port fails at once
    let std_listener = std::net::TcpListener::bind((args.host.as_str(), args.port))
        .with_context(|| format!("binding {}:{}", args.host, args.port))?;
    std_listener
        .set_nonblocking(true)
        .context("setting the listening socket non-blocking")?;
    let addr = std_listener.local_addr()?;
    let scope = if addr.ip().is_loopback() {
        "loopback only: other machines cannot connect; --host 0.0.0.0 to accept them"
    } else {
        "reachable from other machines; there is no authentication"
    };
    // the first line, before the model loads (clients and tests read the address from it)
    eprintln!("inkling-wgpu serve: listening on http://{addr} ({scope}); model id {model_id:?}");
    // the HTTP side admits at most `capacity` jobs (`Shared::admitted`), so the channel never fills
    let capacity = args.parallel + args.queue;
    let (jobs, jobs_rx) = std::sync::mpsc::sync_channel(capacity);
    // disconnected when the engine thread ends
    let (engine_alive, engine_ended) = std::sync::mpsc::channel::<()>();
    {
        let (tok, renderer, shared) = (tok.clone(), renderer.clone(), shared.clone());
        let margs = args.model.clone();
        let parallel = args.parallel;
        std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || {
                let _alive = engine_alive;
                let res = with_chat_model(&margs, parallel, &tok, &renderer, |cm| {
                    let _ = shared.stop_ids.set(cm.stop_ids.clone());
                    let _ = shared.ctx.set(cm.ctx);
                    let experts = cm.model.stream_stats().map_or(String::new(), |x| {
                        format!(", routed experts streamed through {} slots", x.slots)
                    });
                    let n = cm.model.slots();
                    eprintln!(
                        "inkling-wgpu serve: model loaded ({}{experts}, {n} sequence slot{}, {} \
                         tokens of context)",
                        cm.model.adapter(),
                        if n == 1 { "" } else { "s" },
                        cm.ctx
                    );
                    engine::run(cm.model, cm.tok, renderer.specials(), jobs_rx, &shared);
                    Ok(())
                });
                if let Err(e) = res {
                    eprintln!("error: loading the model failed: {e:#}");
                    std::process::exit(1);
                }
            })
            .context("starting the engine thread")?;
    }
    let state = Arc::new(AppState {
        shared: shared.clone(),
        renderer,
        jobs,
        capacity,
        shutdown: shutdown.clone(),
        model_id: model_id.clone(),
        model_created: std::fs::metadata(dir.join("config.json"))
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or_else(crate::serve::http::unix_time, |d| d.as_secs()),
        vocab: config.vocab_size,
        longest_token_bytes,
        sampling: defaults,
        ping: Duration::from_millis(args.ping_ms),
        // the top bit clear: counting up never wraps in a server's life
        next_id: AtomicU64::new(crate::model::sampling::random_seed() >> 1),
        max_body: args.max_body_bytes,
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        // request parsing and tokenising (`spawn_blocking`): a few at a time, so a flood of large
        // bodies cannot start hundreds of threads
        .max_blocking_threads(PARSE_THREADS)
        .build()
        .context("starting the async runtime")?;
    let stopped = shutdown.started();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(std_listener)
            .context("registering the listening socket")?;
        let head_timeout = Duration::from_millis(args.header_timeout_ms);
        axum::serve(HeadTimeout::new(listener, head_timeout), router(state))
            .with_graceful_shutdown(stopped)
            .await
            .context("serving HTTP")
    })?;
    // the server returns only once the shutdown has started
    let reason = shutdown.reason().unwrap_or("unknown cause");
    // dropping the runtime drops the last job sender, so the engine thread ends after its job
    drop(rt);
    if shared.ready.load(Ordering::SeqCst) {
        let _ = engine_ended.recv_timeout(ENGINE_GRACE);
    }
    let n = shutdown.ended_early();
    let s = if n == 1 { "" } else { "s" };
    eprintln!("inkling-wgpu serve: shut down ({reason}); {n} request{s} ended early");
    Ok(ExitCode::SUCCESS)
}

/// From now on, the first SIGINT or SIGTERM starts `shutdown`; the next one ends the process at
/// once with status 128 + its number (130 for SIGINT, 143 for SIGTERM).
#[cfg(unix)]
fn shut_down_on_signals(shutdown: Arc<Shutdown>) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .context("installing the SIGINT/SIGTERM handler")?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut caught = signals.forever();
            if let Some(sig) = caught.next() {
                shutdown.start(if sig == SIGINT { "SIGINT" } else { "SIGTERM" });
            }
            if let Some(sig) = caught.next() {
                signal_hook::low_level::exit(128 + sig);
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}
