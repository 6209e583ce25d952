#!/usr/bin/env python3
"""test_cu2cpp.py - checks the launch/__shared__ translator on tricky inputs, then compiles the
result with g++ against cudasim.h (syntax only) so a rewrite that is not valid C++ fails."""
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cu2cpp  # noqa: E402

failures = 0


def check(name, ok, detail=""):
    global failures
    if ok:
        print("PASS: cu2cpp: " + name)
    else:
        failures += 1
        print("FAIL: cu2cpp: %s: %s" % (name, detail))


HEADER = '#pragma once\ntemplate <int N> __global__ void hdr_kernel(float* p) { __shared__ float s[N]; s[0] = 1; p[0] = s[0]; }\n'
SOURCE = r'''#include "tricky_hdr.cuh"
#include "tricky_hdr.cuh"
#include <type_traits>
// a comment with kernel<<<1, 1>>>(x) must stay
template <typename T, int B>
__global__ void __launch_bounds__(256) tk(T* p, int n) {
    static __shared__ T a[B], b[B * 2];
    __shared__ volatile int flag;
    extern __shared__ __align__(16) char dyn[];
    float* f = reinterpret_cast<float*>(dyn);
    if (threadIdx.x == 0) flag = 1;
    a[0] = b[0] = (T)f[0];
    p[0] = a[0] + (T)flag + (T)n;
}
template <typename T>
__global__ void deduced(T* p, std::bool_constant<true>) { p[0] = 1; }
__global__ void plain(float* p) { p[0] = 2; }
void host(float* p, cudaStream_t s) {
    const char* str = "not a launch: k<<<1,1>>>(p)";
    (void)str;
    tk<float, 4><<<dim3(1, 1), 32, 16, s>>>(p, 3);
    tk<float, (1 << 2)>
        <<<1,
           32, 16>>>(
            p,
            3);
    deduced<<<1, 1>>>(p, std::bool_constant<true>{});
    plain<<<1, 1>>>(p);
    hdr_kernel<8><<<1, 1>>>(p);
}
int main() { return 0; }
'''


def main():
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "tricky.cu")
        out = os.path.join(d, "tricky.cpp")
        with open(os.path.join(d, "tricky_hdr.cuh"), "w") as f:
            f.write(HEADER)
        with open(src, "w") as f:
            f.write(SOURCE)
        rc = cu2cpp.main(["cu2cpp.py", src, "-o", out])
        check("translates without error", rc == 0, "rc %d" % rc)
        text = open(out).read()
        body = text.split("\n")
        check("cudasim.h included first", body[0] == '#include "cudasim.h"', body[0])
        check("comment left alone", "a comment with kernel<<<1, 1>>>(x) must stay" in text)
        check("string left alone", '"not a launch: k<<<1,1>>>(p)"' in text)
        check("template launch rewritten",
              '::cudasim::launch("tk<float, 4>", ::cudasim::kaddr(tk<float, 4>), dim3(1, 1), 32, 16, s,' in text, text)
        check("multi-line launch rewritten", '::cudasim::launch("tk<float, (1 << 2)>"' in text)
        check("deduced template gets no address", '::cudasim::launch("deduced", nullptr, 1, 1, 0, 0,' in text)
        check("plain kernel address", '::cudasim::kaddr(plain), 1, 1, 0, 0,' in text)
        check("no <<< left outside comments/strings",
              all("<<<" not in ln or "//" in ln or '"' in ln for ln in body), "")
        check("static __shared__ with two declarators",
              re.search(r"T \(&a\)\[B\] = ::cudasim::shared_var<T\[B\], \d+>\(\"a \(tricky.cu:7\)\"\); "
                        r"T \(&b\)\[B \* 2\] = ::cudasim::shared_var<T\[B \* 2\], \d+>", text) is not None)
        check("volatile scalar __shared__", re.search(r"volatile int &flag = ::cudasim::shared_var<volatile int, \d+>", text) is not None)
        check("extern __shared__ with __align__",
              "char *dyn = reinterpret_cast<char *>(::cudasim::detail::dynamic_shared());" in text)
        check("header inlined once (pragma once)", text.count("void hdr_kernel") == 1 and "// cu2cpp: inlined" in text)
        check("header's __shared__ translated", "shared_var<float[N]" in text)
        # line numbers: the multi-line launch keeps its line breaks, so 'deduced<<<' stays on its line
        m = [i for i, ln in enumerate(body) if '::cudasim::launch("deduced"' in ln]
        last_line = [ln for ln in body[:m[0]] if ln.startswith("#line")][-1] if m else ""
        start = body.index(last_line) if last_line else 0
        want = SOURCE.split("\n").index("    deduced<<<1, 1>>>(p, std::bool_constant<true>{});") + 1
        got = int(last_line.split()[1]) + (m[0] - start - 1) if m else -1
        check("line numbers preserved across rewrites", got == want, "got %d want %d" % (got, want))
        cxx = os.environ.get("CXX", "g++")
        cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        p = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-I", os.path.join(HERE, "include"),
                            "-isystem", os.path.join(cuda, "include"), out], capture_output=True, text=True)
        check("translated output compiles with g++ -Wall -Wextra, no warnings",
              p.returncode == 0 and p.stderr.strip() == "", p.stderr[:2000])
        bad = os.path.join(d, "bad.cu")
        with open(bad, "w") as f:
            f.write("void f() { k<<<1>>>(); }\n")
        p = subprocess.run([sys.executable, os.path.join(HERE, "cu2cpp.py"), bad, "-o", os.path.join(d, "bad.cpp")],
                           capture_output=True, text=True)
        check("malformed launch is an error naming file:line", p.returncode != 0 and "bad.cu:1" in p.stderr, p.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
