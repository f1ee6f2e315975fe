//! `inkling-wgpu serve` of the chat fixture on the CPU device as a child process, on an ephemeral
//! port, for tests that speak plain HTTP/1.0 to it (each response then ends where the server
//! closes the connection, so a body needs no chunked decoding).
use crate::chat_common::chat_model;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_inkling-wgpu");

/// A running server; killed when dropped, however the test ends.
pub struct Server {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// Context length in tokens, as the "model loaded" line gives it.
    pub ctx: usize,
    /// The stderr lines so far (the listening and model-loaded ones).
    pub log: Vec<String>,
    /// Reads the rest of stderr until the server exits (so it never blocks on a full pipe).
    rest: Option<JoinHandle<Vec<String>>>,
}

impl Server {
    /// Start `serve --port 0 EXTRA…` (with `--device cpu` unless EXTRA names a device) and return
    /// once it takes requests.
    pub fn start(extra: &[&str]) -> Server {
        Server::start_model(&chat_model(), extra)
    }

    /// [`Server::start`] of the model in directory `model`.
    pub fn start_model(model: &std::path::Path, extra: &[&str]) -> Server {
        let mut child = Command::new(BIN)
            .args(["serve", "--port", "0", "--model"])
            .arg(model)
            // the CPU unless `extra` names a device
            .args(if extra.contains(&"--device") {
                &[][..]
            } else {
                &["--device", "cpu"][..]
            })
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut log = Vec::new();
        let (addr, ctx) = match wait_loaded(&mut lines, &mut log) {
            Ok(found) => found,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{e}: {log:#?}");
            }
        };
        let rest = std::thread::spawn(move || rest_of(lines));
        let server = Server {
            child,
            addr,
            ctx,
            log,
            rest: Some(rest),
        };
        // the ready line comes once the engine takes requests
        assert_eq!(server.health()["status"], "ok", "{:#?}", server.log);
        server
    }

    /// Send signal `sig` to the server.
    pub fn signal(&self, sig: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: kill only sends a signal, to our own child.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
    }

    /// Wait for the server to exit (killing it past `limit`, which fails the test) and return
    /// its status and every stderr line.
    pub fn wait_exit(&mut self, limit: Duration) -> (ExitStatus, Vec<String>) {
        let t0 = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if t0.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let rest = self.rest.take().unwrap().join().unwrap();
                panic!(
                    "serve still ran {limit:?} after the signal: {:#?}",
                    [self.log.clone(), rest].concat()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let rest = self.rest.take().unwrap().join().unwrap();
        (status, [self.log.clone(), rest].concat())
    }

    /// `GET /health`'s body.
    pub fn health(&self) -> Value {
        let mut r = request(&self.addr, "GET", "/health", None);
        let _ = status(&mut r);
        let mut body = String::new();
        r.read_to_string(&mut body).unwrap();
        serde_json::from_str(&body).unwrap()
    }
}

/// Read stderr lines into `log` up to the "model loaded" and "ready" ones (the "listening" one may
/// come before or after them); returns the address and the context length in tokens.
fn wait_loaded(
    lines: &mut std::io::Lines<BufReader<ChildStderr>>,
    log: &mut Vec<String>,
) -> Result<(String, usize), String> {
    let mut addr = None;
    let mut ctx = None;
    let mut ready = false;
    while addr.is_none() || ctx.is_none() || !ready {
        let Some(Ok(line)) = lines.next() else {
            return Err("serve ended before it listened and loaded its model".into());
        };
        if let Some(rest) = line.split("listening on http://").nth(1) {
            let a = rest.split_whitespace().next().ok_or("no address")?;
            addr = Some(a.to_string());
        }
        if line.contains("model loaded") {
            let n = line
                .rsplit(", ")
                .next()
                .and_then(|s| s.strip_suffix(" tokens of context)"))
                .and_then(|s| s.parse().ok())
                .ok_or("no context length in the model-loaded line")?;
            ctx = Some(n);
        }
        ready |= line.starts_with("inkling-wgpu serve: ready (");
        log.push(line);
    }
    Ok((addr.unwrap(), ctx.unwrap()))
}

fn rest_of(lines: std::io::Lines<BufReader<ChildStderr>>) -> Vec<String> {
    lines.map_while(Result::ok).collect()
}

impl Server {
    /// The server process's resident memory (VmRSS of /proc/PID/status), in bytes.
    pub fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kb = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .unwrap_or_else(|| panic!("no VmRSS in {status}"));
        kb.trim().parse::<u64>().unwrap() * 1024
    }

    /// One request on a fresh connection (`Connection: close`): status, headers and body.
    pub fn request(&self, method: &str, path: &str, body: &[u8]) -> (u16, String, String) {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .unwrap();
        s.write_all(body).unwrap();
        super::hostile::read_response(&mut s)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Send an HTTP/1.0 request (a JSON `body` when given); the reader is at the status line.
pub fn request(addr: &str, method: &str, path: &str, body: Option<&Value>) -> BufReader<TcpStream> {
    let mut s = TcpStream::connect(addr).unwrap();
    let body = body.map_or(String::new(), Value::to_string);
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    BufReader::new(s)
}

/// Read the status line and headers; returns the status code.
pub fn status(r: &mut BufReader<TcpStream>) -> u16 {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let code = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status line: {line:?}"));
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).unwrap() == 0 || h.trim_end().is_empty() {
            return code;
        }
    }
}

/// A whole response: status and JSON body.
pub fn post_json(addr: &str, path: &str, body: &Value) -> (u16, Value) {
    let mut r = request(addr, "POST", path, Some(body));
    let code = status(&mut r);
    let mut text = String::new();
    r.read_to_string(&mut text).unwrap();
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    (code, v)
}

/// The next SSE `data:` payload of a streamed response (comment pings skipped); `None` at its end.
pub fn next_data(r: &mut BufReader<TcpStream>) -> Option<String> {
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap() == 0 {
            return None;
        }
        if let Some(d) = line.trim_end().strip_prefix("data: ") {
            return Some(d.to_string());
        }
    }
}
