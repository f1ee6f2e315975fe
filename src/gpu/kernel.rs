//! What every WGSL kernel family states about its pipelines ([`Kernel`]: a typed key whose
//! `Display` is the pipeline label, the WGSL, the entry point, the bind layout and the `#[repr(C)]`
//! uniform struct), the one pipeline builder ([`pipeline`]) and its cache ([`PipelineCache`]), and
//! the WGSL preprocessor. Imports no kernel family.

use crate::gpu::Gpu;
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex, OnceLock};

/// How a kernel binding is declared in its bind-group layout (group 0, compute stage).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bind {
    /// `var<uniform>`.
    Uniform,
    /// `var<storage, read>`.
    Read,
    /// `var<storage, read_write>`.
    Write,
}

/// A kernel family's pipeline key: a value names one compiled pipeline (entry point and every
/// flag that changes the WGSL), and its `Display` is the pipeline label (unique across families).
///
/// A new family implements this on a `#[derive(Clone, PartialEq, Eq, Hash)]` struct, declares its
/// uniform as `Params` (`#[repr(C)]`, `bytemuck::Pod`, the WGSL `Params` field for field) and
/// builds its dispatches with [`crate::gpu::call::Dispatch::new`], which takes exactly that type.
pub trait Kernel: Clone + Eq + Hash + fmt::Display + Send + Sync + 'static {
    /// The uniform bound at binding 0: the twin of the WGSL `Params` struct.
    type Params: bytemuck::Pod;
    /// WGSL entry point.
    fn entry(&self) -> &'static str;
    /// The explicit bind-group layout (group 0).
    fn bindings(&self) -> Vec<(u32, Bind)>;
    /// The WGSL after preprocessing.
    fn source(&self) -> String;
    /// Whether the WGSL uses subgroup operations (needs the `SUBGROUP` feature).
    fn subgroups(&self) -> bool {
        false
    }
}

/// A pipeline as data (any family): what `inkling-wgpu shaders` writes, what the translation
/// tests compile and what [`crate::gpu::variants`] lists. Made from a key by [`KernelSpec::of`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSpec {
    /// The pipeline label (the key's `Display`).
    pub key: String,
    pub entry: String,
    pub binds: Vec<(u32, Bind)>,
    pub source: String,
    /// Whether the WGSL uses subgroup operations (needs the `SUBGROUP` feature).
    pub subgroups: bool,
}

impl KernelSpec {
    /// The spec of pipeline `k`.
    pub fn of<K: Kernel>(k: &K) -> KernelSpec {
        KernelSpec {
            key: k.to_string(),
            entry: k.entry().to_string(),
            binds: k.bindings(),
            source: k.source(),
            subgroups: k.subgroups(),
        }
    }

    /// Storage-buffer bindings (read-only and read-write) in the layout.
    pub fn storage_buffers(&self) -> u32 {
        self.binds.iter().filter(|b| b.1 != Bind::Uniform).count() as u32
    }

    /// Uniform-buffer bindings in the layout.
    pub fn uniform_buffers(&self) -> u32 {
        self.binds.iter().filter(|b| b.1 == Bind::Uniform).count() as u32
    }
}

/// Values built once per typed key, whatever the key's type: one map per key type, one cell per
/// key. Two threads asking for the same key get the same value, built once; different keys build
/// in parallel.
pub struct OnceCache<V> {
    families: Mutex<HashMap<TypeId, Box<dyn Any + Send + Sync>>>,
    _v: std::marker::PhantomData<fn() -> V>,
}

impl<V> Default for OnceCache<V> {
    fn default() -> Self {
        OnceCache {
            families: Mutex::new(HashMap::new()),
            _v: std::marker::PhantomData,
        }
    }
}

type Cells<K, V> = HashMap<K, Arc<OnceLock<Arc<V>>>>;

