#!/usr/bin/env python3
"""Import cycles between the files of one Rust crate, test code left out.

Usage: scripts/module-cycles.py [SRC_DIR] [--edges] [--folders]

Reads every `.rs` file below SRC_DIR (default `acp-runtime/src`), blanks
comments and string literals, drops `#[cfg(test)]` items and `tests.rs`
files, and collects each file's references to other files of the crate:
`use` declarations (`crate::`, `super::`, `self::` and child modules) and
inline `crate::`/`super::`/`self::` and child-module paths. A path that names an item a
module re-exports (`pub use`) counts as a reference to the file that defines
it. Prints the strongly connected components of more than one file (the
import cycles) and, with `--edges`, every edge.

With `--folders`, each top-level module of the crate (a folder such as
`agent/` with everything below it, or a file such as `budget.rs`) is one
node, and the cycles printed are those between them: `agent/` importing
`memory/` while a file of `memory/` imports one of `agent/` is a cycle even
when no two files import each other.
"""

import os
import re
import sys


def blank(text):
    """`text` with comments and string/char literals replaced by spaces."""
    out = list(text)
    i, n = 0, len(text)

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            wipe(i, j)
            i = j
        elif re.match(r'b?r(#*)"', text[i : i + 260]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'b?r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            wipe(i, j)
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            wipe(i, j + 1)
            i = j + 1
        elif c == "'":
            m = re.match(r"'(\\.[^']*|[^\\'])'", text[i:])
            if m:
                wipe(i, i + m.end())
                i += m.end()
            else:
                i += 1  # a lifetime
        else:
            i += 1
    return "".join(out)


def item_end(text, i):
    """The end of the item starting at `i`: after its `;` or its `{...}`."""
    depth = 0
    while i < len(text):
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        elif c == ";" and depth == 0:
            return i + 1
        i += 1
    return i


def drop_tests(text):
    """`text` without the items under `#[cfg(test)]`."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]", text)
        if not m:
            return text
        end = item_end(text, m.end())
        text = text[: m.start()] + "\n" * text[m.start() : end].count("\n") + text[end:]


def split_top(s):
    parts, depth, cur = [], 0, ""
    for c in s:
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def use_paths(tree, prefix=()):
    """The full paths a use tree names (`a::{b, c::d}` -> a::b, a::c::d)."""
    tree = re.sub(r"\s+", "", tree)
    tree = re.sub(r"\bas\w+$", "", tree)
    m = re.match(r"^((?:\w+::)*)\{(.*)\}$", tree)
    if m:
        head = tuple(x for x in m.group(1).split("::") if x)
        out = []
        for part in split_top(m.group(2)):
            out.extend(use_paths(part, prefix + head))
        return out
    segs = [x for x in tree.split("::") if x]
    if segs and segs[-1] == "self":
        segs = segs[:-1]
    return [prefix + tuple(segs)]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    show_edges = "--edges" in sys.argv
    root = args[0] if args else "acp-runtime/src"

    modules = {}  # module path -> file
    for dirpath, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            parts = rel[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            modules[tuple(parts)] = rel

    texts, reexports, raw_uses = {}, {}, {}
    for mod, rel in modules.items():
        if mod and mod[-1] == "tests":
            continue
        with open(os.path.join(root, rel)) as f:
            texts[mod] = drop_tests(blank(f.read()))

    def absolute(mod, path):
        """`path` as seen from module `mod`, from the crate root, or None."""
        if not path:
            return None
        if path[0] == "crate":
            return path[1:]
        here = list(mod)
        if path[0] in ("self", "super"):
            while path and path[0] in ("self", "super"):
                if path[0] == "super":
                    here = here[:-1]
                path = path[1:]
            return tuple(here) + tuple(path)
        if mod + (path[0],) in modules:
            return mod + tuple(path)
        return None  # an external crate or std

    for mod, text in texts.items():
        uses, pubs = [], {}
        for m in re.finditer(r"(?:^|\n)\s*(pub(?:\([\w:]+\))?\s+)?use\s+([^;]+);", text):
            for path in use_paths(m.group(2)):
                full = absolute(mod, path)
                if full is None:
                    continue
                uses.append(full)
                if m.group(1) and full:
                    pubs[full[-1]] = full
        reexports[mod] = pubs
        raw_uses[mod] = uses

    def resolve(path, seen=()):
        """The module file that defines what `path` names."""
        for k in range(len(path), -1, -1):
            if path[:k] in modules:
                base = path[:k]
                break
        rest = path[k:]
        if rest and rest[0] in reexports.get(base, {}) and (base, rest[0]) not in seen:
            return resolve(reexports[base][rest[0]] + rest[1:], seen + ((base, rest[0]),))
        return base

    edges = {}
    for mod, text in texts.items():
        targets = set(raw_uses[mod])
        for m in re.finditer(r"(?<![\w:])((?:crate|super|self)(?:::\w+)+)", text):
            before = text[max(0, m.start() - 200) : m.start()]
            if re.search(r"\buse\s+[^;]*$", before):
                continue  # part of a use declaration, already read
            full = absolute(mod, tuple(m.group(1).split("::")))
            if full is not None:
                targets.add(full)
        # Inline paths through a child module (`problem::response` in a mod.rs).
        for m in re.finditer(r"(?<![\w:])(\w+)::", text):
            if mod + (m.group(1),) in modules:
                targets.add(mod + (m.group(1),))
        edges[mod] = sorted({resolve(t) for t in targets} - {mod})

    name = lambda mod: modules[mod]
    if "--folders" in sys.argv:
        def top(mod):
            if not mod:
                return os.path.basename(modules[mod])
            return mod[0] + "/" if any(len(m) > 1 and m[0] == mod[0] for m in modules) else modules[(mod[0],)]
        folded = {}
        for mod, targets in edges.items():
            folded.setdefault(top(mod), set()).update(top(t) for t in targets)
        edges = {node: sorted(targets - {node}) for node, targets in folded.items()}
        name = lambda node: node
    if show_edges:
        for mod in sorted(edges, key=name):
            for t in edges[mod]:
                print(f"{name(mod)} -> {name(t)}")
        print()

    # Tarjan's strongly connected components.
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, []):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            sccs.append(scc)

    sys.setrecursionlimit(10000)
    for v in sorted(edges, key=name):
        if v not in index:
            strong(v)
    cycles = sorted((sorted(name(m) for m in s) for s in sccs if len(s) > 1), key=len, reverse=True)
    unit = "folders and top-level files" if "--folders" in sys.argv else "files"
    print(f"{len(cycles)} cycle(s) among {len(edges)} {unit}")
    for scc in cycles:
        print(f"- {len(scc)} {unit}: " + ", ".join(scc))


if __name__ == "__main__":
    main()
