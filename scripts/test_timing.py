#!/usr/bin/env python3
"""The timing table scripts/test.sh prints at the end of every run.

  test_timing.py [--wall SECONDS] PHASES_FILE [JUNIT_XML...]

PHASES_FILE holds one line per phase, "NAME<TAB>SECONDS<TAB>RESULT", in the
order they ended (scripts/test.sh and the scripts it calls append to it
through TRAINER_TIMINGS). Phases may overlap (the fuzzers run beside the
sanitizer phases), so shares are of the wall time, --wall, when given. Each JUNIT_XML is a ctest --output-junit file; the ten
slowest test entries over all of them are listed. Standard library only: it
must print even where the run failed early.
"""
import re
import sys
import xml.etree.ElementTree as ET

# Catch2's closing line of a unit_tests run that ctest captured.
_CATCH = re.compile(r"All tests passed \((\d+) assertions? in (\d+) test cases?\)|"
                    r"test cases: *(\d+).*?\nassertions: *(\d+)", re.S)


def phases(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 2 and parts[1].isdigit():
                rows.append((parts[0], int(parts[1]), parts[2] if len(parts) > 2 else ""))
    return rows


def counts(paths):
    """(ctest entries by status, Catch test cases, Catch assertions) of the runs."""
    status, cases, assertions = {}, 0, 0
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError):
            continue
        for case in root.iter("testcase"):
            st = {"run": "passed", "notrun": "skipped", "fail": "failed"}.get(case.get("status", "run"), case.get("status"))
            if case.find("failure") is not None:
                st = "failed"
            status[st] = status.get(st, 0) + 1
            out = case.findtext("system-out") or ""
            for m in _CATCH.finditer(out):
                if m.group(1):
                    assertions += int(m.group(1))
                    cases += int(m.group(2))
                else:
                    cases += int(m.group(3))
                    assertions += int(m.group(4))
    return status, cases, assertions


def slowest(paths, n=10):
    tests = []
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as e:
            print(f"test_timing: cannot read {path}: {e}")
            continue
        for case in root.iter("testcase"):
            try:
                tests.append((float(case.get("time", "0")), case.get("name", "?"), case.get("status", "")))
            except ValueError:
                continue
    tests.sort(reverse=True)
    return tests[:n], len(tests)


def main(argv):
    wall = None
    if len(argv) > 2 and argv[1] == "--wall":
        wall = int(argv[2])
        argv = argv[:1] + argv[3:]
    if len(argv) < 2:
        print(__doc__.strip().split("\n\n")[1])
        return 2
    rows = phases(argv[1])
    total = wall or sum(s for _, s, _ in rows) or 1
    width = max([len(r[0]) for r in rows] + [len("phase")])
    print("\ntest.sh timing (seconds, share of the %s):" % ("wall time" if wall else "phases' sum"))
    print(f"  {'phase':<{width}}  {'s':>6}  {'share':>6}  result")
    for name, secs, result in rows:
        print(f"  {name:<{width}}  {secs:>6}  {100.0 * secs / total:>5.1f}%  {result}")
    print(f"  {'wall' if wall else 'total':<{width}}  {total:>6}  {'':>6}  ({total // 60} min {total % 60} s)")
    status, cases, assertions = counts(argv[2:])
    if status:
        kinds = ", ".join(f"{v} {k}" for k, v in sorted(status.items()))
        print(f"\nctest: {sum(status.values())} entries ({kinds}); unit_tests among them: "
              f"{cases} test cases, {assertions} assertions")
    top, count = slowest(argv[2:])
    if top:
        print(f"\nthe {len(top)} slowest of {count} ctest entries (seconds; they run two at a time):")
        for secs, name, status in top:
            mark = "" if status in ("run", "") else f"  [{status}]"
            print(f"  {secs:>8.1f}  {name}{mark}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
