#!/usr/bin/env python3
"""Throughput and latency of a running `inkling-wgpu serve` (or any OpenAI-compatible server)
under concurrent streaming clients. Standard library only.

    python3 benches/serve_bench.py --url http://127.0.0.1:8080 --model MODEL \
        [--tokens 128] [--concurrency 1,2,4,8] [--rounds 1] [--endpoint chat|completions] [--logprobs]

For each concurrency N, N clients start together, each streaming --rounds greedy answers
(temperature 0) of --tokens tokens (`max_tokens`; an answer may end earlier at the model's stop
token: the token counts are the server's `usage`). Prints one JSON object:

    {"url", "model", "endpoint", "tokens", "prompt", "levels": [{
        "concurrency", "requests", "errors", "completion_tokens", "wall_s",
        "aggregate_tok_s",                      # all completion tokens / wall time of the level
        "per_request_tok_s": {"median", "min"}, # a request's tokens / its time from send to end
        "decode_tok_s": {"median", "min"},      # after its first token: (tokens - 1) / time
        "ttft_s": {"median", "max"}             # send to the first streamed token
    }]}

A request the server refuses (429 when its queue is full, any non-200) counts in `errors` and
in none of the other numbers.
"""

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse

PROMPT = "Write a long story about a lighthouse keeper and the sea."


def one_request(url, model, endpoint, tokens, prompt, logprobs=False):
    """Stream one answer: (ttft_s, total_s, completion_tokens) or an error string."""
    u = urllib.parse.urlparse(url)
    body = {
        "model": model,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if endpoint == "chat":
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": prompt}]
        if logprobs:
            body["logprobs"] = True
    else:
        path = "/v1/completions"
        body["prompt"] = prompt
        if logprobs:
            body["logprobs"] = 0
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=3600)
    t0 = time.perf_counter()
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            return f"HTTP {r.status}: {r.read()[:200]!r}"
        ttft = None
        usage = None
        chunks = 0
        done = False
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            v = json.loads(data)
            if "error" in v:
                return f"stream error: {v['error']}"
            if v.get("usage"):
                usage = v["usage"]
            for c in v.get("choices", []):
                d = c.get("delta", {}) if endpoint == "chat" else c
                piece = d.get("content") or d.get("reasoning_content") or d.get("text") or ""
                # a token without text (an id past a synth probe's tiny tokenizer) streams a chunk
                # only with its log-probability
                if piece or (c.get("logprobs") or {}).get("tokens") or (c.get("logprobs") or {}).get("content"):
                    chunks += 1
                    if ttft is None:
                        ttft = time.perf_counter() - t0
        if not done:
            return "the stream ended without [DONE] (connection closed early)"
        total = time.perf_counter() - t0
        n = usage["completion_tokens"] if usage else chunks
        return (ttft if ttft is not None else total, total, n)
    except (OSError, ValueError, http.client.HTTPException) as e:
        return f"{type(e).__name__}: {e}"
    finally:
        conn.close()


def level(args, n):
    results = []
    lock = threading.Lock()
    start = threading.Barrier(n)

    def client():
        start.wait()
        for _ in range(args.rounds):
            r = one_request(args.url, args.model, args.endpoint, args.tokens, args.prompt,
                                args.logprobs)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=client) for _ in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = [r for r in results if isinstance(r, tuple)]
    errors = [r for r in results if not isinstance(r, tuple)]
    toks = sum(r[2] for r in ok)
    per = [r[2] / r[1] for r in ok if r[1] > 0]
    dec = [(r[2] - 1) / (r[1] - r[0]) for r in ok if r[2] > 1 and r[1] > r[0]]
    ttft = [r[0] for r in ok]

    def stat(xs, other):
        if not xs:
            return {"median": None, other: None}
        return {"median": statistics.median(xs), other: (min if other == "min" else max)(xs)}

    out = {
        "concurrency": n,
        "requests": len(results),
        "errors": len(errors),
        "completion_tokens": toks,
        "wall_s": wall,
        "aggregate_tok_s": toks / wall if wall > 0 else None,
        "per_request_tok_s": stat(per, "min"),
        "decode_tok_s": stat(dec, "min"),
        "ttft_s": stat(ttft, "max"),
    }
    if errors:
        out["first_error"] = errors[0]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8080")
    p.add_argument("--model", required=True, help="the served model id (GET /v1/models)")
    p.add_argument("--tokens", type=int, default=128, help="max_tokens of each answer (128)")
    p.add_argument("--concurrency", default="1,2,4,8", help="client counts (1,2,4,8)")
    p.add_argument("--rounds", type=int, default=1, help="answers per client per level (1)")
    p.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--logprobs", action="store_true",
                   help="ask for the chosen token's log-probability, so that every token streams a "
                        "chunk, also those without text (a synth probe's ids past its tokenizer): "
                        "TTFT and decode rate then count every token; the server then reads back "
                        "whole logit rows, also for one request alone")
    args = p.parse_args()
    u = urllib.parse.urlsplit(args.url)
    try:
        port = u.port  # raises ValueError past 65535
    except ValueError:
        port = -1
    if u.scheme != "http" or not u.hostname or port == -1 or u.path not in ("", "/") \
            or u.query or u.fragment:
        p.error(f"--url: expected http://HOST[:PORT] (port 1-65535, no path), got {args.url!r}")
    try:
        levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    except ValueError:
        p.error(f"--concurrency: expected comma-separated integers, got {args.concurrency!r}")
    if not levels or min(levels) < 1 or args.tokens < 1 or args.rounds < 1:
        p.error("--concurrency, --tokens and --rounds must be at least 1")
    report = {
        "url": args.url,
        "model": args.model,
        "endpoint": args.endpoint,
        "tokens": args.tokens,
        "prompt": args.prompt,
        "levels": [level(args, n) for n in levels],
    }
    json.dump(report, sys.stdout, indent=1)
    print()
    return 1 if any(lv["errors"] for lv in report["levels"]) else 0


if __name__ == "__main__":
    sys.exit(main())
