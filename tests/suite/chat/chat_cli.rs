//! `inkling-wgpu chat` driven through stdin (one message per line): two turns, compared with a
//! one-shot generation of the whole conversation; `/clear` starts over; a model without the chat
//! specials is refused; `generate` and `chat` stop on the same EOS ids.
use crate::chat_common::{chat_model, stop_ids, tokenizer_and_renderer};
use crate::model_common::greedy;
use inkling_wgpu::chat::parse::split_turn;
use inkling_wgpu::chat::{Effort, Message, Role};
use inkling_wgpu::gpu::device::Gpu;
use inkling_wgpu::model::generate::generate;
use inkling_wgpu::model::{Checkpoint, GpuModel, GpuModelOptions, Weights};
use std::io::Write;
use std::process::{Command, Stdio};

fn chat(args: &[&str], stdin: &str) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
        .arg("chat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // a chat that refuses its model exits before reading stdin: its closed pipe is no failure
    match child.stdin.take().unwrap().write_all(stdin.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => panic!("writing stdin: {e}"),
        _ => {}
    }
    child.wait_with_output().unwrap()
}

#[test]
fn two_turns_through_stdin_equal_one_shot_generations() {
    const MAX: usize = 10;
    let model = chat_model();
    let out = chat(
        &[
            "--model",
            model.to_str().unwrap(),
            "--system",
            "Be brief.",
            "--effort",
            "none",
            "--max-tokens",
            &MAX.to_string(),
        ],
        "Hello there\nWhat did the fox do?\n/clear\nHello there\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "chat failed: {stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();

    // the same conversation, each turn generated from a fresh state over all of its ids
    let (tok, r) = tokenizer_and_renderer();
    let ck = Checkpoint::open(&model).unwrap();
    let w = Weights::load(&ck).unwrap();
    let gpu = Gpu::new().expect("a GPU adapter (lavapipe: WGPU_BACKEND=vulkan)");
    let mut m = GpuModel::new(&gpu, &w, GpuModelOptions::new(512)).unwrap();
    let params = greedy(stop_ids(&ck, &r), MAX);
    let effort = Some(Effort::NONE);
    let sys = [Message::new(Role::System, "Be brief.")];
    let mut conv = r.render(&sys, effort).unwrap();
    let mut expected = String::new();
    let mut turns = Vec::new();
    for line in ["Hello there", "What did the fox do?"] {
        conv.extend(r.message(&Message::new(Role::User, line)).unwrap());
        conv.extend(r.generation_prompt(effort));
        let g = generate(&mut m, &conv, &params, &mut |_| Ok(())).unwrap();
        let (thinking, text) = split_turn(&tok, r.specials(), true, &g.generated_ids).unwrap();
        assert!(thinking.is_empty());
        expected.push_str(&text);
        expected.push('\n');
        turns.push(text);
        conv.extend(&g.generated_ids);
        conv.extend(r.close_model_turn(&conv));
    }
    expected.push_str(&turns[0]);
    expected.push('\n');
    assert_eq!(stdout, expected, "chat output vs one-shot generations");
    assert!(!turns[0].is_empty() && !turns[1].is_empty());

    // one stats line per turn; the second turn prefilled only its new tokens
    let stats: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("[prompt"))
        .collect();
    assert_eq!(stats.len(), 3, "{stderr}");
    assert!(stats[0].contains("(0 reused)"), "{}", stats[0]);
    assert!(!stats[1].contains("(0 reused)"), "{}", stats[1]);
    assert!(stats[1].contains("tok/s"), "{}", stats[1]);
    assert!(
        stats[2].contains("(0 reused)"),
        "after /clear: {}",
        stats[2]
    );
}

#[test]
fn chat_refuses_a_model_without_chat_specials() {
    let plain =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-causal-f32");
    let out = chat(&["--model", plain.to_str().unwrap()], "Hello\n");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tokenizer.json") && err.contains("<|message_user|>"),
        "{err}"
    );
    let out = chat(
        &[
            "--model",
            chat_model().to_str().unwrap(),
            "--effort",
            "extreme",
        ],
        "",
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("none, minimal, low"));
}

