#!/usr/bin/env python3
"""The folders include one another only as docs/ARCHITECTURE.md's map says.

The map's code block under "## The map" has one entry per source folder: a
line starting with `folder/` at column 0, then (indented) one line
`-> a, b/file.h, ...` (a trailing comma continues it on the next line)
naming what the folder's files may include: a folder (any header in it) or
one header (that header only), or `-> nothing`.

The test reads every `#include "x/..."` of every .h/.cpp/.cu/.cuh file in
every top-level source folder (tests/ and generated build folders aside) and
fails, naming the file and the line, on
- an include of another folder that the folder's entry does not allow;
- an allowed arrow that no include uses (the map would promise a
  dependency that is not there: the table is kept exact);
- a source folder without an entry, or an entry without a folder;
- a cycle among the folders (the map must be layered).

usage: layering_test.py SOURCE_DIR
"""
import os
import re
import sys

SKIP = {"tests", "docs", "scripts", "configs", "gpu_deps"}  # gpu_deps: the bundle for a GPU machine (yaml-cpp, ...)
SOURCE = re.compile(r"\.(h|cpp|cu|cuh)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def read_map(source):
    """{folder: set of allowed targets} from ARCHITECTURE.md's map block."""
    path = os.path.join(source, "docs", "ARCHITECTURE.md")
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    try:
        start = lines.index("## The map")
    except ValueError:
        sys.exit(f"{path}: no '## The map' section")
    i = start + 1
    while i < len(lines) and not lines[i].startswith("```"):
        i += 1
    table, folder, continued = {}, None, False
    for n in range(i + 1, len(lines)):
        line = lines[n]
        if line.startswith("```"):
            break
        if continued:  # an arrow line ending in a comma goes on on the next line
            targets = [t.strip() for t in line.split(",") if t.strip()]
            table[folder] |= set(targets)
            continued = line.rstrip().endswith(",")
            continue
        m = re.match(r"^([a-z_]+)/\s", line + " ")
        if m:
            folder = m.group(1)
            if folder in table:
                sys.exit(f"{path}:{n + 1}: {folder}/ has two entries")
            table[folder] = None
            continue
        m = re.match(r"^\s+->\s*(.*)$", line)
        if m:
            if folder is None or table[folder] is not None:
                sys.exit(f"{path}:{n + 1}: an arrow line that belongs to no entry (or a second one)")
            targets = [t.strip() for t in m.group(1).split(",") if t.strip()]
            table[folder] = set() if targets == ["nothing"] else set(targets)
            continued = line.rstrip().endswith(",")
    missing = [f for f, t in table.items() if t is None]
    if missing:
        sys.exit(f"{path}: entries without an arrow line: {', '.join(missing)}")
    if not table:
        sys.exit(f"{path}: the map block has no entries")
    return table


def source_folders(source):
    out = []
    for name in sorted(os.listdir(source)):
        p = os.path.join(source, name)
        if not os.path.isdir(p) or name.startswith(".") or name.startswith("build") or name in SKIP:
            continue
        if any(SOURCE.search(f) for _, _, fs in os.walk(p) for f in fs):
            out.append(name)
    return out


def includes(source, folder):
    """(file, line number, included path) of every cross-folder include."""
    for dirpath, _, files in os.walk(os.path.join(source, folder)):
        for f in sorted(files):
            if not SOURCE.search(f):
                continue
            p = os.path.join(dirpath, f)
            with open(p, encoding="utf-8", errors="replace") as fh:
                for n, line in enumerate(fh, 1):
                    m = INCLUDE.match(line)
                    if m and "/" in m.group(1) and m.group(1).split("/")[0] != folder:
                        yield os.path.relpath(p, source), n, m.group(1)


def find_cycle(graph):
    state = {}

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path + [node, nxt]
            if nxt not in state:
                found = visit(nxt, path + [node])
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found[found.index(found[-1]):]
    return None


def main():
    source = sys.argv[1]
    table = read_map(source)
    folders = source_folders(source)
    errors = []
    for f in folders:
        if f not in table:
            errors.append(f"{f}/ holds sources but has no entry in the map")
    for f in table:
        if f not in folders:
            errors.append(f"the map names {f}/, which holds no sources")
    used = {f: set() for f in table}
    graph = {f: set() for f in table}
    count = 0
    for folder in folders:
        allowed = table.get(folder, set())
        for path, line, target in includes(source, folder):
            count += 1
            dep = target.split("/")[0]
            rule = target if target in allowed else dep if dep in allowed else None
            if rule is None:
                errors.append(f"{path}:{line}: includes \"{target}\": {folder}/ -> {dep}/ is not in the map")
                continue
            used[folder].add(rule)
            graph[folder].add(dep)
    for folder, allowed in table.items():
        for rule in sorted(allowed - used.get(folder, set())):
            errors.append(f"the map allows {folder}/ -> {rule}, but no file of {folder}/ includes it")
    cycle = find_cycle(graph)
    if cycle:
        errors.append("the folders include one another in a cycle: " + " -> ".join(cycle))
    print(f"{count} cross-folder includes in {len(folders)} folders checked against the map "
          f"({sum(len(t) for t in table.values())} arrows)")
    for e in errors:
        print("layering:", e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
