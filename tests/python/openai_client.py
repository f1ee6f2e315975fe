#!/usr/bin/env python3
"""End-to-end checks of `inkling-wgpu serve` through the official `openai` client (and raw HTTP
from the standard library where the client hides what is checked: status codes, headers, SSE
comment pings, disconnects).

    python tests/python/openai_client.py BASE_URL EXPECTED_JSON

BASE_URL is the server (http://127.0.0.1:PORT), started with `--parallel 1 --queue 3 --ping-ms 20` (one slot: later requests queue).
EXPECTED_JSON holds `generate --json` outputs ({prompt_ids, generated_ids, text, finish_reason,
max_tokens}) for the same model. Prints one line per check and the server's counts at the end;
exits non-zero on the first failed check. Run by tests/suite/serve/serve_openai.rs.
"""

import http.client
import json
import os
import sys
import threading
import time
import urllib.parse

import openai

BASE = sys.argv[1]
EXPECTED = json.load(open(sys.argv[2]))
URL = urllib.parse.urlparse(BASE)
client = openai.OpenAI(base_url=BASE + "/v1", api_key="none", max_retries=0, timeout=300)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def raw(method, path, body=None, headers=None):
    """(status, headers, parsed JSON body) over a fresh connection."""
    c = http.client.HTTPConnection(URL.hostname, URL.port, timeout=300)
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    c.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
    r = c.getresponse()
    text = r.read()
    c.close()
    return r.status, dict(r.getheaders()), json.loads(text) if text else None


class RawStream:
    """A streamed request read line by line (SSE)."""

    def __init__(self, path, body):
        self.conn = http.client.HTTPConnection(URL.hostname, URL.port, timeout=300)
        self.conn.request("POST", path, body=json.dumps(body).encode(),
                          headers={"Content-Type": "application/json"})
        self.resp = self.conn.getresponse()

    def lines(self):
        while True:
            line = self.resp.readline()
            if not line:
                return
            line = line.decode().rstrip("\r\n")
            if line:
                yield line

    def close(self):
        self.conn.sock.close()
        self.conn.close()


# the model loads while the server already answers: /health is 503 until it is ready
deadline = time.monotonic() + 300
while True:
    try:
        st, _, _ = raw("GET", "/health")
    except OSError:
        st = None
    if st == 200:
        break
    check(st in (503, None) and time.monotonic() < deadline, f"/health {st}")
    time.sleep(0.1)

models = client.models.list()
MODEL = models.data[0].id
print(f"model {MODEL!r}")

# --- the same tokens as `generate` on the same prompt ids, streamed and not
for case in EXPECTED:
    args = dict(model=MODEL, prompt=case["prompt_ids"], max_tokens=case["max_tokens"],
                temperature=0, extra_body={"return_token_ids": True})
    r = client.completions.create(**args).to_dict()
    ch = r["choices"][0]
    check(ch["token_ids"] == case["generated_ids"],
          f"serve ids {ch['token_ids']} != generate ids {case['generated_ids']}")
    want_finish = {"eos": "stop", "length": "length"}[case["finish_reason"]]
    check(ch["finish_reason"] == want_finish, f"finish {ch['finish_reason']} != {want_finish}")
    check(ch["text"] == case["text"], f"text {ch['text']!r} != generate's {case['text']!r}")
    u = r["usage"]
    check(u["prompt_tokens"] == len(case["prompt_ids"]), f"prompt_tokens {u}")
    check(u["completion_tokens"] == len(case["generated_ids"]), f"completion_tokens {u}")
    check(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], f"total {u}")
    pieces = [c.choices[0].text for c in client.completions.create(stream=True, **args)]
    check("".join(pieces) == case["text"], f"streamed {pieces!r} != {case['text']!r}")
    multibyte = [c for c in case["text"] if ord(c) > 127 and c != "\ufffd"]
    print(f"completion ids == generate ({len(case['generated_ids'])} tokens, "
          f"{len(pieces)} chunks, multi-byte {multibyte})")

# --- chat, non-streamed and streamed with usage (multi-byte text in the prompt)
msgs = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Grüß dich! ✓ 你好 <|end_message|>"}]
chat_args = dict(model=MODEL, messages=msgs, max_tokens=20, temperature=0, reasoning_effort="none")
r = client.chat.completions.create(**chat_args)
text = r.choices[0].message.content
check(isinstance(text, str) and r.choices[0].message.role == "assistant", f"message {r}")
check(r.choices[0].finish_reason in ("stop", "length"), f"finish {r.choices[0].finish_reason}")
check(r.usage.completion_tokens <= 20 and r.usage.prompt_tokens > 10, f"usage {r.usage}")
check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "total")
chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                             **chat_args))
check(chunks[0].choices[0].delta.role == "assistant", f"first chunk {chunks[0]}")
streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check(streamed == text, f"streamed {streamed!r} != {text!r}")
finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
check(finals == [r.choices[0].finish_reason], f"finish reasons {finals}")
check(chunks[-1].choices == [] and chunks[-1].usage is not None, f"last chunk {chunks[-1]}")
check(chunks[-1].usage.completion_tokens == r.usage.completion_tokens
      and chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens, f"usage {chunks[-1].usage}")
