#!/usr/bin/env python3
"""test_arch_files.py - adding an architecture is its own files (issue 21, item 2; docs/ARCHITECTURES.md).

The MLP-only test architecture ("mlp") lives in OWN_FILES. This test fails when any other file of
the tree names it, apart from
the registration lines in ALLOWED: the model registry's entry (llmc/formats/arch.c, its declaration in
arch.h), the CPU backend's (llmc/cpu/arch.c, its declaration in arch.h) and the CUDA runtime's
(llmc/cuda/archs.cuh: the include of its block sequence, which defines the entry, and its line in
cuda_archs[]).
What "names it" means: any identifier its own files use that starts mlp_, Mlp or MLP_ (its types,
functions, table macros and enums), the paths of its own files, its descriptor "mlp:d". Documentation
(*.md) may mention it. Also checked: every own file exists, and the check itself fails on a planted
use (a line naming MlpConfig in llmc/train/train.c, an include in the CPU registry's file, a call of
the MLP's CUDA code in the CUDA registry's, the MLP's entry named in the CUDA runtime) and passes
planted registration lines.
Exits non-zero on any failure.
"""
import os, re, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.chdir(ROOT)

OWN_FILES = [
    "llmc/models/mlp.h", "llmc/models/mlp.c",          # its table header: config, tables, init, flops
    "llmc/formats/mlpfile.h", "llmc/formats/mlpfile.c",  # its checkpoint file and mlp_arch
    "llmc/cpu/mlp.h", "llmc/cpu/mlp.c",                # the CPU block sequence
    "llmc/cuda/mlp.cuh",                               # the CUDA block sequence
    "dev/reference/train_mlp.py",                      # its reference
    "test/test_mlp_cpu.c", "test/test_mlp_vs_pytorch.sh", "test/test_mlp_cuda.cu",  # its tests
    "test/test_mlp_cuda_sim.py",
    "test/test_arch_files.py", "test/suite.d/13-mlp.txt", "mk/mlp.mk",               # and their build
]
# Registration lines: (files the line may be in, the line's shape): the model registry's entry
# (llmc/formats/arch.c's model_archs[] and arch.h's declaration), the CPU backend's (llmc/cpu/
# arch.c's cpu_archs[] and arch.h's declaration) and the CUDA runtime's (llmc/cuda/archs.cuh: the
# include of the block sequence, whose end defines mlp_cuda_arch, and the entry in cuda_archs[]).
# ./generate_gpu refuses the architecture through its CUDA entry (no KV-cache decode), naming nothing.
ALLOWED = [
    (r"llmc/formats/arch\.h", r"extern const ModelArch mlp_arch;"),
    (r"llmc/formats/arch\.c", r"[^;]*&mlp_arch\b[^;]*(;|,)?"),
    (r"llmc/cpu/arch\.h", r"extern const CpuArch mlp_cpu_arch;"),
    (r"llmc/cpu/arch\.c", r"&mlp_cpu_arch,"),
    (r"llmc/cuda/archs\.cuh", r'#include "llmc/cuda/mlp\.cuh"'),
    (r"llmc/cuda/archs\.cuh", r"&mlp_cuda_arch,"),
]
MAX_ALLOWED_PER_FILE = 3
NAME = re.compile(r"\b(?:mlp_\w+|Mlp\w*|MLP_\w+)\b")
SRC_EXT = (".c", ".h", ".cu", ".cuh", ".cpp", ".py", ".sh", ".mk", ".txt", "Makefile", ".yml", ".json")


def tree_files():
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], check=True,
                         capture_output=True, text=True).stdout.split()
    return sorted(f for f in set(out) if os.path.isfile(f))


def own_names(texts):
    """The identifiers, paths and descriptor of the architecture, from its own files."""
    names = set()
    for path in OWN_FILES:
        names |= set(NAME.findall(texts.get(path, "")))
    names.discard("MLP")
    return names, [p for p in OWN_FILES] + ["mlp:d"]


def violations(texts, names, literals):
    """[(path, line number, line)] naming the architecture outside its files and ALLOWED."""
    bad, allowed_count = [], {}
    for path, text in texts.items():
        if path in OWN_FILES or path.endswith(".md"):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            hit = any(tok in names for tok in NAME.findall(line)) or any(lit in line for lit in literals)
            if not hit:
                continue
            ok = any(re.fullmatch(fre, path) and re.fullmatch(lre, line.strip()) for fre, lre in ALLOWED)
            if ok:
                allowed_count[path] = allowed_count.get(path, 0) + 1
                ok = allowed_count[path] <= MAX_ALLOWED_PER_FILE
            if not ok:
                bad.append((path, n, line.strip()))
    return bad