impl<V: Send + Sync + 'static> OnceCache<V> {
    /// The value of `key`, built by `make` on first use.
    pub fn get_or_build<K>(&self, key: &K, make: impl FnOnce() -> V) -> Arc<V>
    where
        K: Clone + Eq + Hash + Send + Sync + 'static,
    {
        let cell = {
            let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
            let cells = families
                .entry(TypeId::of::<K>())
                .or_insert_with(|| Box::new(Cells::<K, V>::new()))
                .downcast_mut::<Cells<K, V>>()
                .expect("one map type per key type");
            cells.entry(key.clone()).or_default().clone()
        };
        cell.get_or_init(|| Arc::new(make())).clone()
    }

    /// The keys of type `K` asked for so far (built or being built), in no particular order.
    pub fn keys<K>(&self) -> Vec<K>
    where
        K: Clone + Eq + Hash + Send + Sync + 'static,
    {
        let families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        families
            .get(&TypeId::of::<K>())
            .and_then(|f| f.downcast_ref::<Cells<K, V>>())
            .map_or(vec![], |cells| cells.keys().cloned().collect())
    }
}

/// Compiled compute pipelines, keyed by each family's typed key (on [`Gpu::cache`]).
pub type PipelineCache = OnceCache<wgpu::ComputePipeline>;

/// The pipeline of `k` with its explicit layout, built on first use and cached on the device
/// (each build counted in [`Gpu::compiles`]).
pub fn pipeline<K: Kernel>(gpu: &Gpu, k: &K) -> Arc<wgpu::ComputePipeline> {
    gpu.cache.get_or_build(k, || {
        let t0 = std::time::Instant::now();
        let p = build(gpu, &KernelSpec::of(k));
        gpu.compiles.add(t0.elapsed());
        p
    })
}

/// Pipelines a device has built and the seconds it spent building them (shader translation and
/// the driver's compilation; a pipeline found in the driver's cache is counted too, faster).
#[derive(Debug, Default)]
pub struct CompileCounter {
    count: std::sync::atomic::AtomicU64,
    nanos: std::sync::atomic::AtomicU64,
}

/// A reading of a [`CompileCounter`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Compiles {
    /// Pipelines built.
    pub count: u64,
    /// Seconds spent building them.
    pub seconds: f64,
}

impl Compiles {
    /// What was built between `earlier` and `self`.
    pub fn since(self, earlier: Compiles) -> Compiles {
        Compiles {
            count: self.count - earlier.count,
            seconds: self.seconds - earlier.seconds,
        }
    }
}

impl CompileCounter {
    fn add(&self, dt: std::time::Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        self.count.fetch_add(1, Relaxed);
        self.nanos.fetch_add(dt.as_nanos() as u64, Relaxed);
    }

    /// The totals so far.
    pub fn read(&self) -> Compiles {
        use std::sync::atomic::Ordering::Relaxed;
        Compiles {
            count: self.count.load(Relaxed),
            seconds: self.nanos.load(Relaxed) as f64 * 1e-9,
        }
    }
}

/// Compile `spec` with its explicit bind-group layout (uncached).
fn build(gpu: &Gpu, spec: &KernelSpec) -> wgpu::ComputePipeline {
    let entries: Vec<wgpu::BindGroupLayoutEntry> = spec
        .binds
        .iter()
        .map(|&(binding, b)| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: match b {
                    Bind::Uniform => wgpu::BufferBindingType::Uniform,
                    Bind::Read | Bind::Write => wgpu::BufferBindingType::Storage {
                        read_only: b == Bind::Read,
                    },
                },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        })
        .collect();
    let key = spec.key.as_str();
    let bgl = gpu
        .device
        .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(key),
            entries: &entries,
        });
    let layout = gpu
        .device
        .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(key),
            bind_group_layouts: &[Some(&bgl)],
            immediate_size: 0,
        });
    let module = gpu.shader(key, &spec.source);
    gpu.device
        .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(key),
            layout: Some(&layout),
            module: &module,
            entry_point: Some(&spec.entry),
            compilation_options: Default::default(),
            cache: None,
        })
}

