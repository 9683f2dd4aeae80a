#!/usr/bin/env python3
"""Moves and renames of source files and types, applied to the whole tree.

Idempotent: every step checks what is already done, so it can run again
after other branches (which may still use the old names) are merged.

  1. Engine gets its own files: src/runtime/engine.{h,cpp} hold Engine and
     kDefaultUbatch, cut out of src/runtime/session.{h,cpp}, which keep
     Session (and include engine.h). Files that use Engine but not Session
     include runtime/engine.h instead of runtime/session.h.
  2. Headers that moved: exec/sequence_state.h -> ir/sequence_state.h;
     ops/{gate,recurrent,residual_stream}.h (op parameters only) ->
     ir/op_params.h; runtime/generator.h -> spec/generator.h (Generator,
     GeneratorOptions, GenResult) or runtime/generation.h (the rest).
  3. The server scheduler's row of the batch: Scheduler::Slot -> BatchRow
     (slots_ -> rows_), so that Slot means only the IR's activation slot.
  4. The tokenizer's hash-table slot: PieceIndex::Slot -> Bucket (slots_ -> buckets_).

  scripts/rename_sources.py [--root DIR]
"""
import argparse
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CODE_DIRS = ("src", "tools", "tests", "bench", "fuzz")


def code_files(root):
    for d in CODE_DIRS:
        for p in sorted((root / d).rglob("*")):
            if p.suffix in (".h", ".cpp") and p.is_file():
                yield p


def write_if_changed(p, old, new, done):
    if new != old:
        p.write_text(new, encoding="utf-8")
        done.append(p)


def git(root, *args):
    if (root / ".git").exists():
        subprocess.run(["git", *args], cwd=root, check=True)


def cut_block(text, start_pat, end_pat):
    """Removes and returns text from the line matching start_pat (with the
    comment lines right above it) through the first line matching end_pat."""
    lines = text.split("\n")
    s = next((i for i, l in enumerate(lines) if re.match(start_pat, l)), None)
    if s is None:
        return text, None
    while s > 0 and lines[s - 1].startswith("//"):
        s -= 1
    e = next(i for i in range(s, len(lines)) if re.match(end_pat, lines[i]))
    block = "\n".join(lines[s : e + 1])
    rest = lines[:s] + lines[e + 1 :]
    while s < len(rest) and s > 0 and rest[s] == "" and rest[s - 1] == "":
        del rest[s]
    return "\n".join(rest), block


ENGINE_H = """// Engine: steps of one model's DecodeProgram on one executor, for any set
// of sequences, and its prompt pass.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "exec/executor.h"
#include "ir/program.h"
#include "runtime/model.h"

namespace megakern {

class ThreadPool;

{body}

}}  // namespace megakern
"""


def split_engine(root, done):
    sh, sc = root / "src/runtime/session.h", root / "src/runtime/session.cpp"
    eh, ec = root / "src/runtime/engine.h", root / "src/runtime/engine.cpp"
    if eh.exists() or not sh.exists():
        return
    h = sh.read_text(encoding="utf-8")
    h, ubatch = cut_block(h, r"inline constexpr int kDefaultUbatch", r".*kDefaultUbatch = ")
    h, engine = cut_block(h, r"class Engine \{", r"^\};")
    if engine is None:
        sys.exit("src/runtime/session.h: no 'class Engine {' to move")
    body = "\n\n".join(b for b in (ubatch, engine) if b)
    eh.write_text(ENGINE_H.replace("{body}", body).replace("}}", "}"), encoding="utf-8")
    h = h.replace("// Engines and sessions over a runtime Model.", "// Sessions: one sequence over an Engine (runtime/engine.h).")
    h = re.sub(r'#include "exec/executor.h"\n#include "ir/program.h"\n#include "runtime/model.h"\n',
               '#include "runtime/engine.h"\n', h)
    if "ThreadPool" not in h.replace("class ThreadPool;", ""):
        h = h.replace("class ThreadPool;\n\n", "")
    sh.write_text(h, encoding="utf-8")
    c = sc.read_text(encoding="utf-8")
    lines = c.split("\n")
    first = next(i for i, l in enumerate(lines) if l.startswith("Engine::"))
    while first > 0 and lines[first - 1].startswith("//"):
        first -= 1
    last = next(i for i, l in enumerate(lines) if l.startswith("Session::"))
    while last > 0 and lines[last - 1].startswith("//"):
        last -= 1
    eng = "\n".join(lines[first:last]).rstrip() + "\n"
    ec.write_text('#include "runtime/engine.h"\n\n#include <algorithm>\n#include <utility>\n\n#include "core/error.h"\n\n'
                  "namespace megakern {\n\n" + eng + "\n}  // namespace megakern\n", encoding="utf-8")
    rest = "\n".join(lines[:first] + lines[last:])
    # What only the Engine used (and what nothing used).
    for inc in ("#include <unistd.h>\n\n", '#include "model/dense_program.h"\n'):
        rest = rest.replace(inc, "")
    sc.write_text(rest, encoding="utf-8")
    git(root, "add", str(eh), str(ec))
    done += [sh, sc, eh, ec]


