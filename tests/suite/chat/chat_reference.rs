//! `chat` against an outside reference: the two-turn conversation of
//! `tests/fixtures/tiny-chat-f32/chat_reference.json` (transformers 5.24.0 on prompt ids rendered
//! from the TMLv0 grammar by `tools/chat_reference.py`), typed into `chat` through stdin.
use crate::chat_common::{chat_model, chat_reference, json_ids};
use inkling_wgpu::chat::parse::{split_turn, Block, OutputParser, Piece};
use std::io::Write;
use std::process::{Command, Stdio};

/// On the CPU and the GPU device, `chat --show-thinking` (default effort high = 0.9) prints
/// transformers' thinking block and text for each turn, and its stats lines give transformers'
/// generated token counts and the conversation length after each turn (prompt + answer + the
/// two ids that close a turn cut by max_tokens). The engine's own renderer also produces the
/// reference's prompt ids and splits its continuations into the same thinking and text.
#[test]
fn chat_reproduces_the_transformers_conversation_with_thinking() {
    let g = chat_reference();
    let turns = g["chat"].as_array().unwrap();
    let max = g["max_tokens"].as_u64().unwrap().to_string();
    let msgs: Vec<&str> = g["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert!(
        !turns[0]["thinking"].as_str().unwrap().is_empty(),
        "the reference has a thinking block"
    );

    // the engine's renderer and parser on the reference's ids
    let (tok, r) = crate::chat_common::tokenizer_and_renderer();
    let eff = Some(inkling_wgpu::chat::Effort::parse(g["effort"].as_str().unwrap()).unwrap());
    let first = r
        .render_for_generation(
            &[inkling_wgpu::chat::Message::new(
                inkling_wgpu::chat::Role::User,
                msgs[0],
            )],
            eff,
        )
        .unwrap();
    assert_eq!(
        first,
        json_ids(&turns[0]["prompt_ids"]),
        "rendered first prompt"
    );
    for (n, t) in turns.iter().enumerate() {
        let ids = json_ids(&t["generated_ids"]);
        let (thinking, text) = split_turn(&tok, r.specials(), false, &ids).unwrap();
        assert_eq!(
            thinking,
            t["thinking"].as_str().unwrap(),
            "turn {n} thinking"
        );
        assert_eq!(text, t["text"].as_str().unwrap(), "turn {n} text");
    }

    // what `chat --show-thinking` prints, in the order the blocks come (text outside any block
    // is answer text, possibly before a thinking block), for the reference's ids
    let mut want = String::new();
    for t in turns {
        let mut p = OutputParser::new(&tok, r.specials(), false);
        let mut in_thinking = false;
        let mut pieces: Vec<Piece> = Vec::new();
        for id in json_ids(&t["generated_ids"]) {
            pieces.extend(p.push(id).unwrap());
        }
        pieces.extend(p.finish().unwrap());
        for pc in pieces {
            match (pc.block, in_thinking) {
                (Block::Thinking, false) => want.push_str("[thinking]\n"),
                (Block::Text, true) => want.push_str("\n[/thinking]\n"),
                _ => {}
            }
            in_thinking = pc.block == Block::Thinking;
            want.push_str(&pc.text);
        }
        if in_thinking {
            want.push_str("\n[/thinking]\n");
        }
        want.push('\n');
    }
    // resident on the CPU and the GPU, and streamed through one and two expert slots (the usage
    // file off: nothing is written into the fixture)
    let runs: [(&str, &[&str]); 4] = [
        ("cpu", &["--device", "cpu"]),
        ("gpu", &["--device", "gpu"]),
        (
            "gpu, 1 expert slot",
            &[
                "--device",
                "gpu",
                "--expert-slots",
                "1",
                "--usage-file",
                "off",
            ],
        ),
        (
            "gpu, 2 expert slots",
            &[
                "--device",
                "gpu",
                "--expert-slots",
                "2",
                "--usage-file",
                "off",
            ],
        ),
    ];
    for (device, flags) in runs {
        let mut child = Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
            .arg("chat")
            .arg("--model")
            .arg(chat_model())
            .args(["--show-thinking", "--max-tokens", &max])
            .args(flags)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let input = format!("{}\n{}\n", msgs[0], msgs[1]);
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{device}: {stderr}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            want,
            "{device}: chat output vs transformers"
        );
        let stats: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("[prompt "))
            .collect();
        assert_eq!(stats.len(), turns.len(), "{device}: {stderr}");
        for (n, (line, t)) in stats.iter().zip(turns).enumerate() {
            let gen = t["generated_ids"].as_array().unwrap().len();
            let close = if t["finish"] == "eos" { 0 } else { 2 };
            let ctx = t["prompt_ids"].as_array().unwrap().len() + gen + close;
            assert!(
                line.contains(&format!(" | {gen} tok ")),
                "{device} turn {n}: {gen} generated tokens: {line}"
            );
            assert!(
                line.contains(&format!(" | context {ctx}/")),
                "{device} turn {n}: the conversation holds {ctx} ids: {line}"
            );
            // a streamed run says how streaming went; a resident one says nothing of it
            assert_eq!(
                line.contains(" | experts hit ") && line.contains(" GB read"),
                device.contains("slot"),
                "{device} turn {n}: {line}"
            );
        }
    }
}