no_usage = list(client.chat.completions.create(stream=True, **chat_args))
check(all(c.usage is None for c in no_usage), "usage sent without include_usage")
print(f"chat: {len(chunks)} chunks, usage {chunks[-1].usage.prompt_tokens}+"
      f"{chunks[-1].usage.completion_tokens}, finish {finals[0]}")

# a conversation with the thinking dial on (default 0.9): any reasoning goes to reasoning_content
r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0)
check(r.choices[0].message.content is not None, "content with effort 0.9")

# the transformers reference conversation (tools/chat_reference.py): its first turn's thinking
# and text, as the official client reads them, streamed and not
REF = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures",
                                  "tiny-chat-f32", "chat_reference.json")))
turn = REF["serve"][0]
ref_args = dict(model=MODEL, messages=[{"role": "user", "content": REF["messages"][0]}],
                max_tokens=REF["max_tokens"], temperature=0)
m = client.chat.completions.create(**ref_args).choices[0].message
check(m.content == turn["text"], f"content {m.content!r} != {turn['text']!r}")
reasoning = getattr(m, "reasoning_content", None)
check(reasoning == turn["thinking"], f"reasoning_content {reasoning!r} != {turn['thinking']!r}")
deltas = [c.choices[0].delta for c in client.chat.completions.create(stream=True, **ref_args)
          if c.choices]
streamed_r = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
streamed_c = "".join(d.content or "" for d in deltas)
check(streamed_r == turn["thinking"] and streamed_c == turn["text"],
      f"streamed reasoning {streamed_r!r} / content {streamed_c!r}")
print(f"reference conversation: reasoning_content and content == transformers "
      f"({len(deltas)} chunks)")

# --- stop strings across chunk boundaries, streamed and not
case = EXPECTED[0]
args = dict(model=MODEL, prompt=case["prompt_ids"], max_tokens=case["max_tokens"], temperature=0)
pieces = [c.choices[0].text for c in client.completions.create(stream=True, **args)]
full = "".join(pieces)
stop = None
pos = 0
for a, b in zip(pieces, pieces[1:]):
    pos += len(a)
    if pos > len(full) // 3 and len(a) >= 2 and len(b) >= 1:
        s = a[-2:] + b[:1]
        if full.find(s) == pos - 2:
            stop = s
            break
check(stop is not None, f"no chunk boundary to put a stop string on: {pieces!r}")
want = full[: full.find(stop)]
got = [c.choices[0] for c in client.completions.create(stream=True, stop=[stop, "\u0000never"], **args)]
check("".join(c.text for c in got) == want, f"stop {stop!r}: {''.join(c.text for c in got)!r} != {want!r}")
check(got[-1].finish_reason == "stop", f"finish {got[-1].finish_reason}")
r = client.completions.create(stop=stop, **args)
check(r.choices[0].text == want and r.choices[0].finish_reason == "stop", f"stop non-streamed {r}")
print(f"stop {stop!r} across chunks: {len(got)} chunks, {len(want)} chars kept of {len(full)}")

# --- KV and conv state reuse when a request extends the previous sequence exactly
p = case["prompt_ids"]
r1 = client.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0,
                               extra_body={"return_token_ids": True}).to_dict()
ext = p + r1["choices"][0]["token_ids"] + [p[0]]
r2 = client.completions.create(model=MODEL, prompt=ext, max_tokens=6, temperature=0,
                               extra_body={"return_token_ids": True}).to_dict()
cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
check(cached >= len(p) + 5, f"cached_tokens {cached} for an exact extension")
client.completions.create(model=MODEL, prompt=[p[-1]], max_tokens=2, temperature=0)
r3 = client.completions.create(model=MODEL, prompt=ext, max_tokens=6, temperature=0,
                               extra_body={"return_token_ids": True}).to_dict()
