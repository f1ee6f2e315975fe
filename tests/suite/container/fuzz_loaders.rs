//! A bounded, seeded fuzz of every file parser the loaders run: thousands of mutations (bit flips,
//! truncations, splices, numeric edge values, hostile strings, dropped and duplicated keys) of
//! valid safetensors headers, container metadata and stamps, `config.json`,
//! `generation_config.json`, `model.safetensors.index.json` and `tokenizer.json`, each loaded as
//! `generate` and `info` load them (CPU side only). Zero panics; every refusal must be an error
//! naming a file of the model directory. The seed and the count are printed;
//! `INKLING_FUZZ_SEED=S INKLING_FUZZ_COUNT=N` replays or widens a run.
use crate::model_common::*;
use inkling_wgpu::container::{convert, Container, ConvertOptions};
use inkling_wgpu::model::text::load_tokenizer;
use inkling_wgpu::model::{Checkpoint, Weights};
use serde_json::Value;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// splitmix64: deterministic and good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
}

/// How a target's file is laid out, which decides the structured mutations.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Json,
    /// A safetensors file: mutate its header (and, for containers, the JSON inside `__metadata__`).
    Safetensors,
}

struct Target {
    name: &'static str,
    dir: PathBuf,
    file: PathBuf,
    original: Vec<u8>,
    kind: Kind,
}

/// Numbers that break casts and arithmetic.
fn edge_number(rng: &mut Rng) -> Value {
    let v: Vec<Value> = vec![
        0.into(),
        1.into(),
        (-1).into(),
        2.into(),
        4_294_967_295u64.into(),
        4_294_967_296u64.into(),
        4_294_967_307u64.into(),
        (1u64 << 53).into(),
        u64::MAX.into(),
        i64::MIN.into(),
        1.5.into(),
        (-0.0).into(),
        1e300.into(),
        3.5e38.into(),
        1e-45.into(),
        Value::Null,
        "7".into(),
    ];
    rng.pick(&v).clone()
}

/// Strings that break names and paths.
fn edge_string(rng: &mut Rng) -> Value {
    let v = [
        "",
        ".",
        "..",
        "../x.safetensors",
        "/etc/hostname",
        "sub/model.safetensors",
        "F64",
        "U8",
        "int5",
        "int4-g64",
        "bf16",
        "{}",
        "[1,2]",
        "{\"a\":[1,2]}",
        "\u{0}",
        "hybrid",
        "sparse",
        "é✓😀",
    ];
    Value::String(rng.pick(&v).to_string())
}

/// JSON pointers of every node under `v`.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                pointers(c, p, out);
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                pointers(c, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
    out.push(at);
}

