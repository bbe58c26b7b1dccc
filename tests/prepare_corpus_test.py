#!/usr/bin/env python3
"""scripts/prepare_corpus.py end to end.

One generated corpus of 400 documents (ASCII, accented and CJK text,
newlines inside documents) written as JSON lines, .gz, .zst, Parquet, a
Hugging Face datasets folder (datasets' own save_to_disk) and one text file
per document: every form gives the same output bytes, with 1 worker and with
3 (small tasks, so many are in flight). The .idx is read back by an
independent reader here (header, sizes, pointers, the document index),
every sequence decodes to its document, Megatron-LM's own reader
(megatron-core's IndexedDataset) sees the same, and the trainer trains on
the result.
Bad records are counted and listed with their lines; a run with no good
document fails and leaves the earlier output intact; BOS and EOS come from
a SentencePiece model and a Hugging Face tokenizer.json, around the ids
the tokenizer itself gives.

usage: prepare_corpus_test.py TRAINER SOURCE_DIR WORK_DIR
Re-runs itself under SOURCE_DIR/.venv-hf/bin/python (pyarrow, datasets,
tokenizers; scripts/setup.sh test makes it); exit 77 (skipped) without it.
"""
import array
import filecmp
import glob
import gzip
import hashlib
import json
import os
import random
import shutil
import struct
import subprocess
import sys

BIN, SRC, WORK = sys.argv[1:4]
VENV_PY = os.path.join(SRC, ".venv-hf", "bin", "python")
NEEDS = "import pyarrow, datasets, tokenizers, zstandard, sentencepiece, megatron.core.datasets.indexed_dataset"
if os.environ.get("PREPARE_CORPUS_TEST_CHILD") != "1":
    if subprocess.run([VENV_PY, "-c", NEEDS], capture_output=True).returncode != 0 if os.path.exists(VENV_PY) else True:
        print(f"skipped: {VENV_PY} cannot `{NEEDS}` (scripts/setup.sh test installs them)")
        sys.exit(77)
    os.environ["PREPARE_CORPUS_TEST_CHILD"] = "1"
    os.execv(VENV_PY, [VENV_PY] + sys.argv)

import datasets  # noqa: E402
import pyarrow  # noqa: E402
import pyarrow.parquet  # noqa: E402
import zstandard  # noqa: E402

TOOL = os.path.join(SRC, "scripts", "prepare_corpus.py")
OUTPUTS = ["train.bin", "train.idx", "valid.bin", "valid.idx"]


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def prepare(inputs, out, *flags, expect_ok=True):
    cmd = [sys.executable, TOOL, *inputs, "--out-dir", out, "--progress", "none", *flags]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if (r.returncode == 0) != expect_ok:
        fail(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}{r.stderr}")
    return r.stdout + r.stderr


def make_documents():
    rng = random.Random(7)
    words = ["the", "model", "trains", "on", "données", "über", "naïve", "日本語", "テキスト", "token", "π≈3.14",
             "emoji🙂", "line\nbreak", "tab\tstop", "quote\"d", "back\\slash"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 60))) for _ in range(400)]


def read_idx(prefix):
    """An independent reader of Megatron's index: (dtype code, sizes, pointers, document index)."""
    with open(prefix + ".idx", "rb") as f:
        data = f.read()
    if data[:9] != b"MMIDIDX\x00\x00":
        fail(f"{prefix}.idx: bad magic")
    version, code, seqs, docs = struct.unpack_from("<QBQQ", data, 9)
    at = 34
    sizes = struct.unpack_from(f"<{seqs}i", data, at)
    pointers = struct.unpack_from(f"<{seqs}q", data, at + 4 * seqs)
    doc_index = struct.unpack_from(f"<{docs}q", data, at + 12 * seqs)
    if version != 1 or at + 12 * seqs + 8 * docs != len(data):
        fail(f"{prefix}.idx: version {version}, {len(data)} bytes for {seqs} sequences and {docs} document entries")
    return code, sizes, pointers, doc_index


def sequences(prefix):
    code, sizes, pointers, doc_index = read_idx(prefix)
    if code != 8:
        fail(f"{prefix}.idx: dtype code {code}, want 8 (uint16)")
    if list(doc_index) != list(range(len(sizes) + 1)):
        fail(f"{prefix}.idx: document index {doc_index[:5]}..., want 0, 1, ..., {len(sizes)}")
    with open(prefix + ".bin", "rb") as f:
        raw = f.read()
    out, at = [], 0
    for n, p in zip(sizes, pointers):
        if p != at:
            fail(f"{prefix}.idx: pointer {p}, want {at}")
        a = array.array("H")
        a.frombytes(raw[p:p + 2 * n])
        out.append(list(a))
        at += 2 * n
    if at != len(raw):
        fail(f"{prefix}.bin: {len(raw)} bytes, the index covers {at}")
    return out