/// The WGSL preprocessor of every kernel family: [`preprocess_with`] with boolean flags only.
pub fn preprocess(src: &str, flags: &[(&str, bool)]) -> String {
    preprocess_with(src, flags, &[])
}

/// Expand the directives of a WGSL skeleton. `flags` and `values` name the integers the
/// directives see (a flag is 1 or 0); the blocks a directive opens may nest:
///
/// * `//!IF cond` … [`//!ELSE` …] `//!END`: the lines of the branch `cond` selects. `cond` is an
///   expression over integers and names: a bare flag name, `!`, `* / % + -`, comparisons
///   (`== != < <= > >=`), `&&`, `||` and parentheses (C precedence; true is non-zero).
/// * `//!FOR i IN a..b` … `//!END FOR`: the block once per `i` from `a` to `b - 1` (expressions),
///   with `i` bound inside it.
/// * `//!EACH name=array …` … `//!END EACH`: the block once per pair, with `NAME` and `ARRAY`
///   bound to the two words (one WGSL function per storage array, written once).
/// * `//!DEFINE name(p, …)` … `//!END DEFINE`: a named block, written nowhere; `//!INSERT
///   name(e, …)` writes it there with each parameter bound to its argument's value: an
///   expression, or a word written in double quotes (`"k0 + 128u"`; no comma inside).
///
/// In every written line `$name` (the longest identifier after the `$`) is replaced by the value
/// of a bound name and `${expr}` by the value of an expression, so `a${r}_${q}` names one
/// accumulator of a loop over `r` and `q` and `${8 * o + j}u` is a WGSL literal. Panics on an
/// unknown name or directive, a malformed expression or unbalanced blocks (a bug in the
/// skeleton, caught by the WGSL validation tests).
pub fn preprocess_with(src: &str, flags: &[(&str, bool)], values: &[(&str, i64)]) -> String {
    let mut lines = src.lines();
    let (nodes, end) = parse_block(&mut lines);
    assert!(end.is_none(), "WGSL: {} outside a block", end.unwrap_or(""));
    let mut env = Env {
        vars: flags
            .iter()
            .map(|&(n, b)| (n.to_string(), Value::Int(b as i64)))
            .chain(values.iter().map(|&(n, v)| (n.to_string(), Value::Int(v))))
            .collect(),
        defines: HashMap::new(),
    };
    let mut out = String::with_capacity(src.len());
    expand(&nodes, &mut env, &mut out);
    out
}

