#!/usr/bin/env python3
"""No function outside the kernels is longer than the limit.

A long function is where every new feature lands; the loop and the commands
are kept as small pieces instead (docs/ARCHITECTURE.md). The code's style
makes functions easy to find without a parser: a definition starts at
a line (not a control statement or a lambda's assignment) with a `(`, its
body opens with a `{` ending that line or one of the next few, and closes
with the first line indented no deeper than the signature, a `}`. Member
functions defined inside a class body count as functions.

Measured: every .cpp and .cu file of the source folders except kernels/
(the CUDA and CPU kernels keep a kernel's loop nest in one piece); train/,
the loop, has the tighter FOLDER_LIMITS. Allowed
to be longer: EXEMPT below, each with its reason. Prints the five longest
functions and every one over the limit; exit 1 if any is.

usage: function_length_test.py SOURCE_DIR [LIMIT]
"""
import os
import re
import sys

SKIP = {"kernels", "tests", "docs", "scripts", "configs"}
# The training loop is read as the algorithm: its pieces are shorter still.
FOLDER_LIMITS = {"train": 80}
EXEMPT = {
    # One row per configuration key: a declarative table, not logic.
    ("config/config_schema.cpp", "build_schema"): "the configuration schema table",
}
NOT_A_FUNCTION = re.compile(r"^(#|//|/\*|\*|}|namespace\b|struct\b|class\b|enum\b|union\b|using\b|typedef\b|"
                            r"extern\b|static_assert\b|template\s*<[^>]*>\s*$)")


CONTROL = re.compile(r"^(if|for|while|switch|else|do|try|catch|return|case|default)\b")


def functions(path):
    """(name, first line, line count) of each function body."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        text = line.strip()
        indent = len(line) - len(line.lstrip())
        if (not text or NOT_A_FUNCTION.match(text) or CONTROL.match(text) or "(" not in text
                or text.startswith("[") or re.match(r"^[^(]*=", text)):
            i += 1
            continue
        # The body opens on this line or within the signature's next lines.
        j = i
        while j < len(lines) and j < i + 8 and not lines[j].rstrip().endswith("{"):
            if lines[j].rstrip().endswith(";"):
                break
            j += 1
        if j >= len(lines) or not lines[j].rstrip().endswith("{") or lines[j].rstrip().endswith("= {"):
            i += 1
            continue
        # It closes with the first line indented no deeper than the signature.
        k = j + 1
        while k < len(lines) and (not lines[k].strip() or len(lines[k]) - len(lines[k].lstrip()) > indent):
            k += 1
        if k >= len(lines) or not re.match(r"^ {%d}}\s*;?\s*(//.*)?$" % indent, lines[k]):
            i += 1
            continue
        m = re.search(r"([A-Za-z_][A-Za-z_0-9:~]*)\s*\(", text)
        yield (m.group(1) if m else text), i + 1, k - i + 1
        i = k + 1


def main():
    source = sys.argv[1]
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else 150
    found = []
    for top in sorted(os.listdir(source)):
        p = os.path.join(source, top)
        if not os.path.isdir(p) or top.startswith(".") or top.startswith("build") or top in SKIP:
            continue
        for dirpath, _, files in os.walk(p):
            for f in sorted(files):
                if f.endswith((".cpp", ".cu")):
                    path = os.path.join(dirpath, f)
                    rel = os.path.relpath(path, source)
                    for name, line, length in functions(path):
                        found.append((length, rel, line, name))
    found.sort(reverse=True)
    print(f"{len(found)} functions measured; the longest:")
    for length, rel, line, name in found[:5]:
        print(f"  {length:4d} lines  {rel}:{line} {name}")
    def limit_of(rel):
        return FOLDER_LIMITS.get(rel.split("/")[0], limit)

    over = [x for x in found if x[0] > limit_of(x[1]) and (x[1], x[3]) not in EXEMPT]
    for length, rel, line, name in over:
        print(f"function_length: {rel}:{line} {name} is {length} lines (limit {limit_of(rel)}): split it")
    for (rel, name), why in EXEMPT.items():
        if not any(x[1] == rel and x[3] == name for x in found):
            print(f"function_length: the exemption for {rel} {name} ({why}) names no function: remove it")
            over.append(None)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