failed = 0


def check(ok, name, detail=""):
    global failed
    print(("PASS: " if ok else "FAIL: ") + name + ("" if ok else ": " + detail))
    failed |= not ok


def main():
    missing = [p for p in OWN_FILES if not os.path.isfile(p)]
    check(not missing, "every file of the mlp architecture exists", ", ".join(missing))
    texts = {}
    for path in tree_files():
        if not (path.endswith(SRC_EXT) or path.endswith(".md")):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                texts[path] = f.read()
        except UnicodeDecodeError:
            continue
    names, literals = own_names(texts)
    check({"MlpConfig", "MlpModel", "mlp_arch", "MLP_PARAMETERS", "mlp_forward"} <= names,
          "the architecture's own names are found in its files (%d names)" % len(names),
          "missing: %s" % sorted({"MlpConfig", "MlpModel", "mlp_arch", "MLP_PARAMETERS", "mlp_forward"} - names))
    bad = violations(texts, names, literals)
    check(not bad, "no file outside the architecture's own names it (%d files scanned)" % len(texts),
          "; ".join("%s:%d: %s" % b for b in bad[:10]) + (" ..." if len(bad) > 10 else ""))
    # the check itself: a planted use is caught, planted registration lines are not
    planted = dict(texts)
    planted["llmc/train/train.c"] = texts.get("llmc/train/train.c", "") + "\nstatic MlpConfig planted_cfg;\n"
    caught = violations(planted, names, literals)
    check(any(p == "llmc/train/train.c" and "planted_cfg" in l for p, _, l in caught),
          "a planted use of MlpConfig in llmc/train/train.c is caught", repr(caught[:3]))
    planted = dict(texts)
    planted["llmc/formats/arch.c"] = ("const ModelArch *const model_archs[] = {\n    &mlp_arch,\n    &llama3_arch,\n"
                                      "    &gpt2_arch,\n    NULL,\n};\n")
    planted["llmc/cpu/arch.c"] = "const CpuArch *const cpu_archs[] = {\n    &gpt2_cpu_arch,\n    &mlp_cpu_arch,\n    NULL,\n};\n"
    planted_files = ("llmc/formats/arch.c", "llmc/cpu/arch.c")
    wrong = [b for b in violations(planted, names, literals) if b[0] in planted_files]
    check(not wrong, "planted registration lines (the registries' entries) are allowed", repr(wrong))
    planted["llmc/cpu/arch.c"] += '#include "llmc/cpu/mlp.h"\n'
    caught = [b for b in violations(planted, names, literals) if b[0] in planted_files]
    check(len(caught) == 1 and "mlp.h" in caught[0][2], "a planted line beyond the registry entry in a registry's file is caught",
          repr(caught))
    # the CUDA registry: its two lines pass; a third naming the MLP's code there, or the runtime naming its entry, is caught
    cuda_reg = "llmc/cuda/archs.cuh"
    regs = texts.get(cuda_reg, "")
    check('#include "llmc/cuda/mlp.cuh"' in regs and "&mlp_cuda_arch," in regs,
          "the CUDA registry (%s) includes the MLP's block sequence and lists mlp_cuda_arch" % cuda_reg, regs[-300:])
    planted = dict(texts)
    planted[cuda_reg] = regs + "\nstatic const size_t planted = sizeof(mlp_cuda_activation_specs);\n"
    planted["llmc/cuda/cudamodel.cuh"] = texts.get("llmc/cuda/cudamodel.cuh", "") + "\n    if (m->arch == &mlp_cuda_arch) return;\n"
    caught = violations(planted, names, literals)
    check(any(p == cuda_reg and "planted" in l for p, _, l in caught)
          and any(p == "llmc/cuda/cudamodel.cuh" and "mlp_cuda_arch" in l for p, _, l in caught)
          and not any(p == cuda_reg and "planted" not in l for p, _, l in caught),
          "a planted use of the MLP's CUDA code in the CUDA registry or of its entry in the runtime is caught "
          "(the registry's own two lines are not)", repr(caught[:4]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