/// One parsed piece of a skeleton.
enum Node<'s> {
    /// A WGSL line, written with its `$` substitutions.
    Line(&'s str),
    /// Condition, its branch, the `//!ELSE` branch.
    If(&'s str, Vec<Node<'s>>, Vec<Node<'s>>),
    /// Index name, first and end expressions, body.
    For(&'s str, &'s str, &'s str, Vec<Node<'s>>),
    /// `(name, array)` pairs, body.
    Each(Vec<(&'s str, &'s str)>, Vec<Node<'s>>),
    /// Block name, parameters, body.
    Define(&'s str, Vec<&'s str>, Vec<Node<'s>>),
    /// Block name, arguments.
    Insert(&'s str, Vec<&'s str>),
}

/// A bound name's value: an integer, or a word (of `//!EACH`, or a quoted `//!INSERT` argument).
#[derive(Clone)]
enum Value {
    Int(i64),
    Word(String),
}

struct Env<'n, 's> {
    /// Bound names, innermost last.
    vars: Vec<(String, Value)>,
    /// `//!DEFINE` blocks seen so far: parameters and body.
    defines: HashMap<&'s str, (&'n [&'s str], &'n [Node<'s>])>,
}

impl Env<'_, '_> {
    fn get(&self, name: &str) -> &Value {
        self.vars
            .iter()
            .rev()
            .find(|v| v.0 == name)
            .map(|v| &v.1)
            .unwrap_or_else(|| panic!("WGSL: unknown name {name}"))
    }

    fn int(&self, name: &str) -> i64 {
        match self.get(name) {
            Value::Int(v) => *v,
            Value::Word(w) => panic!("WGSL: {name} = {w} is a word, not an integer"),
        }
    }
}

/// `name(a, b)` as `("name", ["a", "b"])`.
fn call_syntax(s: &str) -> (&str, Vec<&str>) {
    let (name, rest) = s
        .split_once('(')
        .unwrap_or_else(|| panic!("WGSL: {s} is not name(…)"));
    let args = rest
        .trim_end()
        .strip_suffix(')')
        .unwrap_or_else(|| panic!("WGSL: {s} lacks its closing parenthesis"));
    let args = args
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    (name.trim(), args)
}

/// Parse lines up to the `//!ELSE` / `//!END…` line that ends the current block (returned with
/// the nodes; `None` at the end of the source).
fn parse_block<'s>(lines: &mut std::str::Lines<'s>) -> (Vec<Node<'s>>, Option<&'s str>) {
    let mut nodes = Vec::new();
    while let Some(line) = lines.next() {
        let l = line.trim();
        let Some(d) = l.strip_prefix("//!") else {
            nodes.push(Node::Line(line));
            continue;
        };
        if let Some(cond) = d.strip_prefix("IF ") {
            let (then, end) = parse_block(lines);
            let els = match end {
                Some("//!ELSE") => body(lines, l, "//!END"),
                Some("//!END") => Vec::new(),
                _ => panic!("WGSL: {l} closed by {end:?}"),
            };
            nodes.push(Node::If(cond.trim(), then, els));
        } else if let Some(spec) = d.strip_prefix("FOR ") {
            let (var, range) = spec
                .split_once(" IN ")
                .unwrap_or_else(|| panic!("WGSL: {l} is not //!FOR i IN a..b"));
            let (a, b) = range
                .split_once("..")
                .unwrap_or_else(|| panic!("WGSL: {l} is not //!FOR i IN a..b"));
            nodes.push(Node::For(
                var.trim(),
                a.trim(),
                b.trim(),
                body(lines, l, "//!END FOR"),
            ));
        } else if let Some(list) = d.strip_prefix("EACH ") {
            let pairs = list
                .split_whitespace()
                .map(|p| {
                    p.split_once('=')
                        .unwrap_or_else(|| panic!("WGSL: //!EACH item {p} is not name=array"))
                })
                .collect();
            nodes.push(Node::Each(pairs, body(lines, l, "//!END EACH")));
        } else if let Some(sig) = d.strip_prefix("DEFINE ") {
            let (name, params) = call_syntax(sig);
            nodes.push(Node::Define(name, params, body(lines, l, "//!END DEFINE")));
        } else if let Some(call) = d.strip_prefix("INSERT ") {
            let (name, args) = call_syntax(call);
            nodes.push(Node::Insert(name, args));
        } else if d == "ELSE" || d.starts_with("END") {
            return (nodes, Some(l));
        } else {
            panic!("WGSL: unknown directive {l}");
        }
    }
    (nodes, None)
}

/// The block that `open` starts, closed by the line `close`.
fn body<'s>(lines: &mut std::str::Lines<'s>, open: &str, close: &str) -> Vec<Node<'s>> {
    let (b, end) = parse_block(lines);
    assert_eq!(end, Some(close), "WGSL: {open} closed by {end:?}");
    b
}

/// Write `nodes` under `env`.
fn expand<'n, 's>(nodes: &'n [Node<'s>], env: &mut Env<'n, 's>, out: &mut String) {
    for node in nodes {
        match node {
            Node::Line(line) => {
                if line.contains('$') {
                    out.push_str(&substitute(line, env));
                } else {
                    out.push_str(line);
                }
                out.push('\n');
            }
            Node::If(cond, then, els) => {
                let branch = if eval(cond, env) != 0 { then } else { els };
                expand(branch, env, out);
            }
            Node::For(var, a, b, body) => {
                for i in eval(a, env)..eval(b, env) {
                    env.vars.push((var.to_string(), Value::Int(i)));
                    expand(body, env, out);
                    env.vars.pop();
                }
            }
            Node::Each(pairs, body) => {
                for &(name, array) in pairs {
                    env.vars.push(("NAME".into(), Value::Word(name.into())));
                    env.vars.push(("ARRAY".into(), Value::Word(array.into())));
                    expand(body, env, out);
                    env.vars.truncate(env.vars.len() - 2);
                }
            }
            Node::Define(name, params, body) => {
                env.defines.insert(name, (&params[..], &body[..]));
            }
            Node::Insert(name, args) => {
                let (params, body) = *env
                    .defines
                    .get(name)
                    .unwrap_or_else(|| panic!("WGSL: //!INSERT of undefined {name}"));
                assert_eq!(
                    params.len(),
                    args.len(),
                    "WGSL: //!INSERT {name} takes {} arguments",
                    params.len()
                );
                let values: Vec<Value> = args
                    .iter()
                    .map(
                        |a| match a.strip_prefix('"').and_then(|a| a.strip_suffix('"')) {
                            Some(word) => Value::Word(word.to_string()),
                            None => Value::Int(eval(a, env)),
                        },
                    )
                    .collect();
                let n = env.vars.len();
                for (p, v) in params.iter().zip(values) {
                    env.vars.push((p.to_string(), v));
                }
                expand(body, env, out);
                env.vars.truncate(n);
            }
        }
    }
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// `line` with every `$name` and `${expr}` replaced by its value.
fn substitute(line: &str, env: &Env) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(inner) = after.strip_prefix('{') {
            let close = inner
                .find('}')
                .unwrap_or_else(|| panic!("WGSL: unclosed ${{ in {line}"));
            out.push_str(&eval(&inner[..close], env).to_string());
            rest = &inner[close + 1..];
        } else {
            let len = after.find(|c: char| !is_ident(c)).unwrap_or(after.len());
            let name = &after[..len];
            assert!(
                name.starts_with(is_ident_start),
                "WGSL: $ without a name in {line}"
            );
            match env.get(name) {
                Value::Int(v) => out.push_str(&v.to_string()),
                Value::Word(w) => out.push_str(w),
            }
            rest = &after[len..];
        }
    }
    out.push_str(rest);
    out
}

