#!/usr/bin/env python3
"""cu2cpp.py - turn a CUDA source into C++ that g++ compiles against test/cudasim/include/cudasim.h.

Usage: cu2cpp.py INPUT.cu -o OUTPUT.cpp [-I DIR]...

Only what is not C++ is rewritten; every other character is kept, and #line directives keep
compiler errors and cudasim reports pointing at the original files and lines:
  * `kernel<targs><<<grid, block[, smem[, stream]]>>>(args)` becomes
    `::cudasim::launch("kernel<targs>", ADDR, grid, block, smem, stream, __FILE__, __LINE__,
     [=](auto&&... a) { kernel<targs>(a...); }, args)`; ADDR is the kernel's address for the
    cudaFuncSetAttribute lookup, or nullptr when the name is a function template whose
    arguments are deduced from the call (its address cannot be named). The body captures by
    value (a kernel named through a local function pointer), so a launch recorded during stream
    capture can run after the launching scope has returned.
  * `__shared__ T name[N]...;` becomes a reference to per-block storage:
    `T (&name)[N] = ::cudasim::shared_var<T[N], ID>("name (file:line)");`
  * `extern __shared__ T name[];` becomes `T *name = (T *)::cudasim::detail::dynamic_shared();`
  * `#include "x"` of a file found next to the includer or in a -I directory is inlined
    (recursively, once per include stack; `#pragma once` honoured), so launches and shared
    declarations in project headers (.cuh) are translated too.
Comments, string and character literals are never rewritten. Multi-line constructs keep their
line breaks (and backslash continuations inside macros), so line numbers stay exact.
"""
import os
import re
import sys


