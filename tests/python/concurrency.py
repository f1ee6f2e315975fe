"""Concurrent requests through the official `openai` client against `serve --parallel 4`:
eight chat and completion requests (streamed and not, greedy and seeded-sampled, one with
logprobs) started together from eight threads; each answer must equal the same request sent
alone afterwards, and /health must have seen several slots in use. Prints "all checks passed".

    python3 tests/python/concurrency.py BASE_URL
"""

import json
import sys
import threading
import time
import urllib.request

import openai

BASE = sys.argv[1]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="none", max_retries=0)
failures = []
MODEL = client.models.list().data[0].id


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def health():
    with urllib.request.urlopen(BASE + "/health") as r:
        return json.load(r)


def chat(i, stream):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": f"Question {i}: tell me about the sea."}],
              max_tokens=10 + 3 * i, temperature=0, extra_body={"reasoning_effort": "none"})
    if i == 3:
        kw.update(temperature=0.9, seed=11)
    if i == 5:
        kw.update(logprobs=True, top_logprobs=2)
    if not stream:
        r = client.chat.completions.create(**kw)
        c = r.choices[0]
        lps = None
        if c.logprobs is not None and c.logprobs.content is not None:
            lps = [(t.token, round(t.logprob, 4)) for t in c.logprobs.content]
        return ("chat", c.message.content, c.finish_reason, r.usage.completion_tokens, lps)
    text, finish = "", None
    for ch in client.chat.completions.create(stream=True, **kw):
        if ch.choices:
            text += ch.choices[0].delta.content or ""
            finish = ch.choices[0].finish_reason or finish
    return ("chat-stream", text, finish)


def completion(i, stream):
    kw = dict(model=MODEL, prompt=f"Once upon a time {i}", max_tokens=8 + 4 * i, temperature=0)
    if not stream:
        r = client.completions.create(**kw)
        return ("completion", r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens)
    text, finish = "", None
    for ch in client.completions.create(stream=True, **kw):
        if ch.choices:
            text += ch.choices[0].text or ""
            finish = ch.choices[0].finish_reason or finish
    return ("completion-stream", text, finish)


REQUESTS = [(chat, 0, False), (chat, 1, True), (completion, 2, False), (chat, 3, False),
            (completion, 4, True), (chat, 5, False), (completion, 6, False), (chat, 7, True)]

h0 = health()
check(h0["slots"] == {"total": 4, "in_use": 0}, f"slots at start: {h0}")
results = [None] * len(REQUESTS)


def run(k):
    f, i, s = REQUESTS[k]
    try:
        results[k] = f(i, s)
    except Exception as e:  # noqa: BLE001 - reported as a failure
        results[k] = ("error", repr(e))


threads = [threading.Thread(target=run, args=(k,)) for k in range(len(REQUESTS))]
for t in threads:
    t.start()
busiest = 0
while any(t.is_alive() for t in threads):
    busiest = max(busiest, health()["slots"]["in_use"])
    time.sleep(0.002)
for t in threads:
    t.join()
h1 = health()["counts"]
steps = h1["decode_steps"] - h0["counts"]["decode_steps"]
fed = h1["decode_tokens"] - h0["counts"]["decode_tokens"]
# sequential requests would feed one token per step
check(fed > steps > 0, f"{fed} tokens in {steps} decode steps while eight requests ran together")
for k, (f, i, s) in enumerate(REQUESTS):
    alone = f(i, s)
    check(results[k] == alone, f"request {k} together {results[k]!r} vs alone {alone!r}")
    check(results[k][0] != "error", f"request {k} failed: {results[k]!r}")
lp = results[5][4]
check(lp is not None and len(lp) > 0, f"logprobs of request 5: {lp!r}")
h = health()
check(h["slots"]["in_use"] == 0, f"slots at the end: {h}")
check(h["counts"]["completed"] == 2 * len(REQUESTS), f"counts: {h}")
print(f"{len(REQUESTS)} concurrent requests equal each alone; {fed} tokens in {steps} decode steps, "
      f"up to {busiest} of 4 slots seen in use")
if failures:
    sys.exit(f"{len(failures)} checks failed")
print("all checks passed")