check(r3["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, f"cached {r3['usage']}")
check(r3["choices"][0]["token_ids"] == r2["choices"][0]["token_ids"],
      "reused state and fresh prefill disagree")
print(f"state reuse: {cached} of {len(ext)} prompt tokens cached, same tokens as a fresh prefill")

# --- errors: status and envelope
def expect_error(exc, code, fn):
    try:
        fn()
    except exc as e:
        body = e.body if isinstance(e.body, dict) else {}
        check(code is None or body.get("code") == code, f"{exc.__name__}: body {e.body}")
        return e
    raise AssertionError(f"expected {exc.__name__}")


expect_error(openai.NotFoundError, "model_not_found",
             lambda: client.chat.completions.create(model="nope", messages=msgs, max_tokens=2))
expect_error(openai.BadRequestError, "context_length_exceeded",
             lambda: client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10**6))
expect_error(openai.BadRequestError, None,
             lambda: client.chat.completions.create(model=MODEL, messages=[], max_tokens=2))
expect_error(openai.BadRequestError, None,
             lambda: client.chat.completions.create(model=MODEL, messages=msgs, temperature="hot"))
expect_error(openai.BadRequestError, None,
             lambda: client.completions.create(model=MODEL, prompt=[10**9], max_tokens=2))
for body, status in [(b"{not json", 400), (b"x" * (5 << 20), 413)]:
    st, _, js = raw("POST", "/v1/chat/completions", body)
    check(st == status and js["error"]["type"] == "invalid_request_error", f"{status}: {st} {js}")
st, _, js = raw("GET", "/v1/nothing")
check(st == 404 and "error" in js, f"unknown route {st} {js}")
print("errors: 404 model_not_found, 400 context_length_exceeded, 400 bad fields/JSON, 413, 404 route")

# --- one engine behind a bounded queue (3): a long stream A runs; B (streamed) and C wait;
# C's client leaves while queued; a burst of 4 more finds one free slot (3 get 429); then A's
# client leaves mid-stream, which frees the engine for B, C is skipped, and the burst's accepted
# one runs.
short = dict(model=MODEL, prompt=EXPECTED[1]["prompt_ids"], max_tokens=EXPECTED[1]["max_tokens"],
             temperature=0)
a = RawStream("/v1/completions", dict(short, max_tokens=3000, stream=True))
check(a.resp.status == 200, f"A status {a.resp.status}")
a_lines = a.lines()
first = next(l for l in a_lines if l.startswith("data:"))
check("text" in first, f"A first chunk {first}")

b = RawStream("/v1/completions", dict(short, stream=True))
c = RawStream("/v1/completions", dict(short, stream=True))
check(b.resp.status == 200 and c.resp.status == 200, "B, C accepted")
c.close()

results = [None] * 4


def burst(i):
    try:
        results[i] = client.completions.create(**short).choices[0].text
    except openai.RateLimitError as e:
        results[i] = ("429", e.response.headers.get("retry-after"))


threads = [threading.Thread(target=burst, args=(i,)) for i in range(4)]
for t in threads:
    t.start()
# the 429s come back while A still runs; the accepted one waits for the engine
rejected = []
while len(rejected) < 3:
    for t in threads:
        t.join(timeout=0.05)
    rejected = [r for r in results if isinstance(r, tuple)]
    check(all(t.is_alive() or r is not None for t, r in zip(threads, results)), "a burst thread died")
check(all(r == ("429", "1") for r in rejected), f"429s {rejected}")
a.close()
for t in threads:
    t.join()
accepted = [r for r in results if not isinstance(r, tuple)]
check(len(accepted) == 1 and accepted[0] == EXPECTED[1]["text"], f"accepted {accepted}")

b_lines = list(b.lines())
pings = 0
for l in b_lines:
    if l.startswith("data:"):
        break
    if l.startswith(":"):
        pings += 1
check(pings >= 1, f"no SSE comment ping before B's first chunk: {b_lines[:3]}")
b_text = "".join(json.loads(l[5:])["choices"][0]["text"] for l in b_lines
                 if l.startswith("data:") and l != "data: [DONE]")
check(b_text == EXPECTED[1]["text"], f"B {b_text!r}")
check(b_lines[-1] == "data: [DONE]", f"B ends with {b_lines[-1]}")
b.close()

# a non-streamed request whose client leaves is cancelled too (hyper sees the connection close)
before = raw("GET", "/health")[2]["counts"]
d = http.client.HTTPConnection(URL.hostname, URL.port, timeout=300)
d.request("POST", "/v1/completions", body=json.dumps(dict(short, max_tokens=3000)).encode(),
          headers={"Content-Type": "application/json"})
while raw("GET", "/health")[2]["counts"]["requests"] == before["requests"]:
    time.sleep(0.02)
d.sock.close()
d.close()
r = client.completions.create(**short)
check(r.choices[0].text == EXPECTED[1]["text"], "the request after a disconnect")

st, _, health = raw("GET", "/health")
counts = health["counts"]
check(st == 200 and counts["cancelled"] == 3,
      f"cancelled (A running, C queued, D non-streamed): {counts}")
check(counts["rejected_429"] == 3, f"429s: {counts}")
check(counts["failed"] == 0, f"failed: {counts}")
print(f"queue: {len(rejected)} got 429 with Retry-After 1, A cancelled mid-stream, C cancelled "
      f"while queued, D (not streamed) cancelled, B got {pings} pings while waiting, accepted "
      f"ones correct")
print("counts " + json.dumps(counts, sort_keys=True))
