#!/usr/bin/env python3
"""Instructions per weight of each GEMV format's decode, counted in the SPIR-V that wgpu hands Vulkan.

Usage: python3 tools/spirv_counts.py [BINARY] [--xt 4096]
  BINARY  an inkling-wgpu binary (default target/release/inkling-wgpu): its `shaders --out` gives the
          WGSL of every kernel; naga (`cargo install naga-cli`, the translator wgpu itself uses) turns
          the default staged-x instantiation of each format (subgroup reduction, one weight chunk,
          x tile XT) into SPIR-V 1.3; SPIRV-Tools' `spirv-opt` removes the branches of the other
          formats (FMT is a constant) and `spirv-dis` prints it.
Counted per unit (COLS_PER_UNIT weights of one row): the instructions of `unit_dot` and of every
function it calls, in SIMT terms (what one thread executes):
  * ALU: arithmetic, bitwise, shifts, compares, selects, conversions, FMA: one per vector lane
    (a vec4 FMA is four FMAs);
  * LDS: loads from workgroup memory (the staged x vec4s; one 16-byte load each) and their index
    arithmetic (counted under ALU);
  * free: bitcasts, composite extract/construct, access chains of constant index (register moves
    or addressing folded into the load).
Outside unit_dot, the hot loop adds per unit WORDS_PER_UNIT 16-byte weight loads and the group
scale loads (listed as `global loads`), loop control and the prefetch copies. A GPU compiler may
fuse (NVIDIA's LOP3 joins and-or; its FFMA takes the magic-number subtract only as a separate op),
so these are the source's counts, not the machine code's. BENCHMARKS.md#gemv-instructions prints
the table beside the kernels' GB/s.
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

FREE = {"OpBitcast", "OpCompositeExtract", "OpCompositeConstruct", "OpVectorShuffle", "OpCopyObject"}
CONTROL = {"OpLabel", "OpBranch", "OpBranchConditional", "OpSelectionMerge", "OpLoopMerge", "OpReturn",
           "OpReturnValue", "OpFunctionParameter", "OpFunction", "OpFunctionEnd", "OpVariable",
           "OpUnreachable", "OpPhi", "OpLine", "OpNoLine"}


def sh(*cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        hint = {"naga": " (cargo install naga-cli)", "spirv-opt": " (apt-get install spirv-tools)",
                "spirv-dis": " (apt-get install spirv-tools)"}.get(cmd[0], "")
        sys.exit(f"cannot run {cmd[0]}: {e.strerror}{hint}")
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    return r.stdout


def spirv_text(wgsl, tmp):
    spv = os.path.join(tmp, "a.spv")
    sh("naga", "--spirv-version", "1.3", "-g", wgsl, spv)
    # naga -g records the source language as WGSL (10), which older SPIRV-Tools refuse: set Unknown
    b = open(spv, "rb").read()
    w = list(struct.unpack("<%dI" % (len(b) // 4), b))
    i = 5
    while i < len(w):
        n, op = w[i] >> 16, w[i] & 0xFFFF
        if op == 3:  # OpSource
            w[i + 1] = 0
        i += max(n, 1)
    open(spv, "wb").write(struct.pack("<%dI" % len(w), *w))
    opt = os.path.join(tmp, "b.spv")
    sh("spirv-opt", "--target-env=vulkan1.1", "--ssa-rewrite", "--ccp", "--simplify-instructions", "--eliminate-dead-branches", "--merge-blocks",
       "--eliminate-dead-code-aggressive", spv, "-o", opt)
    return sh("spirv-dis", opt)


def parse(text):
    names, lanes, funcs, cur = {}, {}, {}, None
    for line in text.splitlines():
        m = re.match(r'\s*OpName (%\S+) "(.*)"', line)
        if m:
            names.setdefault(m.group(1), m.group(2))
            continue
        m = re.match(r"\s*(%\S+) = OpTypeVector \S+ (\d+)", line)
        if m:
            lanes[m.group(1)] = int(m.group(2))
            continue
        m = re.match(r"\s*(%\S+) = OpFunction ", line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
            continue
        if cur is None:
            continue
        if "OpFunctionEnd" in line:
            cur = None
            continue
        m = re.match(r"\s*(?:(%\S+) = )?(Op\w+)(.*)", line)
        if m:
            funcs[cur].append((m.group(2), m.group(3).split()))
            if m.group(2) == "OpAccessChain" and "Workgroup" in m.group(3).split()[0]:
                lanes.setdefault("workgroup pointers", set()).add(m.group(1))
    return names, lanes, funcs


def cost(fid, funcs, lanes, memo):
    """(ALU lane-ops, workgroup-memory loads) of one call of function `fid`."""
    if fid in memo:
        return memo[fid]
    alu = lds = 0
    for op, args in funcs[fid]:
        if op == "OpFunctionCall":
            a, l = cost(args[1], funcs, lanes, memo)
            alu, lds = alu + a, lds + l
        elif op == "OpLoad":
            lds += args[1] in lanes.get("workgroup pointers", ())
        elif op in FREE or op in CONTROL or op in ("OpAccessChain", "OpStore"):
            continue
        else:
            alu += lanes.get(args[0], 1) if args else 1
    memo[fid] = (alu, lds)
    return alu, lds


def main():
    args = sys.argv[1:]
    if "-h" in args or "--help" in args:
        print(__doc__)
        return
    xt = "4096"
    if "--xt" in args:
        k = args.index("--xt")
        if k + 1 >= len(args) or not args[k + 1].isdigit():
            sys.exit("--xt wants a number of columns (a multiple of 512, e.g. 4096)")
        xt = args[k + 1]
        del args[k:k + 2]
    if len(args) > 1 or (args and args[0].startswith("-")):
        sys.exit(f"unexpected arguments {args}; usage: spirv_counts.py [BINARY] [--xt COLUMNS]")
    binary = args[0] if args else "target/release/inkling-wgpu"
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        sys.exit(f"{binary}: not an executable inkling-wgpu binary (cargo build --release)")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "shaders")
        sh(binary, "shaders", "--out", out)
        index = json.load(open(os.path.join(out, "index.json")))["kernels"]
        seen = set()
        print(f"{'format':<10} {'instantiation':<40} {'weights/unit':>12} {'ALU/weight':>10} "
              f"{'LDS/weight':>10} {'global loads/weight':>19}")
        for k in index:
            key = k["key"]
            m = re.match(rf"gemv:([^:]+):sg:(\d+)x(\d+):xstaged:{xt}:c1$", key)
            if not m or m.group(1) in seen:
                continue
            seen.add(m.group(1))
            text = spirv_text(os.path.join(out, k["file"]), tmp)
            names, lanes, funcs = parse(text)
            by_name = {v: f for f, v in names.items() if f in funcs}
            if "unit_dot" not in by_name:
                sys.exit(f"{key}: no function unit_dot in its SPIR-V (wgsl/gemv.wgsl changed?)")
            unit_dot = by_name["unit_dot"]
            alu, lds = cost(unit_dot, funcs, lanes, {})
            src = open(os.path.join(out, k["file"])).read()
            cpu = int(re.search(r"const COLS_PER_UNIT: u32 = (\d+)u;", src).group(1))
            wpu = int(re.search(r"const WORDS_PER_UNIT: u32 = (\d+)u;", src).group(1))
            enc = m.group(1)
            scales = 2 if enc == "int3-g64" else (1 if enc.startswith("int4-g") else 0)
            print(f"{enc:<10} {key:<40} {cpu:>12} {alu / cpu:>10.2f} {lds / cpu:>10.3f} "
                  f"{(wpu + scales) / cpu:>19.3f}")
        if not seen:
            sys.exit(f"no GEMV instantiation with an x tile of {xt} columns in `shaders --out`")


if __name__ == "__main__":
    main()
