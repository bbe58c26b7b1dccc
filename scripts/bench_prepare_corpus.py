#!/usr/bin/env python3
"""Benchmark of scripts/prepare_corpus.py: documents/s, MB/s and peak memory per worker count,
next to the Hugging Face `tokenizers` fast tokenizer batch-encoding the same text alone.

Generates a JSON lines corpus of --size-mb MB (default 500) in a work folder: documents of
20-2000 words drawn from the words of /usr/share/common-licenses (a fixed seed, so every run
reads the same bytes), then for each --workers count runs prepare_corpus.py on it with a
byte-level BPE tokenizer.json of --vocab ids trained here on the license texts, and prints a
table: seconds, documents/s, MB/s of input, and the peak resident memory of the whole
process tree (the main process and its workers summed, sampled every 0.2 s from /proc), with
the output's size. The baseline row is `tokenizers`' Tokenizer.encode_batch over the same
documents (read and JSON-decoded first, not timed), in batches of 1000, with its own Rayon
threads (TOKENIZERS_PARALLELISM true): the encoding alone, without reading, writing or the
index. --write puts the table into docs/PERFORMANCE.md between its prepare-corpus markers.

A benchmark, never a test. Needs the `tokenizers` package: run it with .venv-hf/bin/python.
  .venv-hf/bin/python scripts/bench_prepare_corpus.py [--size-mb 500] [--workers 1,2] [--write]
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def words():
    text = ""
    for name in sorted(os.listdir("/usr/share/common-licenses")):
        path = os.path.join("/usr/share/common-licenses", name)
        if os.path.isfile(path):
            text += open(path, encoding="utf-8", errors="replace").read()
    return re.findall(r"\S+", text)


def make_corpus(path, size_mb):
    if os.path.exists(path) and os.path.getsize(path) >= size_mb * 1e6:
        return
    vocab, rng = words(), random.Random(1234)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        written, n = 0, 0
        while written < size_mb * 1e6:
            doc = " ".join(rng.choice(vocab) for _ in range(rng.randint(20, 2000)))
            line = json.dumps({"id": n, "text": doc}) + "\n"
            f.write(line)
            written += len(line)
            n += 1
    os.replace(path + ".tmp", path)


def train_tokenizer(path, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    files = sorted(os.path.join("/usr/share/common-licenses", n) for n in os.listdir("/usr/share/common-licenses"))
    tok.train([f for f in files if os.path.isfile(f)],
              trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.save(path)


def tree_rss_kb(pid):
    """Resident memory of pid and all its descendants (kB)."""
    children = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(p))
            except (OSError, IndexError, ValueError):
                pass
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
        except (OSError, StopIteration):
            pass
    return total


def run_prepare(corpus, tokenizer, out, workers):
    cmd = [sys.executable, os.path.join(HERE, "prepare_corpus.py"), corpus, "--out-dir", out, "--workers",
           str(workers), "--tokenizer-json", tokenizer, "--progress", "none", "--valid-fraction", "0.001"]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = 0
    while p.poll() is None:
        peak = max(peak, tree_rss_kb(p.pid))
        time.sleep(0.2)
    seconds = time.monotonic() - t0
    text = p.stdout.read()
    if p.returncode != 0:
        sys.exit(f"bench_prepare_corpus: {' '.join(cmd)} failed:\n{text}")
    docs = int(re.search(r"prepare_corpus: (\d+) documents", text).group(1))
    size = sum(os.path.getsize(os.path.join(out, f)) for f in ("train.bin", "train.idx", "valid.bin", "valid.idx"))
    return dict(seconds=seconds, docs=docs, peak_mb=peak / 1024, out_mb=size / 1e6)


def run_baseline(corpus, tokenizer):
    from tokenizers import Tokenizer
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    tok = Tokenizer.from_file(tokenizer)
    with open(corpus, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    t0 = time.monotonic()
    for i in range(0, len(texts), 1000):
        tok.encode_batch(texts[i:i + 1000], add_special_tokens=False)
    return dict(seconds=time.monotonic() - t0, docs=len(texts))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=500)
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--work", default="/tmp/bench_prepare_corpus")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    corpus = os.path.join(a.work, f"corpus_{a.size_mb}mb.jsonl")
    tokenizer = os.path.join(a.work, f"tokenizer_{a.vocab}.json")
    make_corpus(corpus, a.size_mb)
    if not os.path.exists(tokenizer):
        train_tokenizer(tokenizer, a.vocab)
    mb = os.path.getsize(corpus) / 1e6
    rows = []
    for w in [int(x) for x in a.workers.split(",")]:
        r = run_prepare(corpus, tokenizer, os.path.join(a.work, f"out_{w}"), w)
        rows.append(f"| prepare_corpus.py, {w} worker{'s' if w > 1 else ''} | {r['seconds']:.1f} | "
                    f"{r['docs'] / r['seconds']:.0f} | {mb / r['seconds']:.1f} | {r['peak_mb']:.0f} | "
                    f"{r['out_mb']:.0f} MB |")
        print(rows[-1], flush=True)
    if not a.no_baseline:
        b = run_baseline(corpus, tokenizer)
        rows.append(f"| `tokenizers` encode_batch alone (its own threads) | {b['seconds']:.1f} | "
                    f"{b['docs'] / b['seconds']:.0f} | {mb / b['seconds']:.1f} | — | — |")
        print(rows[-1], flush=True)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    exe = os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(ROOT) else sys.executable
    table = (f"`{exe} scripts/bench_prepare_corpus.py --size-mb {a.size_mb} "
             f"--workers {a.workers}` at `{commit}`, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores: a "
             f"{mb:.0f} MB JSON lines corpus, byte-level BPE of {a.vocab} ids. Peak memory: the resident memory "
             "of the main process and its workers together.\n\n"
             "| run | seconds | documents/s | MB/s of input | peak memory MB | output |\n"
             "|---|---:|---:|---:|---:|---|\n" + "\n".join(rows) + "\n")
    print(table)
    if a.write:
        path = os.path.join(ROOT, "docs", "PERFORMANCE.md")
        doc = open(path).read()
        begin, end = "<!-- prepare-corpus:begin -->\n", "<!-- prepare-corpus:end -->"
        if begin not in doc or end not in doc:
            sys.exit(f"bench_prepare_corpus: {path} has no prepare-corpus markers")
        doc = doc[:doc.index(begin) + len(begin)] + table + doc[doc.index(end):]
        open(path, "w").write(doc)


if __name__ == "__main__":
    main()