/// A piped `chat` on the chat fixture whose answers run long (400 tokens, no thinking), with its
/// stdin and stdout.
fn long_answers_chat() -> (
    std::process::Child,
    std::process::ChildStdin,
    std::process::ChildStdout,
) {
    let model = chat_model();
    let mut child = Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
        .args(["chat", "--model", model.to_str().unwrap()])
        .args(["--effort", "none", "--max-tokens", "400"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (stdin, stdout) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
    (child, stdin, stdout)
}

/// Send SIGINT to `child`.
fn sigint(child: &std::process::Child) {
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
}

#[test]
fn ctrl_c_stops_the_answer_not_the_program() {
    use std::io::Read;
    let (child, mut stdin, mut stdout) = long_answers_chat();
    // greedy, this message runs to the 400-token limit on the chat fixture
    stdin.write_all(b"Tell me a long story\n").unwrap();
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).unwrap();
    sigint(&child);
    stdin.write_all(b"Hello there\n").unwrap();
    drop(stdin);
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stats: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("[prompt"))
        .collect();
    assert_eq!(stats.len(), 2, "{stderr}");
    assert!(stats[0].contains("| stopped |"), "{}", stats[0]);
    assert!(!stats[0].contains("| 400 tok"), "{}", stats[0]);
    assert!(!stats[1].contains("stopped"), "{}", stats[1]);
}

#[test]
fn interactive_chat_through_a_pseudo_terminal() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/chat_pty.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_inkling-wgpu"))
        .arg(chat_model())
        .output()
        .expect("python3 (standard library only) drives the pseudo-terminal");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `generate` and `chat` (and `serve`, which opens its model as `chat` does) stop on the same EOS
/// ids, on a copy of the chat model whose generation_config.json and config.json list different
/// ones: generation_config.json's list (transformers' rule), plus the tokenizer's `eos_token`; chat
/// adds only `<|content_model_end_sampling|>`.
#[test]
fn generate_and_chat_stop_on_the_same_ids() {
    use inkling_wgpu::cli::load::{eos_ids, open_tokenizer, with_chat_model, Device, ModelArgs};
    let dir = crate::model_common::copy_fixture("tiny-chat-f32", "eos-lists-differ");
    let edit = |name: &str, ids: serde_json::Value| {
        let p = dir.join(name);
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        v["eos_token_id"] = ids;
        std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    };
    edit(
        "generation_config.json",
        serde_json::json!([408, 3, 100_000]),
    );
    edit("config.json", serde_json::json!([408, 9]));
    let ck = Checkpoint::open(&dir).unwrap();
    let (tok, renderer) = open_tokenizer(&dir).unwrap();
    let end = renderer.specials().model_end_sampling;
    let generate_ids = eos_ids(&ck, Some(&tok));
    // 408 is also the tokenizer's eos_token, `<|content_model_end_sampling|>`; 9 (config.json only)
    // and 100000 (past the logits) are not stopped on
    assert_eq!(end, 408);
    assert_eq!(generate_ids, [408, 3]);
    let args = ModelArgs {
        model: Some(dir.clone()),
        device: Device::Cpu,
        ctx: Some(64),
        placement: Default::default(),
    };
    let chat_ids = with_chat_model(&args, 1, &tok, &renderer, |cm| Ok(cm.stop_ids)).unwrap();
    assert_eq!(chat_ids[0], end);
    let mut a = chat_ids[1..].to_vec();
    let mut b: Vec<u32> = generate_ids.into_iter().filter(|&id| id != end).collect();
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, b, "chat {chat_ids:?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A piped conversation that outgrows `--ctx` ends with an `error:` line naming the context
/// (no `/clear` hint: piped input cannot send it), exit status 1, and no turn's history ever
/// passes the context in the stats lines.
#[test]
fn a_piped_chat_that_outgrows_its_context_stops_with_an_error() {
    let model = chat_model();
    let lines = "Hello there\n".repeat(40);
    let out = chat(
        &[
            "--model",
            model.to_str().unwrap(),
            "--device",
            "cpu",
            "--effort",
            "none",
            "--max-tokens",
            "8",
            "--ctx",
            "60",
        ],
        &lines,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let last = stderr.lines().last().unwrap_or("");
    assert!(
        last.starts_with("error: the conversation would be") && last.contains("holds 60 (--ctx"),
        "{stderr}"
    );
    assert!(!stderr.contains("/clear"), "{stderr}");
    let mut turns = 0;
    for l in stderr.lines().filter(|l| l.starts_with("[prompt")) {
        let ctx = l.rsplit("context ").next().unwrap();
        let (used, of) = ctx.split_once('/').unwrap();
        let of: usize = of.trim_end_matches(']').parse().unwrap();
        assert!(used.parse::<usize>().unwrap() <= of, "{l}");
        assert_eq!(of, 60, "{l}");
        // an answer cut by the context says so, not "max tokens" (--max-tokens is 8)
        let generated: usize = l
            .split(" | ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        if l.contains("| max tokens |") {
            assert_eq!(generated, 8, "{l}");
        }
        if l.contains("| context full |") {
            assert!(generated < 8, "{l}");
        }
        turns += 1;
    }
    assert!(turns >= 1, "{stderr}");
}

/// A piped chat whose stdout or stderr reader has gone ends quietly as `generate` does (killed
/// by SIGPIPE, status 141 in a shell), never with a panic (exit 101).
#[cfg(unix)]
#[test]
fn a_closed_stdout_or_stderr_ends_chat_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let model = chat_model();
    for closed in ["stdout", "stderr"] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"));
        cmd.args([
            "chat",
            "--model",
            model.to_str().unwrap(),
            "--device",
            "cpu",
        ])
        .args(["--effort", "none", "--max-tokens", "4"])
        .stdin(Stdio::piped());
        let (out, err) = if closed == "stdout" {
            (Stdio::piped(), Stdio::null())
        } else {
            (Stdio::null(), Stdio::piped())
        };
        let mut child = cmd.stdout(out).stderr(err).spawn().unwrap();
        // the reader goes away before the first answer
        drop(child.stdout.take());
        drop(child.stderr.take());
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"Hello there\nAnd then?\n").unwrap();
        drop(stdin);
        let status = child.wait().unwrap();
        // SIGPIPE as expected; a pipe end briefly inherited by a child another test forks
        // meanwhile can let the writes through (exit 0): either way, never a panic (101)
        assert!(
            status.signal() == Some(libc::SIGPIPE)
                || status.code() == Some(141)
                || status.code() == Some(0),
            "closed {closed}: {status:?}"
        );
    }
}

