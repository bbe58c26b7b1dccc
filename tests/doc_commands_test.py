#!/usr/bin/env python3
"""Every `build/trainer ...` command the documentation shows must run.

Extracts each line of a fenced code block of README.md and docs/*.md that
starts (after indentation and an optional `$ `) with `build/trainer` (or
`.venv-hf/bin/python `: the preparation scripts of docs/FINE_TUNE.md), joins
its backslash continuations, and runs it with bash from a scratch copy of
the repository's layout (WORK/root: `build` -> the directory of the trainer
under test, `configs` and `scripts` -> the sources, `data/` prepared here),
so relative paths resolve as they do for a reader in the repository root.

What the test adds, and nothing else (printed with every command):
- data: the files the configurations name, prepared from the text of
  /usr/share/common-licenses as configs/tiny.yaml's comment says
  (data/licenses; data/fortunes is the same small text, for the quickstart);
- before the first command: a 2-step quickstart run that leaves the
  checkpoint runs/quickstart/ckpt the examples read (as scripts/quickstart.sh
  would, 1000 steps);
- commands that train get `--set train.steps=2` (a smoke test `--steps 60`)
  before any shell redirection or comment.
Commands that need a GPU are listed in GPU_ONLY with the reason and skipped,
and the test prints them. The same command shown in several places runs
once. A failure names the file, the line, the command and its output;
exit 1 if any failed.

usage: doc_commands_test.py TRAINER SOURCE_DIR WORK_DIR
"""
import glob
import os
import shutil
import subprocess
import sys
import time

# Commands (as written in the docs) that only a GPU can run, and why.
GPU_ONLY = {}

# Commands of the preparation scripts, run with the venv scripts/setup.sh makes (transformers,
# tokenizers, pyarrow); without it they are listed as skipped, with the reason.
PYTHON = ".venv-hf/bin/python "
TRAIN_STEPS = "--set train.steps=2"
SMOKE_STEPS = "--steps 60"
SUBCOMMANDS = {"plan", "schedule", "calibrate", "generate", "eval", "export", "inspect", "devices"}


def doc_files(source):
    return ["README.md"] + sorted(os.path.relpath(p, source) for p in glob.glob(os.path.join(source, "docs", "*.md")))


def extract(source):
    """(file, line, command) of every documented trainer command, in order."""
    out = []
    for name in doc_files(source):
        with open(os.path.join(source, name), encoding="utf-8") as f:
            lines = f.read().split("\n")
        in_block, i = False, 0
        while i < len(lines):
            text = lines[i].strip()
            if text.startswith("```"):
                in_block = not in_block
            elif in_block:
                if text.startswith("$ "):
                    text = text[2:].lstrip()
                if text.startswith("build/trainer") or text.startswith(PYTHON):
                    first = i + 1
                    while text.endswith("\\") and i + 1 < len(lines):
                        i += 1
                        text = text[:-1].rstrip() + " " + lines[i].strip()
                    out.append((name, first, text))
            i += 1
    return out


def end_of(cmd, stops):
    """Index of the first unquoted character of `stops` in cmd ('#' only
    after a blank: a comment), else len(cmd)."""
    quote = None
    for i, ch in enumerate(cmd):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in stops and (ch != "#" or (i > 0 and cmd[i - 1] in " \t")):
            return i
    return len(cmd)


def end_of_arguments(cmd):
    """Where the trainer's own arguments end: the first shell operator or comment."""
    return end_of(cmd, "><|&;#")


def without_comment(cmd):
    return cmd[: end_of(cmd, "#")].rstrip()


def with_step_limit(cmd):
    """The command as run, and what was added (None: unchanged)."""
    words = cmd[: end_of_arguments(cmd)].split()
    sub = words[1] if len(words) > 1 and not words[1].startswith("-") else None
    if sub in SUBCOMMANDS or "--print-config" in words:
        return cmd, None
    added = SMOKE_STEPS if "--smoke-test" in words else TRAIN_STEPS
    if "--smoke-test" in words and "--steps" in words:
        return cmd, None
    at = end_of_arguments(cmd)
    head = cmd[:at].rstrip()
    return head + " " + added + (" " + cmd[at:] if at < len(cmd) else ""), added


