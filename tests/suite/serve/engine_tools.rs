//! The engine thread (`serve::engine::run`) on a scripted model that writes exact token sequences
//! of Inkling's format (o200k with Inkling's specials): tool calls come out as `Tool` events
//! and `finish: "tool_calls"`, `parallel_tool_calls: false` ends the turn after the first call,
//! `tool_choice: "none"` bans the tool-call token, and log-probabilities of one-hot logits are
//! exact.
use inkling_wgpu::chat::{Block, Renderer, Specials};
use inkling_wgpu::model::batch::OneSlot;
use inkling_wgpu::model::generate::{GenerateParams, LogitOptions};
use inkling_wgpu::model::sampling::SamplingParams;
use inkling_wgpu::model::Forward;
use inkling_wgpu::serve::engine::{self, Event, Job, JobKind, Shared};
use inkling_wgpu::serve::tools::{CallEvent, Choice, ParsedCall, ToolDecl, Tools};
use std::io::Read;
use tokenizers::Tokenizer;

/// Writes `script[k]` at its k-th step after a reset (logit 10 for it, 0 for every other id),
/// then `<|content_model_end_sampling|>`.
struct Scripted {
    script: Vec<u32>,
    end: u32,
    vocab: usize,
    step: usize,
    pos: usize,
}

impl Forward for Scripted {
    fn forward(&mut self, tokens: &[u32]) -> anyhow::Result<Vec<f32>> {
        self.pos += tokens.len();
        let id = self.script.get(self.step).copied().unwrap_or(self.end);
        self.step += 1;
        let mut l = vec![0.0; self.vocab];
        l[id as usize] = 10.0;
        Ok(l)
    }
    fn forward_all(&mut self, _: &[u32]) -> anyhow::Result<Vec<Vec<f32>>> {
        unimplemented!()
    }
    fn reset(&mut self) {
        self.step = 0;
        self.pos = 0;
    }
    fn position(&self) -> usize {
        self.pos
    }
    fn backend(&self) -> &'static str {
        "cpu"
    }
    fn adapter(&self) -> String {
        "scripted".into()
    }
}

fn o200k() -> (Tokenizer, Renderer) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tokenizer-o200k-inkling/tokenizer.json.gz");
    let mut json = Vec::new();
    flate2::read::GzDecoder::new(&std::fs::read(path).unwrap()[..])
        .read_to_end(&mut json)
        .unwrap();
    let tok = Tokenizer::from_bytes(&json).unwrap();
    let r = Renderer::new(&tok).unwrap();
    (tok, r)
}