/// The value of the integer expression `s` (see [`preprocess_with`]).
fn eval(s: &str, env: &Env) -> i64 {
    let tokens = tokens(s);
    let mut p = Parser {
        tokens: &tokens,
        at: 0,
        env,
        src: s,
    };
    let v = p.binary(0);
    assert!(
        p.at == tokens.len(),
        "WGSL: trailing tokens in expression {s}"
    );
    v
}

#[derive(Debug, PartialEq)]
enum Token<'s> {
    Int(i64),
    Name(&'s str),
    Op(&'s str),
}

fn tokens(s: &str) -> Vec<Token<'_>> {
    const OPS: [&str; 16] = [
        "==", "!=", "<=", ">=", "&&", "||", "<", ">", "+", "-", "*", "/", "%", "!", "(", ")",
    ];
    let mut out = Vec::new();
    let mut rest = s.trim_start();
    while let Some(c) = rest.chars().next() {
        let len = if c.is_ascii_digit() {
            let len = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
            let digits = rest[..len].trim_end_matches('u');
            let v = digits
                .parse()
                .unwrap_or_else(|_| panic!("WGSL: bad integer {} in {s}", &rest[..len]));
            out.push(Token::Int(v));
            len
        } else if is_ident_start(c) {
            let len = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
            out.push(Token::Name(&rest[..len]));
            len
        } else {
            let op = OPS
                .iter()
                .find(|op| rest.starts_with(*op))
                .unwrap_or_else(|| panic!("WGSL: unexpected {c} in expression {s}"));
            out.push(Token::Op(op));
            op.len()
        };
        rest = rest[len..].trim_start();
    }
    out
}

