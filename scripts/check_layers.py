#!/usr/bin/env python3
"""Checks that the folders of src/ and tools/ include only their own layer and
the layers below it, in the order docs/ARCHITECTURE.md gives under
"## Include order", and that every quoted include names a file that exists.

Prints the include graph between folders (edges "a -> b  count"), marks the
edges that go up, and exits 1 when there is one, when an include names no
file, or when a folder is missing from the documented order.

  scripts/check_layers.py [--root DIR]
"""
import argparse
import collections
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCES = ("*.h", "*.cpp")


def read_order(doc):
    """The layers, bottom first: each a set of folders, from the fenced block
    after the "## Include order" heading (one layer a line, top first)."""
    text = doc.read_text(encoding="utf-8")
    m = re.search(r"^## Include order\n.*?^```\n(.*?)^```", text, re.M | re.S)
    if not m:
        sys.exit(f"{doc}: no fenced block under a '## Include order' heading")
    layers = []
    for line in m.group(1).splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            layers.append({f.strip().rstrip("/") for f in line.split() if f.strip()})
    layers.reverse()
    seen = [f for layer in layers for f in layer]
    dups = {f for f in seen if seen.count(f) > 1}
    if dups:
        sys.exit(f"{doc}: folders listed twice in the include order: {', '.join(sorted(dups))}")
    return layers


def folder_of(rel, folders):
    """The most specific listed folder holding rel (a path like src/ops/x.h or tools/x.cpp)."""
    parts = pathlib.PurePosixPath(rel).parts
    if parts[0] == "src":
        parts = parts[1:]
    for n in range(len(parts) - 1, 0, -1):
        f = "/".join(parts[:n])
        if f in folders:
            return f
    return "/".join(parts[:-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=pathlib.Path(__file__).resolve().parent.parent, type=pathlib.Path)
    args = ap.parse_args()
    root = args.root
    layers = read_order(root / "docs" / "ARCHITECTURE.md")
    rank = {f: i for i, layer in enumerate(layers) for f in layer}

    files = sorted(p for d in ("src", "tools") for g in SOURCES for p in (root / d).rglob(g))
    edges = collections.Counter()
    problems = []
    for path in files:
        rel = path.relative_to(root).as_posix()
        src = folder_of(rel, rank)
        if src not in rank:
            problems.append(f"{rel}: folder '{src}' is not in the include order of docs/ARCHITECTURE.md")
            continue
        for inc in INCLUDE.findall(path.read_text(encoding="utf-8", errors="replace")):
            # Quoted includes resolve against src/ (the library's include
            # directory), the project root (tools/), or the including file's folder.
            target = next((t for t in (root / "src" / inc, root / inc, path.parent / inc) if t.is_file()), None)
            if target is None:
                problems.append(f"{rel}: includes \"{inc}\", which is no file")
                continue
            dst = folder_of(target.resolve().relative_to(root.resolve()).as_posix(), rank)
            if dst not in rank:
                problems.append(f"{rel}: includes \"{inc}\" from folder '{dst}', which is not in the include order")
                continue
            if dst != src:
                edges[(src, dst)] += 1
            if rank[dst] > rank[src]:
                problems.append(f"{rel}: includes \"{inc}\": {src} (layer {rank[src]}) includes {dst} (layer {rank[dst]}), above it")

    print("include graph between folders (layer: 0 is the bottom; UP marks an include of a higher layer):")
    for (a, b), n in sorted(edges.items(), key=lambda e: (-rank[e[0][0]], -rank[e[0][1]], e[0])):
        mark = "  UP" if rank[b] > rank[a] else ""
        print(f"  {a:>12} ({rank[a]:2}) -> {b:<12} ({rank[b]:2}) {n:4}{mark}")
    if problems:
        print(f"\n{len(problems)} problem(s):")
        for p in problems:
            print("  " + p)
        return 1
    print(f"\nok: {len(files)} files, no include goes up a layer, every include names a file")
    return 0


if __name__ == "__main__":
    sys.exit(main())