def uses(text, names):
    return any(re.search(r"\b" + n + r"\b", text) for n in names)


def replace_include(text, old, new):
    """Replaces #include "old" by #include "new" (dropping it when new is already included)."""
    pat = re.compile(r'^#include "' + re.escape(old) + r'"\n', re.M)
    if not pat.search(text):
        return text
    if re.search(r'^#include "' + re.escape(new) + r'"', text, re.M):
        return pat.sub("", text)
    lines = pat.sub(f'#include "{new}"\n', text, count=1).split("\n")
    # Keep the run of quoted includes around it sorted, if it was.
    i = lines.index(f'#include "{new}"')
    a, b = i, i
    while a > 0 and lines[a - 1].startswith('#include "'):
        a -= 1
    while b + 1 < len(lines) and lines[b + 1].startswith('#include "'):
        b += 1
    before = [l for l in text.split("\n") if l.startswith('#include "')]
    run = lines[a : b + 1]
    if sorted(r for r in run if r != f'#include "{new}"') == [r for r in run if r != f'#include "{new}"'] and \
            before == sorted(before):
        lines[a : b + 1] = sorted(run)
    return "\n".join(lines)


def rewrite_includes(root, done):
    engine_only = ("Engine", "kDefaultUbatch")
    gen_names = ("Generator", "GeneratorOptions", "GenResult")
    for p in code_files(root):
        t = p.read_text(encoding="utf-8")
        n = t
        n = replace_include(n, "exec/sequence_state.h", "ir/sequence_state.h")
        for f in ("gate", "recurrent", "residual_stream"):
            if not (root / f"src/ops/{f}.h").exists():
                n = replace_include(n, f"ops/{f}.h", "ir/op_params.h")
        if (root / "src/runtime/generation.h").exists() and not (root / "src/runtime/generator.h").exists():
            if re.search(r'^#include "runtime/generator.h"', n, re.M):
                n = replace_include(n, "runtime/generator.h",
                                    "spec/generator.h" if uses(n, gen_names) else "runtime/generation.h")
        rel = p.relative_to(root).as_posix()
        if (root / "src/runtime/engine.h").exists() and rel not in ("src/runtime/session.h", "src/runtime/session.cpp"):
            body = re.sub(r'^#include .*\n', "", n, flags=re.M)
            if re.search(r'^#include "runtime/session.h"', n, re.M) and not uses(body, ("Session", "resolve_model_path", "known_model_names")) and uses(body, engine_only):
                n = replace_include(n, "runtime/session.h", "runtime/engine.h")
        write_if_changed(p, t, n, done)


def rename_server_slot(root, done):
    for name in ("src/server/scheduler.h", "src/server/scheduler.cpp"):
        p = root / name
        if not p.exists():
            continue
        t = p.read_text(encoding="utf-8")
        n = re.sub(r"\bSlot\b", "BatchRow", t)
        n = re.sub(r"\bslots_\b", "rows_", n)
        n = re.sub(r"\bauto& slot : ", "auto& row : ", n)
        n = re.sub(r"\bslot->", "row->", n)
        n = re.sub(r"= \*slot;", "= *row;", n)
        n = n.replace("a slot's next token", "a batch row's next token").replace("releasing the slot", "releasing the row")
        write_if_changed(p, t, n, done)


def rename_piece_slot(root, done):
    p = root / "src/tokenizer/piece_index.h"
    if p.exists():
        t = p.read_text(encoding="utf-8")
        write_if_changed(p, t, re.sub(r"\bslots_\b", "buckets_", re.sub(r"\bSlot\b", "Bucket", t)), done)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=pathlib.Path, default=ROOT)
    root = ap.parse_args().root.resolve()
    done = []
    split_engine(root, done)
    rewrite_includes(root, done)
    rename_server_slot(root, done)
    rename_piece_slot(root, done)
    for p in sorted(set(done)):
        print("changed", p.relative_to(root).as_posix())
    if not done:
        print("nothing to change")


if __name__ == "__main__":
    main()