def mask_code(text):
    """Same-length copy of text with comments and string/char literal contents blanked."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                out[k] = " "
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if text[k] != "\n":
                    out[k] = " "
            i = j
        elif c == '"' or c == "'":
            # raw strings R"d(...)d"
            if c == '"' and i > 0 and text[i - 1] == "R":
                m = re.match(r'"([^(\s]*)\(', text[i:])
                if m:
                    end = text.find(")" + m.group(1) + '"', i)
                    end = n if end < 0 else end + len(m.group(1)) + 2
                    for k in range(i + 1, end - 1):
                        if text[k] != "\n":
                            out[k] = " "
                    i = end
                    continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            for k in range(i + 1, min(j, n)):
                out[k] = " "
            i = j + 1
        else:
            i += 1
    return "".join(out)


def match_forward(code, i, open_c, close_c):
    """Index just past the bracket matching code[i] (== open_c)."""
    depth = 0
    for j in range(i, len(code)):
        if code[j] == open_c:
            depth += 1
        elif code[j] == close_c:
            depth -= 1
            if depth == 0:
                return j + 1
    raise SyntaxError("unbalanced '%s'" % open_c)


def split_top(s):
    """Split s at commas outside (), [], {}."""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def keep_breaks(span):
    """The line breaks of span (with any backslash continuations) to append after a rewrite."""
    return "".join(" " + nl for nl in re.findall(r"\\?\n", span))


def template_kernels(code):
    """Names of __global__ functions declared as templates (deduced calls have no address)."""
    names = set()
    for m in re.finditer(r"\b__global__\b", code):
        back = code[max(0, m.start() - 400):m.start()]
        cut = max(back.rfind(";"), back.rfind("}"), back.rfind("{"))
        if not re.search(r"\btemplate\b", back[cut + 1:]):
            continue
        rest = re.sub(r"__launch_bounds__\s*\([^)]*\)", " ", code[m.end():m.end() + 400])
        fm = re.search(r"(\w+)\s*\(", rest)
        if fm:
            names.add(fm.group(1))
    return names


class Translator:
    def __init__(self, include_dirs):
        self.include_dirs = include_dirs
        self.shared_id = 0
        self.pragma_once_done = set()
        self.template_names = set()

    def line_of(self, text, pos):
        return text.count("\n", 0, pos) + 1

    def rewrite_launches(self, text, code, path):
        out, last = [], 0
        for m in re.finditer(r"<<<", code):
            start_cfg = m.start()
            if start_cfg < last:
                continue
            # kernel expression before <<<: identifier(::identifier)* optionally <targs>
            k = start_cfg
            while k > 0 and code[k - 1].isspace():
                k -= 1
            if code[k - 1] == ">":
                depth, j = 0, k - 1
                while j >= 0:
                    if code[j] == ")":  # skip parenthesised template arguments like (1 << 2)
                        pd = 0
                        while j >= 0:
                            pd += code[j] == ")"
                            pd -= code[j] == "("
                            if pd == 0:
                                break
                            j -= 1
                    elif code[j] == ">":
                        depth += 1
                    elif code[j] == "<":
                        depth -= 1
                        if depth == 0:
                            break
                    j -= 1
                k = j
            nm = re.search(r"((?:::)?\w+(?:\s*::\s*\w+)*)\s*$", code[:k])
            if not nm:
                raise SyntaxError("%s:%d: cannot find the kernel name before <<<" % (path, self.line_of(text, start_cfg)))
            kstart = nm.start(1)
            kernel = re.sub(r"\s+", " ", text[kstart:start_cfg].strip())
            end_cfg = code.find(">>>", start_cfg)
            if end_cfg < 0:
                raise SyntaxError("%s:%d: <<< without >>>" % (path, self.line_of(text, start_cfg)))
            cfg = [c.strip() for c in split_top(text[start_cfg + 3:end_cfg])]
            if not 2 <= len(cfg) <= 4:
                raise SyntaxError("%s:%d: launch configuration needs 2 to 4 arguments, got %d"
                                  % (path, self.line_of(text, start_cfg), len(cfg)))
            while len(cfg) < 4:
                cfg.append("0")
            p = end_cfg + 3
            while p < len(code) and code[p].isspace():
                p += 1
            if p >= len(code) or code[p] != "(":
                raise SyntaxError("%s:%d: expected '(' after >>>" % (path, self.line_of(text, start_cfg)))
            pend = match_forward(code, p, "(", ")")
            args = text[p + 1:pend - 1].strip()
            base = kernel.split("<")[0].strip().split("::")[-1].strip()
            deduced = "<" not in kernel and base in self.template_names
            addr = "nullptr" if deduced else "::cudasim::kaddr(%s)" % kernel
            call = ('::cudasim::launch("%s", %s, %s, %s, %s, %s, __FILE__, __LINE__, '
                    '[=](auto &&...cudasim_a) { %s(cudasim_a...); }%s)'
                    % (kernel.replace('"', '\\"'), addr, cfg[0], cfg[1], cfg[2], cfg[3], kernel,
                       (", " + args) if args else ""))
            call = call.replace("\n", " ")
            out.append(text[last:kstart])
            out.append(call + keep_breaks(text[kstart:pend]))
            last = pend
        out.append(text[last:])
        return "".join(out)

    def rewrite_shared(self, text, code, path):
        out, last = [], 0
        for m in re.finditer(r"\b__shared__\b", code):
            if m.start() < last:
                continue
            # statement start: after the previous ; { } or line start of a directive
            s = m.start()
            while s > 0 and code[s - 1] not in ";{}:\n":
                s -= 1
            prefix = code[s:m.start()]
            if not re.fullmatch(r"\s*(?:(?:extern|static|volatile|__align__\s*\(\s*\d+\s*\)|alignas\s*\(\s*\d+\s*\))\s*)*", prefix):
                # something else precedes (e.g. a label or a macro); start right at __shared__
                if re.search(r"\w", prefix.split("\n")[-1]):
                    s = m.start()
                    prefix = ""
            e = code.find(";", m.end())
            if e < 0:
                raise SyntaxError("%s:%d: __shared__ declaration without ';'" % (path, self.line_of(text, m.start())))
            decl = text[m.end():e]
            line = self.line_of(text, m.start())
            quals = prefix + " " + decl
            extern = re.search(r"\bextern\b", prefix) is not None
            volatile = re.search(r"\bvolatile\b", quals) is not None
            decl = re.sub(r"\b(?:__align__|alignas)\s*\(\s*\d+\s*\)|\bstatic\b|\bvolatile\b|\bextern\b", " ", decl)
            decl = re.sub(r"\s+", " ", decl).strip()
            cv = "volatile " if volatile else ""
            where = "%s:%d" % (os.path.basename(path), line)
            pieces = []
            if extern:
                dm = re.fullmatch(r"(.+?)\s*\b(\w+)\s*\[\s*\]", decl)
                if not dm:
                    raise SyntaxError("%s:%d: cannot parse extern __shared__ declaration '%s'" % (path, line, decl))
                t, name = dm.group(1).strip(), dm.group(2)
                pieces.append("%s%s *%s = reinterpret_cast<%s%s *>(::cudasim::detail::dynamic_shared());" % (cv, t, name, cv, t))
            else:
                parts = split_top(decl)
                fm = re.fullmatch(r"(.+?[\s\*&])\s*(\w+)\s*((?:\[[^\]]*\]\s*)*)", parts[0].strip())
                if not fm:
                    raise SyntaxError("%s:%d: cannot parse __shared__ declaration '%s'" % (path, line, decl))
                t = fm.group(1).strip()
                decls = [(fm.group(2), fm.group(3).strip())]
                for extra in parts[1:]:
                    em = re.fullmatch(r"\s*(\w+)\s*((?:\[[^\]]*\]\s*)*)", extra)
                    if not em:
                        raise SyntaxError("%s:%d: cannot parse declarator '%s'" % (path, line, extra))
                    decls.append((em.group(1), em.group(2).strip()))
                for name, dims in decls:
                    tag = "%s (%s)" % (name, where)
                    full = "%s%s%s" % (cv, t, dims)
                    ref = "(&%s)%s" % (name, dims) if dims else "&%s" % name
                    pieces.append('%s%s %s = ::cudasim::shared_var<%s, %d>("%s");'
                                  % (cv, t, ref, full, self.shared_id, tag))
                    self.shared_id += 1
            out.append(text[last:s])
            indent = re.match(r"[ \t]*", text[s:]).group(0)
            out.append(indent + " ".join(pieces) + keep_breaks(text[s:e + 1]))
            last = e + 1
        out.append(text[last:])
        return "".join(out)

    def resolve(self, name, from_dir):
        for d in [from_dir] + self.include_dirs:
            cand = os.path.normpath(os.path.join(d, name))
            if os.path.isfile(cand):
                return cand
        return None

    def prescan(self, path, seen):
        """Collects template kernel names from path and every project file it includes."""
        real = os.path.realpath(path)
        if real in seen:
            return
        seen.add(real)
        with open(path, encoding="utf-8") as f:
            code = mask_code(f.read())
        self.template_names |= template_kernels(code)
        with open(path, encoding="utf-8") as f:
            for ln in f:
                im = re.match(r'\s*#\s*include\s*"([^"]+)"', ln)
                if im:
                    target = self.resolve(im.group(1), os.path.dirname(path))
                    if target:
                        self.prescan(target, seen)

    def translate_file(self, path, stack):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if not text.endswith("\n"):
            text += "\n"
        code = mask_code(text)
        self.template_names |= template_kernels(code)
        if re.search(r"^\s*#\s*pragma\s+once\b", code, re.M):
            self.pragma_once_done.add(os.path.realpath(path))
            text = re.sub(r"^(\s*#\s*pragma\s+once\b.*)$", r"// \1", text, flags=re.M)
            code = mask_code(text)
        text = self.rewrite_shared(text, code, path)
        text = self.rewrite_launches(text, mask_code(text), path)
        # inline project includes (after rewriting this file, so positions stay valid)
        lines = text.split("\n")
        code_lines = mask_code(text).split("\n")
        out = ['#line 1 "%s"' % path]
        for no, (ln, cl) in enumerate(zip(lines, code_lines), start=1):
            im = re.match(r'\s*#\s*include\s*"([^"]+)"', ln)
            target = None
            if im and re.match(r"\s*#\s*include", cl):
                target = self.resolve(im.group(1), os.path.dirname(path))
            if target and os.path.basename(target) == "cudasim.h":
                target = None
            real = os.path.realpath(target) if target else None
            if target and real in self.pragma_once_done:
                out.append("// cu2cpp: already inlined (#pragma once): " + ln.strip())
            elif target and real not in stack:
                out.append("// cu2cpp: inlined " + ln.strip())
                out.append(self.translate_file(target, stack + [real]))
                out.append('#line %d "%s"' % (no + 1, path))
            else:
                out.append(ln)
        if out[-1] == "":
            out.pop()
        return "\n".join(out)


def main(argv):
    inp, outp, incs = None, None, []
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "-o":
            outp = argv[i + 1]
            i += 2
        elif a == "-I":
            incs.append(argv[i + 1])
            i += 2
        elif a.startswith("-I"):
            incs.append(a[2:])
            i += 1
        elif a in ("-h", "--help"):
            print(__doc__)
            return 0
        elif inp is None:
            inp = a
            i += 1
        else:
            sys.stderr.write("cu2cpp.py: unexpected argument '%s'\n" % a)
            return 2
    if not inp or not outp:
        sys.stderr.write("usage: cu2cpp.py INPUT.cu -o OUTPUT.cpp [-I DIR]...\n")
        return 2
    tr = Translator(incs)
    try:
        tr.prescan(inp, set())
        body = tr.translate_file(inp, [os.path.realpath(inp)])
    except (SyntaxError, OSError) as e:
        sys.stderr.write("cu2cpp.py: error: %s\n" % e)
        return 1
    result = '#include "cudasim.h"\n' + body + "\n"
    tmp = outp + ".tmp"
    os.makedirs(os.path.dirname(os.path.abspath(outp)), exist_ok=True)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(result)
    os.replace(tmp, outp)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