/// A line of piped input that is not UTF-8 is named on stderr and skipped; the conversation
/// goes on with the next line.
#[test]
fn a_line_that_is_not_utf8_is_skipped_and_the_chat_goes_on() {
    let model = chat_model();
    let mut child = Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
        .args([
            "chat",
            "--model",
            model.to_str().unwrap(),
            "--device",
            "cpu",
        ])
        .args(["--effort", "none", "--max-tokens", "4"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"Hello there\nab\xff\xfe\nAnd then?\n")
        .unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: stdin line 2: input is not UTF-8 at byte 2; line ignored"),
        "{stderr}"
    );
    assert_eq!(
        stderr.lines().filter(|l| l.starts_with("[prompt")).count(),
        2,
        "{stderr}"
    );
}

/// Sampling flags under greedy decoding get generate's one `warning:` line in `chat` too, and
/// none once a temperature samples.
#[test]
fn chat_warns_about_sampling_flags_under_greedy_decoding() {
    let model = chat_model();
    let m = model.to_str().unwrap();
    let out = chat(
        &[
            "--model", m, "--device", "cpu", "--top-k", "5", "--seed", "3",
        ],
        "",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("warning: --top-k and --seed have no effect: the temperature is 0"),
        "{err}"
    );
    // the values that mean off change nothing, greedy or not: no warning
    let off = [
        "--model", m, "--device", "cpu", "--top-k", "-1", "--top-p", "1", "--min-p", "0",
    ];
    let out = chat(&off, "");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("no effect"), "{err}");
    let out = chat(
        &[
            "--model",
            m,
            "--device",
            "cpu",
            "--top-k",
            "5",
            "--temperature",
            "0.7",
        ],
        "",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("no effect"), "{err}");
}

/// A second SIGINT within 2 s of the one that stopped an answer ends a piped chat (status 130),
/// instead of stopping its lines one answer at a time.
#[test]
fn a_second_ctrl_c_quits_a_piped_chat() {
    use std::io::Read;
    let (child, mut stdin, mut stdout) = long_answers_chat();
    for _ in 0..20 {
        stdin.write_all(b"Tell me a long story\n").unwrap();
    }
    drop(stdin);
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).unwrap();
    sigint(&child);
    std::thread::sleep(std::time::Duration::from_millis(300));
    sigint(&child);
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    let answers = stderr.lines().filter(|l| l.starts_with("[prompt")).count();
    assert!(answers <= 2, "{answers} answers after two Ctrl-C: {stderr}");
}