def run(cmd, cwd, timeout=300):
    t0 = time.time()
    try:
        p = subprocess.run(["bash", "-c", cmd], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout)
        return p.returncode, p.stdout.decode("utf-8", "replace"), time.time() - t0
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode("utf-8", "replace")
        return 124, out + f"\n(timed out after {timeout} s)", time.time() - t0


def tail(text, chars=3000):
    return text if len(text) <= chars else "...\n" + text[-chars:]


def prepare(trainer, source, work):
    root = os.path.join(work, "root")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.join(root, "data"))
    os.symlink(os.path.dirname(os.path.abspath(trainer)), os.path.join(root, "build"))
    for d in ("configs", "scripts"):
        os.symlink(os.path.join(source, d), os.path.join(root, d))
    if os.path.exists(os.path.join(source, ".venv-hf", "bin", "python")):
        os.symlink(os.path.join(source, ".venv-hf"), os.path.join(root, ".venv-hf"))
    # Prepared once per work directory (tokens of ~240 KB of license text).
    data = os.path.join(work, "data", "licenses")
    if not os.path.exists(os.path.join(data, "tokenizer_info.json")):
        code, out, _ = run(f"python3 {source}/scripts/prepare_text.py --out-dir {data} '/usr/share/common-licenses/*'",
                           work)
        if code != 0:
            sys.exit(f"doc_commands_test: preparing the data failed:\n{out}")
    for name in ("licenses", "fortunes"):
        shutil.copytree(data, os.path.join(root, "data", name))
    setup = ("build/trainer --config configs/quickstart.yaml --set train.steps=2 --set checkpoint.interval=2 "
             "--set log.sample_tokens=0")
    print(f"setup: data/licenses and data/fortunes from /usr/share/common-licenses; {setup}")
    code, out, _ = run(setup, root)
    if code != 0:
        sys.exit(f"doc_commands_test: the setup run failed (exit {code}):\n{tail(out)}")
    return root


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    trainer, source, work = (os.path.abspath(a) for a in sys.argv[1:])
    if os.path.basename(trainer) != "trainer":
        sys.exit(f"doc_commands_test: {trainer}: the commands say build/trainer, so the binary must be named trainer")
    commands = extract(source)
    if not commands:
        sys.exit("doc_commands_test: no `build/trainer` command found in README.md and docs/*.md code blocks")
    os.makedirs(work, exist_ok=True)
    root = prepare(trainer, source, work)

    where = {}  # command -> every place it is shown
    for name, line, cmd in commands:
        where.setdefault(without_comment(cmd), []).append(f"{name}:{line}")
    failures, ran, skipped_python, t_all = [], 0, 0, time.time()
    for cmd, places in where.items():
        if cmd in GPU_ONLY:
            print(f"SKIP {', '.join(places)}: {cmd}\n     needs a GPU: {GPU_ONLY[cmd]}")
            continue
        if cmd.startswith(PYTHON) and not os.path.exists(os.path.join(root, ".venv-hf")):
            skipped_python += 1
            print(f"SKIP {', '.join(places)}: {cmd}\n     no .venv-hf (scripts/setup.sh test makes it from PyPI)")
            continue
        actual, added = with_step_limit(cmd) if cmd.startswith("build/trainer") else (cmd, None)
        code, out, secs = run(actual, root)
        ran += 1
        note = f" (added {added})" if added else ""
        print(f"{'ok  ' if code == 0 else 'FAIL'} {secs:6.1f} s  {', '.join(places)}: {cmd}{note}")
        if code != 0:
            failures.append(f"{', '.join(places)}: `{cmd}` exited {code}" + (f"\n  ran as: {actual}" if added else "") +
                            f"\n  output:\n{tail(out)}")
    unknown = [c for c in GPU_ONLY if c not in where]
    for c in unknown:
        failures.append(f"GPU_ONLY lists a command no document shows any more: {c}")
    print(f"doc commands: {len(commands)} shown in {len(doc_files(source))} files, {ran} distinct run, "
          f"{len(GPU_ONLY)} skipped (GPU only), {skipped_python} skipped (no .venv-hf), {len(failures)} failed, "
          f"{time.time() - t_all:.0f} s")
    if failures:
        print("\n" + "\n\n".join(failures))
        print("\nfix the command in the document or the code; a command that needs a GPU belongs in GPU_ONLY "
              "(tests/doc_commands_test.py) with the reason")
        sys.exit(1)


if __name__ == "__main__":
    main()
