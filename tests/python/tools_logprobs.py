#!/usr/bin/env python3
"""Logprobs and a tool round trip through the official `openai` client against `inkling-wgpu
serve` of a fixture whose tokenizer has the tool specials.

    python tests/python/tools_logprobs.py BASE_URL

A tiny fixture model does not call tools by itself, so the calls here are forced with a named
`tool_choice` (the prompt ends with the tool-call prefix and the model writes the arguments);
the parser of the exact token sequences is tested in Rust (tests/suite/serve/serve_tools.rs).
Prints one line per check; exits non-zero on the first failed one.
Run by tests/suite/serve/serve_tools.rs.
"""

import json
import math
import sys

import openai

BASE = sys.argv[1]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="none", max_retries=0, timeout=300)
MODEL = client.models.list().data[0].id


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok:", what)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
USER = {"role": "user", "content": "What is the weather in Paris?"}

# logprobs, non-streamed
r = client.chat.completions.create(
    model=MODEL, messages=[USER], max_tokens=8, temperature=0,
    logprobs=True, top_logprobs=3, reasoning_effort="none",
)
lp = r.choices[0].logprobs
check(lp is not None and len(lp.content) > 0, "chat logprobs present")
for e in lp.content:
    check(e.logprob <= 0 and len(e.top_logprobs) == 3, f"token {e.token!r}: logprob and 3 alternatives")
    check(e.top_logprobs[0].logprob >= e.logprob - 1e-6, "greedy: the chosen token is the most likely")
    check(abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6, "greedy: chosen = top alternative")
    check(sum(math.exp(a.logprob) for a in e.top_logprobs) <= 1 + 1e-4, "probabilities sum to at most 1")
text = r.choices[0].message.content
joined = b"".join(bytes(e.bytes) for e in lp.content).decode("utf-8", "replace")
check(joined == text, "the tokens' bytes are the answer text")

# logprobs, streamed: the same entries
entries = []
for ch in client.chat.completions.create(
    model=MODEL, messages=[USER], max_tokens=8, temperature=0,
    logprobs=True, top_logprobs=3, reasoning_effort="none", stream=True,
):
    if ch.choices and ch.choices[0].logprobs and ch.choices[0].logprobs.content:
        entries.extend(ch.choices[0].logprobs.content)
check([(e.token, round(e.logprob, 5)) for e in entries]
      == [(e.token, round(e.logprob, 5)) for e in lp.content], "streamed logprobs equal")

# completions logprobs
c = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0, logprobs=2)
l = c.choices[0].logprobs
check(len(l.tokens) == len(l.token_logprobs) == len(l.top_logprobs) == len(l.text_offset) > 0,
      "completion logprobs: tokens, token_logprobs, top_logprobs, text_offset")
check(all(len(t) <= 2 for t in l.top_logprobs), "at most 2 alternatives")

# a forced (named) tool call
r = client.chat.completions.create(
    model=MODEL, messages=[USER], tools=TOOLS, tool_choice=NAMED, max_tokens=12, temperature=0,
)
ch = r.choices[0]
calls = ch.message.tool_calls
check(calls is not None and len(calls) == 1, f"one tool call: {ch.message}")
call = calls[0]
check(call.type == "function" and call.function.name == "get_weather", "named function called")
check(call.id.startswith("call_"), f"call id {call.id}")
check(isinstance(call.function.arguments, str), "arguments are a string")
check(ch.finish_reason in ("tool_calls", "length"), f"finish_reason {ch.finish_reason}")

# streamed: tool_calls deltas
deltas, finish = [], None
for chunk in client.chat.completions.create(
    model=MODEL, messages=[USER], tools=TOOLS, tool_choice=NAMED, max_tokens=12, temperature=0,
    stream=True,
):
    if not chunk.choices:
        continue
    d = chunk.choices[0].delta
    if d.tool_calls:
        deltas.extend(d.tool_calls)
    finish = chunk.choices[0].finish_reason or finish
check(len(deltas) >= 1 and all(d.index == 0 for d in deltas), "streamed deltas of call 0")
check((deltas[0].id or "").startswith("call_") and deltas[0].type == "function"
      and deltas[0].function.name == "get_weather", "the first delta has id, type and name")
check(all(d.function.name is None and d.id is None for d in deltas[1:]),
      f"later deltas carry arguments only ({len(deltas)} deltas)")
streamed_args = "".join(d.function.arguments or "" for d in deltas)
check(streamed_args == call.function.arguments, "streamed arguments join to the non-streamed ones")
check(finish == ch.finish_reason, f"streamed finish_reason {finish}")

# the round trip: the call and its result go back as history
history = [
    USER,
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})},
    }]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
]
r = client.chat.completions.create(
    model=MODEL, messages=history, tools=TOOLS, max_tokens=6, temperature=0,
    extra_body={"return_token_ids": True},
)
check(r.choices[0].finish_reason in ("stop", "length", "tool_calls"), "answer after the tool result")
ids = r.choices[0].model_extra["prompt_token_ids"]
check(isinstance(ids, list) and len(ids) > 20, "prompt ids returned")

# tool_choice none: no call; required: the one function, or refused by name among several
r = client.chat.completions.create(
    model=MODEL, messages=[USER], tools=TOOLS, tool_choice="none", max_tokens=6, temperature=0,
)
check(not r.choices[0].message.tool_calls, "tool_choice none: no call")
r = client.chat.completions.create(
    model=MODEL, messages=[USER], tools=TOOLS, tool_choice="required", max_tokens=6, temperature=0,
)
check(r.choices[0].message.tool_calls[0].function.name == "get_weather",
      "required with one function: that function is called")
TWO = TOOLS + [{"type": "function", "function": {"name": "get_time"}}]
try:
    client.chat.completions.create(model=MODEL, messages=[USER], tools=TWO, tool_choice="required")
    check(False, "required among several refused")
except openai.BadRequestError as e:
    b = e.body.get("error", e.body)
    check(b.get("param") == "tool_choice", f"required among several refused naming tool_choice: {b}")
try:
    client.chat.completions.create(model=MODEL, messages=[USER], response_format={"type": "json_object"})
    check(False, "json mode refused")
except openai.BadRequestError as e:
    b = e.body.get("error", e.body)
    check(b.get("param") == "response_format", "json_object refused naming response_format")
print("all checks passed")
