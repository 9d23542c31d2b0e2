#!/usr/bin/env python3
"""Finds call cycles between C source files: file A uses a function defined in file B and B
uses one defined in A (directly, or through a longer loop). A use is any mention of a
function defined in another file outside comments and strings: a call, or its address taken
(a handler table), since both make A depend on B. Static functions stay in their file and
never count, nor does main (one per program).

    scripts/call_cycles.py [--edges] DIR_OR_FILE...

Prints each cycle (a strongly connected component of more than one file) with the functions
that make its arrows, and exits 1 when there is one; 0 and "no cycles" otherwise. --edges
also prints every arrow (file -> file: functions), the picture of who calls whom.
"""
import os
import re
import sys

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# a function definition at the start of a line: return type and name, then "(" ... ")" and
# "{" on a later line (tide's format), not a prototype ending in ";"
DEF = re.compile(r"^(?!static\b)(?:[A-Za-z_][\w \t\*]*?[\s\*])([A-Za-z_]\w*)\s*\(", re.M)


def strip(text):
    """The text without comments, string and character literals (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(" ")
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def definitions(code):
    """Names of the non-static functions defined in code (a body follows the prototype)."""
    names = set()
    for m in DEF.finditer(code):
        depth, j = 0, m.end() - 1
        while j < len(code):
            if code[j] == "(":
                depth += 1
            elif code[j] == ")":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        rest = code[j + 1 :].lstrip()
        line = code[m.start() : code.find("\n", m.start())]
        # main: one per program, never called across files
        if (rest.startswith("{") and m.group(1) != "main"
                and not line.startswith(("typedef", "return", "else"))):
            names.add(m.group(1))
    return names


def sources(args):
    for a in args:
        if os.path.isdir(a):
            for f in sorted(os.listdir(a)):
                if f.endswith(".c"):
                    yield os.path.join(a, f)
        else:
            yield a


def sccs(nodes, edges):
    """Tarjan's strongly connected components of the graph."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def main(argv):
    show_edges = "--edges" in argv
    args = [a for a in argv if a != "--edges"]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    code = {f: strip(open(f, encoding="utf-8", errors="replace").read()) for f in sources(args)}
    owner = {}
    for f, text in code.items():
        for name in definitions(text):
            owner.setdefault(name, f)
    edges = {}
    for f, text in code.items():
        for name in set(IDENT.findall(text)):
            g = owner.get(name)
            if g is not None and g != f:
                edges.setdefault(f, {}).setdefault(g, set()).add(name)
    if show_edges:
        for f in sorted(edges):
            for g in sorted(edges[f]):
                print("%s -> %s: %s" % (f, g, ", ".join(sorted(edges[f][g]))))
    cycles = [c for c in sccs(code.keys(), edges) if len(c) > 1]
    for c in cycles:
        print("cycle: " + " <-> ".join(c))
        for f in c:
            for g in c:
                if g in edges.get(f, {}):
                    print("  %s -> %s: %s" % (f, g, ", ".join(sorted(edges[f][g]))))
    if not cycles:
        print("no cycles among %d files" % len(code))
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
