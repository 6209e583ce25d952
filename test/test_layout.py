#!/usr/bin/env python3
"""test_layout.py - the llmc/ layout (issue 21) holds:
  1. no source file includes a path with '../', and every project include is written from the root
     ("llmc/core/check.h"), so no include depends on where its file stands;
  2. no include loop between modules (a module is one .c/.cu/.cpp with its .h/.cuh: x.c + x.h);
  3. no folder of llmc/ includes a folder above it in LAYERS (lowest first; folders on one line
     may not include each other either);
  4. every binary and test binary `make` builds exists and is newer than the sources of llmc/ and the
     root (run by `make test` after its build: the tree that is tested is the tree that was built).
Exits non-zero on any failure.
"""
import os, re, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.chdir(ROOT)
# llmc/'s folders, lowest layer first; a folder may include only its own layer's files and lower ones.
LAYERS = [
    ["core"],                     # checks, dtypes, tensor tables, memory accounting, files, rng, logs
    ["models", "data", "dist"],   # architectures' tables and configs; data; process groups
    ["formats"],                  # model/state/HF files and the architecture table (includes no cpu/)
    ["cpu"],                      # CPU ops, block sequences and their per-architecture table (cpu/arch.h
                                  # reads formats/arch.h's ModelArch and ArchConfig)
    ["generate"],                 # sampling and the generation front end
    ["train"],                    # flags, the loop, optimizer, plan, budget
    ["cuda"],                     # the CUDA backend (its host code uses everything below)
]
SRC = (".c", ".h", ".cu", ".cuh", ".cpp")
failed = 0


def check(ok, name, detail=""):
    global failed
    print(("PASS: " if ok else "FAIL: ") + name + ("" if ok else ": " + detail))
    failed |= not ok


files = [f for f in subprocess.check_output(["git", "ls-files"], text=True).split("\n") if f.endswith(SRC)]
files += [f for f in subprocess.check_output(["git", "ls-files", "--others", "--exclude-standard"], text=True)
          .split("\n") if f.endswith(SRC)]
fset = set(files)
inc = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
dotdot, relative, edges = [], [], {}


def module(p):
    return os.path.splitext(p)[0]


for f in files:
    text = open(f, encoding="utf-8", errors="replace").read()
    for name in inc.findall(text):
        if "../" in name:
            dotdot.append(f"{f}: {name}")
            continue
        if name in fset:
            target = name
        elif f.startswith("test/cudasim/include/"):
            continue  # the harness's own include folder (-I test/cudasim/include), like system headers
        elif os.path.normpath(os.path.join(os.path.dirname(f), name)) in fset:
            relative.append(f"{f}: {name}")
            target = os.path.normpath(os.path.join(os.path.dirname(f), name))
        else:
            continue  # a system header, or the harness's -I test/cudasim/include
        a, b = module(f), module(target)
        if a != b:
            edges.setdefault(a, set()).add(b)

check(not dotdot, "no source file includes a path with '../'", "; ".join(dotdot[:10]))
check(not relative, "every project include is root-relative", "; ".join(relative[:10]))

# 2. loops: strongly connected components of more than one module (Tarjan)
index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]
sys.setrecursionlimit(10000)


def strong(v):
    index[v] = low[v] = counter[0]; counter[0] += 1
    stack.append(v); on.add(v)
    for w in edges.get(v, ()):
        if w not in index:
            strong(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: comps.append(sorted(comp))


for v in list(edges):
    if v not in index: strong(v)
check(not comps, f"no include loop between modules ({len(edges)} modules with includes)",
      " | ".join(" <-> ".join(c) for c in comps))

# 3. layers
level = {d: i for i, row in enumerate(LAYERS) for d in row}
upward, unknown = [], set()
for a, bs in edges.items():
    pa = a.split("/")
    if pa[0] != "llmc": continue
    if len(pa) < 3: unknown.add(a); continue
    for b in bs:
        pb = b.split("/")
        if pb[0] != "llmc" or len(pb) < 3: continue
        if pa[1] not in level or pb[1] not in level:
            unknown.add(a if pa[1] not in level else b); continue
        if pa[1] != pb[1] and level[pb[1]] >= level[pa[1]]:
            upward.append(f"{a} -> {b}")
check(not unknown, "every llmc/ source file is in a folder of LAYERS", ", ".join(sorted(unknown)))
check(not upward, "no llmc/ folder includes its own layer's other folders or a higher one", "; ".join(sorted(upward)))

# 4. every binary make builds exists and is newer than every source file of the tree (`make -q` cannot
# say this: the commit stamp that rundir.o depends on is always remade)
if "--no-make" not in sys.argv:
    out = subprocess.run(["make", "-s", "--no-print-directory", "print-BIN_PATHS", "print-TEST_BINS"],
                         capture_output=True, text=True)
    names = out.stdout.split()
    newest = max(os.path.getmtime(f) for f in files if f.startswith("llmc/") or "/" not in f)
    missing = [t for t in names if not os.path.exists(t)]
    stale = [t for t in names if os.path.exists(t) and os.path.getmtime(t) < newest]
    check(bool(names) and not missing and not stale,
          f"all {len(names)} binaries and test binaries built, none older than a source file of llmc/ or the root",
          f"missing: {' '.join(missing[:8])}; older: {' '.join(stale[:8])}")
sys.exit(1 if failed else 0)