/// A text block, then two tool calls, then the end of the turn.
fn script(r: &Renderer) -> Vec<u32> {
    let sp = r.specials();
    let e = |s: &str| r.encode_text(s).unwrap();
    let tool = sp.invoke_tool_json.unwrap();
    let mut s = vec![sp.content_text];
    s.extend(e("Checking."));
    s.extend([sp.end_message, sp.message_model]);
    s.extend(e("get_weather"));
    s.push(tool);
    s.extend(e(r#"{"name":"get_weather","args":{"city":"SF"}}"#));
    s.extend([sp.end_message, sp.message_model]);
    s.extend(e("get_time"));
    s.push(tool);
    s.extend(e(r#"{"name":"get_time","args":{}}"#));
    s.extend([sp.end_message, sp.model_end_sampling]);
    s
}

fn tools(choice: Choice, parallel: bool) -> Tools {
    let decl = |n: &str| ToolDecl {
        name: n.into(),
        description: None,
        parameters: None,
    };
    Tools {
        decls: vec![decl("get_weather"), decl("get_time")],
        choice,
        parallel,
    }
}

/// Run one job through the engine; its events.
fn run(
    tok: &Tokenizer,
    sp: &Specials,
    script: Vec<u32>,
    tools: Option<Tools>,
    logit: LogitOptions,
) -> Vec<Event> {
    let mut model = Scripted {
        script,
        end: sp.model_end_sampling,
        vocab: tok.get_vocab_size(true),
        step: 0,
        pos: 0,
    };
    let shared = Shared::default();
    let (jobs_tx, jobs_rx) = std::sync::mpsc::sync_channel(1);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    jobs_tx
        .send(Job {
            prompt: vec![
                sp.message_user,
                sp.content_text,
                13225,
                sp.end_message,
                sp.message_model,
            ],
            params: GenerateParams {
                max_new_tokens: 200,
                sampling: SamplingParams::default(),
                seed: 1,
                eos_ids: vec![sp.model_end_sampling],
            },
            stop: vec![],
            kind: JobKind::Chat { in_text: false },
            logit,
            tools,
            events: tx,
        })
        .unwrap();
    drop(jobs_tx);
    engine::run(&mut OneSlot(&mut model), tok, sp, jobs_rx, &shared);
    let mut events = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        events.push(ev);
    }
    events
}

fn calls(events: &[Event]) -> Vec<ParsedCall> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Tool(CallEvent::End(c)) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

fn text(events: &[Event]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Delta {
                block: Block::Text,
                text,
                ..
            } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

fn finish(events: &[Event]) -> (&'static str, usize) {
    match events.last() {
        Some(Event::Done {
            finish,
            generated_ids,
            ..
        }) => (finish, generated_ids.len()),
        other => panic!("no Done: {other:?}"),
    }
}

#[test]
fn the_engine_turns_tool_call_blocks_into_tool_call_events() {
    let (tok, r) = o200k();
    let sp = r.specials().clone();
    let s = script(&r);
    let want = [("get_weather", r#"{"city":"SF"}"#), ("get_time", "{}")];
    // auto, parallel: both calls, the text, finish tool_calls
    let ev = run(
        &tok,
        &sp,
        s.clone(),
        Some(tools(Choice::Auto, true)),
        LogitOptions::default(),
    );
    let got = calls(&ev);
    let got: Vec<(&str, &str)> = got
        .iter()
        .map(|c| (c.name.as_str(), c.arguments.as_str()))
        .collect();
    assert_eq!(got, want);
    assert_eq!(text(&ev), "Checking.");
    assert_eq!(finish(&ev), ("tool_calls", s.len()));
    // parallel_tool_calls false: the turn ends after the first call's block
    let ev = run(
        &tok,
        &sp,
        s.clone(),
        Some(tools(Choice::Auto, false)),
        LogitOptions::default(),
    );
    assert_eq!(calls(&ev).len(), 1);
    let first_end = s.iter().position(|&id| id == sp.message_model).unwrap();
    let second = first_end
        + 1
        + s[first_end + 1..]
            .iter()
            .position(|&id| id == sp.message_model)
            .unwrap();
    assert_eq!(finish(&ev), ("tool_calls", second));
    // no tools: no calls (tool-call JSON is never answer text)
    let ev = run(&tok, &sp, s.clone(), None, LogitOptions::default());
    assert!(calls(&ev).is_empty());
    assert_eq!(finish(&ev).0, "stop");
    assert!(!text(&ev).contains("{\"name\""), "{}", text(&ev));
    // tool_choice none bans the tool-call token: the model's next best (id 0 of the flat logits)
    // comes instead and no call is made
    let ban = LogitOptions {
        bias: vec![(sp.invoke_tool_json.unwrap(), f32::NEG_INFINITY)],
        logprobs: None,
    };
    let ev = run(&tok, &sp, s.clone(), None, ban);
    assert!(calls(&ev).is_empty());
    // logprobs of a one-hot logit row: 10 - ln(e^10 + V - 1), exactly
    let ev = run(
        &tok,
        &sp,
        s,
        None,
        LogitOptions {
            bias: vec![],
            logprobs: Some(2),
        },
    );
    let v = tok.get_vocab_size(true) as f64;
    let want_lp = 10.0 - (10f64.exp() + v - 1.0).ln();
    let lps: Vec<_> = ev
        .iter()
        .flat_map(|e| match e {
            Event::Delta { logprobs, .. } => logprobs.clone(),
            _ => vec![],
        })
        .collect();
    assert_eq!(lps.len(), r.encode_text("Checking.").unwrap().len());
    let bytes: Vec<u8> = lps.iter().flat_map(|l| l.bytes.clone()).collect();
    assert_eq!(bytes, b"Checking.");
    for l in &lps {
        assert!((l.logprob as f64 - want_lp).abs() < 1e-5, "{l:?}");
        assert_eq!(l.top.len(), 2);
        assert_eq!(l.top[0].2, l.logprob);
        // the runner-up: a zero logit, id 0 (ties by id)
        assert_eq!(l.top[1].1, tok.decode(&[0], false).unwrap().into_bytes());
    }
}
