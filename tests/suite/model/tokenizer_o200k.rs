//! The real o200k-family tokenizer (gpt-oss `tokenizer.json`, gzip'd fixture) through the
//! tokenizers crate: exact encode/decode against Python tokenizers, and UTF-8-safe streaming.
use flate2::read::GzDecoder;
use inkling_wgpu::model::text::TextStream;
use std::io::Read;
use std::path::PathBuf;
use tokenizers::Tokenizer;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer-o200k")
}

fn o200k() -> Tokenizer {
    let gz = std::fs::read(dir().join("tokenizer.json.gz")).unwrap();
    let mut json = Vec::new();
    GzDecoder::new(&gz[..]).read_to_end(&mut json).unwrap();
    assert_eq!(
        json.len(),
        27_868_174,
        "decompressed size of the npm tokenizer.json"
    );
    Tokenizer::from_bytes(&json).unwrap()
}

struct Case {
    text: String,
    ids: Vec<u32>,
    decoded: String,
    splits: bool,
}

fn cases() -> Vec<Case> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("roundtrip.json")).unwrap())
            .unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            text: c["text"].as_str().unwrap().into(),
            ids: c["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect(),
            decoded: c["decoded"].as_str().unwrap().into(),
            splits: c["per_token_decode_splits_multibyte"].as_bool().unwrap(),
        })
        .collect()
}

#[test]
fn o200k_roundtrip_and_streaming() {
    let tok = o200k();
    let cases = cases();
    assert!(cases.len() >= 16);
    assert!(
        cases.iter().any(|c| c.splits),
        "fixture has texts where one token splits a character"
    );
    for c in &cases {
        let enc = tok.encode(c.text.as_str(), false).unwrap();
        assert_eq!(enc.get_ids(), &c.ids[..], "encode {:?}", c.text);
        let full = tok.decode(&c.ids, false).unwrap();
        assert_eq!(full, c.decoded, "decode {:?}", c.text);

        // Streamed token by token: concatenation equals the full decode, and no piece ever
        // contains a replacement character when the text has none.
        let mut s = TextStream::new(&tok);
        let mut out = String::new();
        for &id in &c.ids {
            let piece = s.step(id).unwrap();
            if !c.decoded.contains('\u{FFFD}') {
                assert!(
                    !piece.contains('\u{FFFD}'),
                    "piece {piece:?} of {:?}",
                    c.text
                );
            }
            out.push_str(&piece);
        }
        assert_eq!(out, c.decoded, "streamed {:?}", c.text);

        // Stopping after every prefix (including mid-character) does not crash, and what was
        // emitted so far is a prefix of the full text.
        for stop in 0..c.ids.len() {
            let mut s = TextStream::new(&tok);
            let mut out = String::new();
            for &id in &c.ids[..stop] {
                out.push_str(&s.step(id).unwrap());
            }
            assert!(
                c.decoded.starts_with(&out),
                "prefix {stop} of {:?}: {out:?}",
                c.text
            );
            // finish() flushes the (lossy) tail: the total is exactly the full decode of the prefix.
            out.push_str(&s.finish().unwrap());
            assert_eq!(out, tok.decode(&c.ids[..stop], false).unwrap());
        }
        if c.splits {
            // Some single token of this text decodes alone to U+FFFD, yet the stream never emits it.
            assert!(c
                .ids
                .iter()
                .any(|&id| tok.decode(&[id], false).unwrap().contains('\u{FFFD}')));
        }
    }
}

#[test]
fn small_bpe_fixture_tokenizers_roundtrip() {
    for name in [
        "tiny-causal-f32",
        "tiny-mm-bf16",
        "tiny-causal-bf16-sharded",
    ] {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        let tok = inkling_wgpu::model::text::load_tokenizer(&d)
            .unwrap()
            .unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.join("reference.json")).unwrap())
                .unwrap();
        for r in v["tokenizer_roundtrip"].as_array().unwrap() {
            let ids: Vec<u32> = r["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            assert_eq!(
                tok.encode(r["text"].as_str().unwrap(), false)
                    .unwrap()
                    .get_ids(),
                &ids[..]
            );
            assert_eq!(
                tok.decode(&ids, false).unwrap(),
                r["decoded"].as_str().unwrap()
            );
        }
        for c in v["cases"].as_array().unwrap() {
            let ids: Vec<u32> = c["prompt_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            assert_eq!(
                tok.encode(c["prompt_text"].as_str().unwrap(), false)
                    .unwrap()
                    .get_ids(),
                &ids[..],
                "{name}"
            );
        }
        // The tokenizer's own EOS (<|eos|> = 2) is found through tokenizer_config.json.
        let eos = inkling_wgpu::model::text::tokenizer_eos_ids(&d, &tok);
        assert_eq!(eos, vec![2], "{name}: tokenizer eos");
    }
}

/// The crate's regex backend (fancy-regex, pure Rust) encodes a varied corpus exactly as Python
/// `tokenizers` (Oniguruma) does: `corpus.json` from `tools/make_o200k_corpus.py`.
#[test]
fn o200k_pure_rust_regex_matches_oniguruma_on_corpus() {
    let tok = o200k();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("corpus.json")).unwrap()).unwrap();
    let cases = v.as_array().unwrap();
    assert!(cases.len() >= 80);
    let mut n_ids = 0;
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let want: Vec<u32> = c["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        n_ids += want.len();
        let got = tok.encode(text, false).unwrap();
        assert_eq!(got.get_ids(), &want[..], "encode {text:?}");
    }
    assert!(n_ids > 10_000, "{n_ids} ids");
}
