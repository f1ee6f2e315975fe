#!/usr/bin/env python3
"""Drive `inkling-wgpu chat` through a pseudo-terminal (its line-editor path), stdlib only.

    python tests/python/chat_pty.py BIN MODEL

Two turns, /help, Ctrl-C at the prompt (clears the line), /exit. Prints what the terminal showed;
exits non-zero when a check fails. Run by tests/suite/chat/chat_cli.rs.
"""
import os
import pty
import select
import sys
import time

BIN, MODEL = sys.argv[1], sys.argv[2]
pid, fd = pty.fork()
if pid == 0:
    os.execv(BIN, [BIN, "chat", "--model", MODEL, "--effort", "none", "--max-tokens", "8"])

seen = b""
pos = 0


def until(marker, limit=120):
    """Read the terminal until `marker` appears after the previous match."""
    global seen, pos
    end = time.monotonic() + limit
    while seen.find(marker, pos) < 0:
        if time.monotonic() > end:
            sys.exit(f"no {marker!r} on the terminal; it showed {seen!r}")
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                seen += os.read(fd, 4096)
            except OSError:
                sys.exit(f"the terminal closed; it showed {seen!r}")
    pos = seen.find(marker, pos) + len(marker)


until(b"> ")
for line in [b"Hello there", b"What did the fox do?"]:
    os.write(fd, line + b"\r")
    until(b"[prompt ")
    until(b"> ")
os.write(fd, b"/help\r")
until(b"commands:")
until(b"> ")
os.write(fd, b"abc\x03")
until(b"> ")
os.write(fd, b"/exit\r")
_, status = os.waitpid(pid, 0)
text = seen.decode("utf-8", "replace")
print(text)
stats = [l for l in text.splitlines() if l.startswith("[prompt ")]
if len(stats) != 2 or "(0 reused)" in stats[1]:
    sys.exit(f"stats lines {stats}")
if os.waitstatus_to_exitcode(status) != 0:
    sys.exit(f"chat exited with {status}")