/// Precedence climbing over [`Token`]s.
struct Parser<'t, 's, 'e> {
    tokens: &'t [Token<'s>],
    at: usize,
    env: &'e Env<'e, 'e>,
    src: &'t str,
}

impl Parser<'_, '_, '_> {
    /// Binary operators of `level` and tighter (0: `||` … 5: `* / %`).
    fn binary(&mut self, level: usize) -> i64 {
        const LEVELS: [&[&str]; 6] = [
            &["||"],
            &["&&"],
            &["==", "!="],
            &["<", "<=", ">", ">="],
            &["+", "-"],
            &["*", "/", "%"],
        ];
        if level == LEVELS.len() {
            return self.unary();
        }
        let mut v = self.binary(level + 1);
        while let Some(Token::Op(op)) = self.tokens.get(self.at) {
            if !LEVELS[level].contains(op) {
                break;
            }
            self.at += 1;
            let r = self.binary(level + 1);
            v = match *op {
                "||" => (v != 0 || r != 0) as i64,
                "&&" => (v != 0 && r != 0) as i64,
                "==" => (v == r) as i64,
                "!=" => (v != r) as i64,
                "<" => (v < r) as i64,
                "<=" => (v <= r) as i64,
                ">" => (v > r) as i64,
                ">=" => (v >= r) as i64,
                "+" => v + r,
                "-" => v - r,
                "*" => v * r,
                "/" => v / r,
                _ => v % r,
            };
        }
        v
    }

    fn unary(&mut self) -> i64 {
        let t = self.tokens.get(self.at);
        self.at += 1;
        match t {
            Some(Token::Int(v)) => *v,
            Some(Token::Name(n)) => self.env.int(n),
            Some(Token::Op("!")) => (self.unary() == 0) as i64,
            Some(Token::Op("-")) => -self.unary(),
            Some(Token::Op("(")) => {
                let v = self.binary(0);
                assert_eq!(
                    self.tokens.get(self.at),
                    Some(&Token::Op(")")),
                    "WGSL: unbalanced parentheses in {}",
                    self.src
                );
                self.at += 1;
                v
            }
            _ => panic!("WGSL: malformed expression {}", self.src),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Barrier;

    #[test]
    fn preprocess_named_flags_nest() {
        let src = "a\n//!IF A\nb\n//!IF B\nc\n//!ELSE\nd\n//!END\n//!ELSE\ne\n//!END\nf\n";
        let run = |a, b| preprocess(src, &[("A", a), ("B", b)]);
        assert_eq!(run(true, true), "a\nb\nc\nf\n");
        assert_eq!(run(true, false), "a\nb\nd\nf\n");
        assert_eq!(run(false, true), "a\ne\nf\n");
        assert_eq!(run(false, false), "a\ne\nf\n");
    }

    #[test]
    fn preprocess_each_writes_one_copy_per_pair() {
        let src = "a\n//!IF A\n//!EACH ld_x=x ld_y=y\nfn $NAME() { $ARRAY[0]; }\n//!END EACH\n//!END\nb\n";
        assert_eq!(
            preprocess(src, &[("A", true)]),
            "a\nfn ld_x() { x[0]; }\nfn ld_y() { y[0]; }\nb\n"
        );
        assert_eq!(preprocess(src, &[("A", false)]), "a\nb\n");
    }

    #[test]
    fn preprocess_for_repeats_with_the_index_bound() {
        let src = "//!FOR r IN 0..RM\n//!FOR q IN 1..3\nvar a${r}_$q = ${8 * r + q}u;\n//!END FOR\n//!END FOR\n";
        assert_eq!(
            preprocess_with(src, &[], &[("RM", 2)]),
            "var a0_1 = 1u;\nvar a0_2 = 2u;\nvar a1_1 = 9u;\nvar a1_2 = 10u;\n"
        );
        assert_eq!(preprocess_with(src, &[], &[("RM", 0)]), "");
    }

    #[test]
    fn preprocess_if_takes_expressions() {
        let src =
            "//!FOR o IN 0..4\n//!IF o == AFTER && !SKIP\nload $o\n//!END\nstep $o\n//!END FOR\n";
        let run = |skip| preprocess_with(src, &[("SKIP", skip)], &[("AFTER", 2)]);
        assert_eq!(run(false), "step 0\nstep 1\nload 2\nstep 2\nstep 3\n");
        assert_eq!(run(true), "step 0\nstep 1\nstep 2\nstep 3\n");
        let e = |s: &str| preprocess_with(&format!("${{{s}}}\n"), &[], &[("N", 7)]);
        assert_eq!(e("(N + 1) * 2 - 3 % 2"), "15\n");
        assert_eq!(e("N / 2 >= 3 || 0"), "1\n");
        assert_eq!(e("-N + 10 < 3 == 0"), "1\n");
    }

    #[test]
    fn preprocess_define_inserts_with_arguments() {
        let src = "//!DEFINE body(k)\nW$k[i];\n//!IF k > 0 && TWO\nfar $k\n//!END\n//!END DEFINE\n\
                   a\n//!INSERT body(1)\n//!INSERT body(0)\nb\n";
        assert_eq!(
            preprocess(src, &[("TWO", true)]),
            "a\nW1[i];\nfar 1\nW0[i];\nb\n"
        );
        assert_eq!(preprocess(src, &[("TWO", false)]), "a\nW1[i];\nW0[i];\nb\n");
        let src = "//!DEFINE load(k)\nload($k);\n//!END DEFINE\n//!INSERT load(\"k0 + 128u\")\n";
        assert_eq!(preprocess(src, &[]), "load(k0 + 128u);\n");
    }

    #[test]
    #[should_panic(expected = "unknown name")]
    fn preprocess_refuses_an_unknown_name() {
        preprocess("x$Q\n", &[]);
    }

    #[test]
    #[should_panic(expected = "unknown directive")]
    fn preprocess_refuses_an_unknown_directive() {
        preprocess("//!TEMPLATE\n", &[]);
    }

    #[test]
    #[should_panic(expected = "closed by")]
    fn preprocess_refuses_a_mismatched_close() {
        preprocess("//!FOR i IN 0..2\nx\n//!END\n", &[]);
    }

    /// Two threads asking for one key at the same time: one build, one shared value; another key
    /// (and the same fields under another key type) builds its own.
    #[test]
    fn cache_builds_a_key_once_across_threads() {
        #[derive(Clone, PartialEq, Eq, Hash)]
        struct KeyA(u32);
        #[derive(Clone, PartialEq, Eq, Hash)]
        struct KeyB(u32);
        let cache = OnceCache::<u64>::default();
        let builds = AtomicUsize::new(0);
        let gate = Barrier::new(2);
        let make = || {
            builds.fetch_add(1, Ordering::SeqCst);
            // hold the build open so the other thread arrives while it runs
            std::thread::sleep(std::time::Duration::from_millis(50));
            7u64
        };
        let (a, b) = std::thread::scope(|s| {
            let ta = s.spawn(|| {
                gate.wait();
                cache.get_or_build(&KeyA(1), make)
            });
            let tb = s.spawn(|| {
                gate.wait();
                cache.get_or_build(&KeyA(1), make)
            });
            (ta.join().unwrap(), tb.join().unwrap())
        });
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(*cache.get_or_build(&KeyA(2), || 8), 8);
        assert_eq!(*cache.get_or_build(&KeyB(1), || 9), 9);
        assert_eq!(*cache.get_or_build(&KeyA(1), || 10), 7);
    }
}