def check_megatron_reader(out, train, valid):
    """Megatron-LM's own reader (megatron-core's IndexedDataset) sees the same documents."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    for name, ours in (("train", train), ("valid", valid)):
        ds = IndexedDataset(f"{out}/{name}")
        theirs = [list(ds[i]) for i in range(len(ds))]
        if theirs != ours or list(ds.document_indices) != list(range(len(ours) + 1)):
            fail(f"Megatron's IndexedDataset reads {out}/{name} differently")
    print(f"megatron-core's IndexedDataset reads the same {len(train)} + {len(valid)} documents and document index")


def write_forms(docs, d):
    os.makedirs(d)
    lines = "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(docs)).encode()
    open(f"{d}/docs.jsonl", "wb").write(lines)
    open(f"{d}/docs.jsonl.gz", "wb").write(gzip.compress(lines))
    open(f"{d}/docs.jsonl.zst", "wb").write(zstandard.ZstdCompressor().compress(lines))
    pyarrow.parquet.write_table(pyarrow.table({"id": list(range(len(docs))), "text": docs}),
                                f"{d}/docs.parquet", row_group_size=150)
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(f"{d}/hf", max_shard_size="20KB")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": docs}),
                          "test": datasets.Dataset.from_dict({"text": docs[:5]})}).save_to_disk(f"{d}/hf_dict")
    os.makedirs(f"{d}/text")
    for i, t in enumerate(docs):
        open(f"{d}/text/doc{i:04d}.txt", "w", encoding="utf-8").write(t)
    return {"jsonl": [f"{d}/docs.jsonl"], "gz": [f"{d}/docs.jsonl.gz"], "zst": [f"{d}/docs.jsonl.zst"],
            "parquet": [f"{d}/docs.parquet"], "hf": [f"{d}/hf"], "hf_dict": [f"{d}/hf_dict"],
            "text": [f"{d}/text/*.txt"]}


def check_forms(docs, forms):
    ref = f"{WORK}/out_jsonl_1"
    out = prepare(forms["jsonl"], ref, "--workers", "1", "--valid-fraction", "0.2")
    print(out.strip())
    if "400 documents" not in out:
        fail("the report does not count 400 documents")
    train, valid = sequences(f"{ref}/train"), sequences(f"{ref}/valid")
    got = sorted(bytes(s).decode("utf-8") for s in train + valid)
    if got != sorted(docs):
        fail("the sequences do not decode to the documents")
    if not 40 <= len(valid) <= 120:
        fail(f"{len(valid)} of 400 documents in validation at --valid-fraction 0.2")
    order = [bytes(s).decode() for s in train]
    if order != [t for t in docs if t in set(order)]:
        fail("training documents are not in input order")
    print(f"independent reader: {len(train)} train + {len(valid)} valid documents decode to the input")
    check_megatron_reader(ref, train, valid)
    hf_files = glob.glob(f"{WORK}/forms/hf/*.arrow")
    print(f"datasets wrote {len(hf_files)} Arrow files into the save_to_disk folder")
    for name, inputs in forms.items():
        for workers in ("1", "3"):
            out_dir = f"{WORK}/out_{name}_{workers}"
            if out_dir != ref:
                prepare(inputs, out_dir, "--workers", workers, "--chunk-docs", "7", "--valid-fraction", "0.2")
            for f in OUTPUTS:
                if not filecmp.cmp(f"{ref}/{f}", f"{out_dir}/{f}", shallow=False):
                    fail(f"{name} with {workers} workers: {f} differs from JSON lines with 1 worker")
    print(f"{len(forms)} input forms x workers 1 and 3: identical train/valid .bin/.idx")


def check_bad_records():
    d = f"{WORK}/bad"
    os.makedirs(d)
    good = json.dumps({"text": "a good document"}).encode()
    lines = [good, json.dumps({"body": "x"}).encode(), json.dumps({"text": "  "}).encode(),
             b'{"text": "caf\xe9"}', b"{not json", b"[1, 2]", b"", json.dumps({"text": 5}).encode(),
             json.dumps({"text": None}).encode(), good]
    open(f"{d}/bad.jsonl", "wb").write(b"\n".join(lines) + b"\n")
    blob = gzip.compress(b"".join(json.dumps({"text": f"doc {i} " * 50}).encode() + b"\n" for i in range(200)))
    open(f"{d}/cut.jsonl.gz", "wb").write(blob[: len(blob) // 2])
    out = prepare([f"{d}/bad.jsonl", f"{d}/cut.jsonl.gz"], f"{d}/out", "--valid-fraction", "0")
    print(out.strip())
    rows = open(f"{d}/out/rejected.tsv", encoding="utf-8").read().splitlines()[1:]
    want = {"line 2": "missing field 'text'", "line 3": "empty text", "line 4": "bad UTF-8 at byte 13",
            "line 5": "not JSON", "line 6": "a JSON list, not an object", "line 7": "blank line",
            "line 8": "field 'text' is int, not a string", "line 9": "field 'text' is null",
            "end": "the file cannot be read to its end"}
    got = {r.split("\t")[1]: r.split("\t")[2] for r in rows}
    for where, reason in want.items():
        if not got.get(where, "").startswith(reason):
            fail(f"rejected.tsv has {got.get(where)!r} for {where}, want {reason!r}")
    if len(rows) != len(want) or f"{len(want)} bad records left out" not in out:
        fail(f"{len(rows)} rows in rejected.tsv, want {len(want)}; report:\n{out}")
    kept = len(sequences(f"{d}/out/train"))
    if not 2 < kept < 202:
        fail(f"{kept} documents kept: want the 2 good lines and the truncated file's readable part")
    print(f"bad records: {len(rows)} listed with their lines, {kept} documents kept")

    before = hashlib.sha256(open(f"{d}/out/train.bin", "rb").read()).hexdigest()
    open(f"{d}/none.jsonl", "w").write('{"x": 1}\n\n')
    err = prepare([f"{d}/none.jsonl"], f"{d}/out", expect_ok=False)
    if "no document left" not in err:
        fail(f"an all-bad input: {err}")
    if hashlib.sha256(open(f"{d}/out/train.bin", "rb").read()).hexdigest() != before:
        fail("a failed run changed the earlier output")
    for bad_args, msg in (([f"{d}/missing.jsonl"], "no file or folder matches"),
                          ([f"{WORK}/forms/docs.parquet", "--text-field", "body"], "no column 'body'"),
                          ([f"{WORK}/forms/hf_dict", "--hf-split", "valid"], "choose one with --hf-split")):
        err = prepare(bad_args, f"{d}/out2", expect_ok=False)
        if msg not in err:
            fail(f"{bad_args}: {err!r} lacks {msg!r}")
    print("an all-bad input fails and leaves the earlier output; bad arguments are named")


def check_special_tokens(docs):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    import sentencepiece as spm
    d = f"{WORK}/tok"
    os.makedirs(d)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    tok.save(f"{d}/tokenizer.json")
    spm.SentencePieceTrainer.train(sentence_iterator=iter(docs), model_prefix=f"{d}/sp", vocab_size=300,
                                   model_type="bpe", byte_fallback=True, bos_id=1, eos_id=2, unk_id=0,
                                   minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=f"{d}/sp.model")
    cases = (("tokenizer.json", ["--tokenizer-json", f"{d}/tokenizer.json"], 0, 1,
              lambda t: tok.encode(t, add_special_tokens=False).ids),
             ("SentencePiece", ["--tokenizer-model", f"{d}/sp.model"], 1, 2, lambda t: sp.encode(t)))
    for name, flags, bos, eos, encode in cases:
        out_dir = f"{d}/out_{name}"
        prepare([f"{WORK}/forms/docs.jsonl"], out_dir, "--workers", "2", "--valid-fraction", "0", *flags)
        seqs = sequences(f"{out_dir}/train")
        for s, t in zip(seqs, docs):
            if s[0] != bos or s[-1] != eos or s[1:-1] != encode(t):
                fail(f"{name}: sequence {s[:4]}...{s[-2:]} is not BOS + '{t[:20]}...' + EOS")
        info = json.load(open(f"{out_dir}/tokenizer_info.json"))
        if (info["bos_id"], info["eos_id"], info["documents"]["train"]) != (bos, eos, 400):
            fail(f"{name}: tokenizer_info.json {info}")
        print(f"{name}: 400 documents as BOS {bos} + the tokenizer's own ids + EOS {eos}")


def check_trainer():
    data = f"{WORK}/out_jsonl_1"
    r = subprocess.run([BIN, "--config", f"{SRC}/configs/tiny.yaml", "--set", "train.steps=4",
                        "--set", "train.eval_interval=2", "--set", "train.eval_steps=1", "--set", "log.interval=1",
                        "--set", "model.d_model=32", "--set", "train.seq_len=32", "--set", "model.max_seq_len=32",
                        "--set", f"data.train=[{data}/train]", "--set", f"data.valid=[{data}/valid]",
                        "--set", f"run.dir={WORK}/run", "--set", "checkpoint.interval=0", "--set", "log.progress=lines"],
                       capture_output=True, text=True)
    if r.returncode != 0 or "megatron uint16" not in r.stdout + r.stderr:
        fail(f"training on the prepared corpus:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    print("the trainer reads the prepared corpus (megatron uint16) and trains 4 steps")


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    docs = make_documents()
    forms = write_forms(docs, f"{WORK}/forms")
    check_forms(docs, forms)
    check_bad_records()
    check_special_tokens(docs)
    check_trainer()
    print("prepare_corpus: all checks passed")


main()
