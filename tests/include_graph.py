#!/usr/bin/env python3
"""include_graph.py ROOT - fail on any circle of #include "..." among fp4moe's sources.

A circle of headers compiles only through include guards and the order of the first
include, so a header in one cannot be read on its own and a move breaks the build far
from the change. Every #include "..." line of src/, include/ and cli/ (C, CUDA, .def,
.inc) is an edge; a name resolves as the compiler finds it: next to the including file,
then under src/, include/, cli/ (the targets' include paths). Names that resolve to no
file (generated units, system headers spelled with quotes) are left out. Prints each
circle found and exits 1, or the graph's size and 0.
"""
import os
import re
import sys

EXTS = ('.c', '.h', '.cu', '.cuh', '.def', '.inc')
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else '.')
    dirs = [os.path.join(root, d) for d in ('src', 'include', 'cli')]
    files = [os.path.join(d, f) for top in dirs for d, _, fs in os.walk(top) for f in fs if f.endswith(EXTS)]
    graph = {}
    for f in files:
        with open(f, errors='replace') as fh:
            names = INCLUDE.findall(fh.read())
        edges = []
        for n in names:
            for base in [os.path.dirname(f)] + dirs:
                p = os.path.normpath(os.path.join(base, n))
                if os.path.isfile(p):
                    edges.append(p)
                    break
        graph[f] = sorted(set(edges))
    # iterative depth-first search; a grey node reached again closes a circle
    WHITE, GREY, BLACK = 0, 1, 2
    color = dict.fromkeys(graph, WHITE)
    circles = []
    for start in sorted(graph):
        if color[start] != WHITE:
            continue
        stack = [(start, iter(graph[start]))]
        path = [start]
        color[start] = GREY
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                color[node] = BLACK
                stack.pop()
                path.pop()
                continue
            c = color.setdefault(nxt, WHITE)
            if c == GREY:
                circles.append(path[path.index(nxt):] + [nxt])
            elif c == WHITE:
                color[nxt] = GREY
                path.append(nxt)
                stack.append((nxt, iter(graph.get(nxt, []))))
    rel = lambda p: os.path.relpath(p, root)
    for c in circles:
        print('FAIL include circle: ' + ' -> '.join(rel(p) for p in c))
    n_edges = sum(len(e) for e in graph.values())
    print(f'{len(graph)} files, {n_edges} includes, {len(circles)} circles')
    sys.exit(1 if circles else 0)


if __name__ == '__main__':
    main()