/// One structured edit of a JSON value: a node becomes an edge number or string, is dropped, or is
/// replaced by another node's value; string nodes that hold JSON (container metadata) are edited
/// inside.
fn mutate_value(rng: &mut Rng, v: &mut Value) {
    let mut ps = Vec::new();
    pointers(v, String::new(), &mut ps);
    let p = rng.pick(&ps).clone();
    let q = rng.pick(&ps).clone();
    let other = v.pointer(&q).cloned().unwrap_or(Value::Null);
    let Some(node) = v.pointer_mut(&p) else {
        return;
    };
    if let Value::String(s) = node {
        if let Ok(mut inner) = serde_json::from_str::<Value>(s) {
            if inner.is_object() || inner.is_array() {
                mutate_value(rng, &mut inner);
                *s = inner.to_string();
                return;
            }
        }
    }
    match rng.below(5) {
        0 | 1 => *node = edge_number(rng),
        2 => *node = edge_string(rng),
        3 => *node = other,
        _ => {
            // drop it from its parent
            if let Some((parent, key)) = p.rsplit_once('/') {
                match v.pointer_mut(parent) {
                    Some(Value::Object(m)) => {
                        m.remove(&key.replace("~1", "/").replace("~0", "~"));
                    }
                    Some(Value::Array(a)) => {
                        if let Ok(i) = key.parse::<usize>() {
                            if i < a.len() {
                                a.remove(i);
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

/// Raw byte mutations inside `region` of `b` (bit flips, a truncation, a splice, a duplicated
/// span).
fn mutate_bytes(rng: &mut Rng, b: &mut Vec<u8>, region: std::ops::Range<usize>) {
    let lo = region.start.min(b.len());
    let hi = region.end.min(b.len()).max(lo + 1).min(b.len());
    if hi <= lo {
        b.truncate(rng.below(b.len() + 1));
        return;
    }
    let at = |rng: &mut Rng| lo + rng.below(hi - lo);
    match rng.below(4) {
        0 => {
            for _ in 0..1 + rng.below(4) {
                let i = at(rng);
                b[i] ^= 1 << rng.below(8);
            }
        }
        1 => {
            let n = at(rng);
            b.truncate(n);
        }
        2 => {
            // splice: copy a span over another place
            let (s, d) = (at(rng), at(rng));
            let len = rng.below(64).min(hi - s).min(b.len() - d);
            let span = b[s..s + len].to_vec();
            b[d..d + len].copy_from_slice(&span);
        }
        _ => {
            // insert a copy of a span (shifts everything after it)
            let s = at(rng);
            let len = rng.below(32).min(hi - s);
            let span = b[s..s + len].to_vec();
            let d = at(rng);
            b.splice(d..d, span);
        }
    }
}

/// (header JSON, data bytes) of a safetensors file, if it parses.
fn split_safetensors(b: &[u8]) -> Option<(Value, &[u8], usize)> {
    let n = u64::from_le_bytes(b.get(..8)?.try_into().ok()?) as usize;
    let h = serde_json::from_slice(b.get(8..8 + n)?).ok()?;
    Some((h, &b[8 + n..], n))
}

/// One mutation of a target's original bytes.
fn mutate(rng: &mut Rng, t: &Target) -> Vec<u8> {
    let mut b = t.original.clone();
    match (t.kind, rng.below(3)) {
        (Kind::Json, 0) => {
            let len = b.len();
            mutate_bytes(rng, &mut b, 0..len);
        }
        (Kind::Json, _) => {
            let mut v: Value = serde_json::from_slice(&b).expect("a valid original");
            for _ in 0..1 + rng.below(3) {
                mutate_value(rng, &mut v);
            }
            b = serde_json::to_vec(&v).unwrap();
        }
        (Kind::Safetensors, 0) => {
            // raw: the length prefix and the header (data flips are not parsed)
            let n = split_safetensors(&b).map_or(b.len(), |(_, _, n)| 8 + n);
            mutate_bytes(rng, &mut b, 0..n);
        }
        (Kind::Safetensors, _) => {
            let (mut h, data, n) = split_safetensors(&b).expect("a valid original");
            for _ in 0..1 + rng.below(3) {
                mutate_value(rng, &mut h);
            }
            let mut text = h.to_string().into_bytes();
            // keep the data start where it was when the header fits (containers align it)
            if text.len() < n {
                text.resize(n, b' ');
            }
            let mut out = (text.len() as u64).to_le_bytes().to_vec();
            out.extend_from_slice(&text);
            out.extend_from_slice(data);
            b = out;
        }
    }
    b
}

/// Load `dir` as `generate --device cpu` and `info` do; `Err` with the message on a refusal.
fn load(dir: &Path) -> Result<(), String> {
    let info = Container::open(dir).map(|_| ()).map_err(|e| e.to_string());
    let ck = Checkpoint::open(dir).map_err(|e| e.to_string())?;
    Weights::load(&ck).map_err(|e| e.to_string())?;
    let tok = load_tokenizer(dir).map_err(|e| e.to_string())?;
    if let Some(t) = tok {
        // a tokenizer that loads must also encode and decode
        let ids = t
            .encode("Once upon a time", false)
            .map_err(|e| format!("{}: encoding: {e}", dir.display()))?;
        t.decode(ids.get_ids(), false)
            .map_err(|e| format!("{}: decoding: {e}", dir.display()))?;
    }
    info
}

/// A scratch copy of fixture `name` (files symlinked, `mutated` copied) and the target on it.
fn target(name: &'static str, fixture_dir: &Path, mutated: &str, kind: Kind) -> Target {
    let dir = scratch(&format!("fuzz-{name}"));
    for e in std::fs::read_dir(fixture_dir).unwrap() {
        let e = e.unwrap();
        let fname = e.file_name();
        if fname == "inkling-wgpu.usage.json" {
            continue;
        }
        if fname == mutated {
            std::fs::copy(e.path(), dir.join(&fname)).unwrap();
        } else {
            std::os::unix::fs::symlink(e.path(), dir.join(&fname)).unwrap();
        }
    }
    let file = dir.join(mutated);
    let original = std::fs::read(&file).unwrap();
    Target {
        name,
        dir,
        file,
        original,
        kind,
    }
}

#[test]
fn every_parser_survives_seeded_mutations_without_a_panic() {
    let seed: u64 = std::env::var("INKLING_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x1_2c0f_fee5);
    let count: usize = std::env::var("INKLING_FUZZ_COUNT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    let small = fixture("tiny-router-extremes");
    let sharded = fixture("tiny-causal-bf16-sharded");
    let container = scratch("fuzz-container-src").join("c");
    convert(&small, &container, &ConvertOptions::default()).unwrap();
    let targets = [
        target("config", &small, "config.json", Kind::Json),
        target("generation", &small, "generation_config.json", Kind::Json),
        target("tokenizer", &small, "tokenizer.json", Kind::Json),
        target(
            "safetensors",
            &small,
            "model.safetensors",
            Kind::Safetensors,
        ),
        target(
            "index",
            &sharded,
            "model.safetensors.index.json",
            Kind::Json,
        ),
        target(
            "container",
            &container,
            "model.safetensors",
            Kind::Safetensors,
        ),
    ];
    for t in &targets {
        load(&t.dir).unwrap_or_else(|e| panic!("{}: the unmutated copy fails: {e}", t.name));
    }
    println!(
        "fuzz: seed {seed}, {count} mutations for each of {} targets ({} loads); replay with \
         INKLING_FUZZ_SEED={seed} INKLING_FUZZ_COUNT={count}",
        targets.len(),
        count * targets.len()
    );
    let mut rng = Rng(seed);
    let mut failures = Vec::new();
    let (mut refused, mut loaded) = (0usize, 0usize);
    for i in 0..count {
        for t in &targets {
            let bytes = mutate(&mut rng, t);
            std::fs::write(&t.file, &bytes).unwrap();
            match catch_unwind(AssertUnwindSafe(|| load(&t.dir))) {
                Ok(Ok(())) => loaded += 1,
                Ok(Err(msg)) => {
                    refused += 1;
                    if !msg.contains(&t.dir.display().to_string()) {
                        failures.push(format!(
                            "{} #{i}: the error names no file of the model: {msg}",
                            t.name
                        ));
                    }
                }
                Err(p) => {
                    let why = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    let keep = t.dir.join(format!("panic-{i}"));
                    std::fs::write(&keep, &bytes).unwrap();
                    failures.push(format!(
                        "{} #{i}: PANIC {why} (input kept at {})",
                        t.name,
                        keep.display()
                    ));
                }
            }
        }
    }
    println!("fuzz: {refused} refused with an error, {loaded} loaded");
    assert!(
        failures.is_empty(),
        "seed {seed}: {} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(refused > count, "the mutations hardly ever broke anything");
}
