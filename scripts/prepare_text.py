#!/usr/bin/env python3
"""Tokenises text files into token files for the trainer.

Tokenizers (--tokenizer):
  bytes          (default) every byte is one token, vocabulary 256: nothing to train
                 or download.
  sentencepiece  a SentencePiece BPE model trained here on the input text
                 (--vocab-size N; Debian's python3-sentencepiece), or the model given
                 with --tokenizer-model PATH. byte_fallback: every input encodes.
  --tokenizer-json PATH: a Hugging Face tokenizer.json (needs the `tokenizers`
                 Python package).

The concatenated text (files in sorted order, a newline after each, so the
output is the same on every machine) is split into train.bin and valid.bin
(the last --valid-fraction of the bytes). Tokens are uint16 when the
vocabulary has fewer than 65536 ids, else uint32 (set data.dtype to match).
Next to them: the tokenizer (tokenizer.model and/or tokenizer.json) and
tokenizer_info.json (kind, vocab size, bos/eos ids, dtype, file hashes), which
the trainer reads at start-up and copies into its run directory.
"""
import argparse
import array
import glob
import hashlib
import io
import json
import os
import shutil
import sys


def fail(msg):
    sys.exit(f"prepare_text: {msg}")


def read_text(patterns):
    paths = []
    for pat in patterns:
        hits = sorted(glob.glob(pat)) or ([pat] if os.path.exists(pat) else [])
        if not hits:
            fail(f"no file matches {pat!r}")
        paths += hits
    seen, data = set(), bytearray()
    for p in paths:
        real = os.path.realpath(p)
        if real in seen or not os.path.isfile(real):
            continue  # symlinked duplicates (GPL -> GPL-3) would repeat text
        seen.add(real)
        with open(real, "rb") as f:
            data += f.read()
        data += b"\n"
    if len(data) < 1024:
        fail(f"only {len(data)} bytes of text; need at least 1024")
    return len(seen), bytes(data)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def import_sentencepiece():
    try:
        import sentencepiece
    except ImportError:
        fail("--tokenizer sentencepiece needs the sentencepiece module: apt-get install python3-sentencepiece "
             f"(scripts/setup.sh installs it) and run this script with /usr/bin/python3 (this is {sys.executable})")
    return sentencepiece


class Bytes:
    kind, files, vocab_size, bos_id, eos_id = "bytes", [], 256, None, None

    def encode(self, chunk):
        return list(chunk)


class SentencePiece:
    kind, files = "sentencepiece", ["tokenizer.model"]

    def __init__(self, out_dir, text, model_path, vocab_size):
        spm = import_sentencepiece()
        dest = os.path.join(out_dir, "tokenizer.model")
        if model_path:
            if not os.path.isfile(model_path):
                fail(f"--tokenizer-model {model_path}: no such file")
            if os.path.realpath(model_path) != os.path.realpath(dest):
                shutil.copyfile(model_path, dest)
        else:
            if not vocab_size:
                fail("--tokenizer sentencepiece trains a model: give --vocab-size N (or --tokenizer-model PATH)")
            if vocab_size < 300:
                fail(f"--vocab-size {vocab_size}: byte fallback needs 256 byte pieces plus <unk>, <s>, </s> and "
                     "merges; use at least 300")
            model = io.BytesIO()
            # Deterministic: one thread, every sentence (no sampling, no
            # shuffling); identity normalisation and no dummy prefix keep
            # decode(encode(text)) == text, newlines and runs of spaces included
            # (they become byte pieces when no merge covers them).
            # Characters outside the 99.95% most frequent get no piece of
            # their own: their UTF-8 bytes are byte pieces.
            try:
                spm.SentencePieceTrainer.train(
                    sentence_iterator=iter(text.decode("utf-8", "replace").split("\n")), model_writer=model,
                    vocab_size=vocab_size, model_type="bpe", byte_fallback=True, character_coverage=0.9995,
                    num_threads=1, input_sentence_size=0, shuffle_input_sentence=False,
                    normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=False,
                    unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
            except RuntimeError as e:
                fail(f"SentencePiece could not train a vocabulary of {vocab_size} on this text: "
                     f"{str(e).splitlines()[-1].strip()}")
            with open(dest, "wb") as f:
                f.write(model.getvalue())
        try:
            self.sp = spm.SentencePieceProcessor(model_file=dest)
        except Exception as e:  # a file that is not a SentencePiece model
            fail(f"{model_path or dest}: not a SentencePiece model ({e})")
        self.vocab_size = self.sp.get_piece_size()
        self.bos_id = self.sp.bos_id() if self.sp.bos_id() >= 0 else None
        self.eos_id = self.sp.eos_id() if self.sp.eos_id() >= 0 else None

    def encode(self, chunk):
        return self.sp.encode(chunk.decode("utf-8", "replace"))


class HuggingFace:
    kind, files = "huggingface", ["tokenizer.json"]

    def __init__(self, out_dir, json_path):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            fail(f"--tokenizer-json needs the Hugging Face `tokenizers` Python package, which {sys.executable} "
                 "lacks (pip install tokenizers; Debian does not package it)")
        if not os.path.isfile(json_path):
            fail(f"--tokenizer-json {json_path}: no such file")
        dest = os.path.join(out_dir, "tokenizer.json")
        if os.path.realpath(json_path) != os.path.realpath(dest):
            shutil.copyfile(json_path, dest)
        try:
            self.tok = Tokenizer.from_file(dest)
        except Exception as e:
            fail(f"{json_path}: not a Hugging Face tokenizer.json ({e})")
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        find = lambda names: next((self.tok.token_to_id(n) for n in names if self.tok.token_to_id(n) is not None), None)
        self.bos_id = find(["<s>", "<|begin_of_text|>", "<bos>", "[CLS]"])
        self.eos_id = find(["</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>", "[SEP]"])

    def encode(self, chunk):
        return self.tok.encode(chunk.decode("utf-8", "replace"), add_special_tokens=False).ids


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="text files or glob patterns")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--valid-fraction", type=float, default=0.1)
    ap.add_argument("--tokenizer", choices=["bytes", "sentencepiece"], default=None,
                    help="bytes (default) or sentencepiece")
    ap.add_argument("--vocab-size", type=int, default=0, help="vocabulary of the SentencePiece model trained here")
    ap.add_argument("--tokenizer-model", default="", help="use this SentencePiece .model instead of training one")
    ap.add_argument("--tokenizer-json", default="", help="use this Hugging Face tokenizer.json")
    args = ap.parse_args()
    if args.tokenizer_json and (args.tokenizer or args.tokenizer_model or args.vocab_size):
        fail("--tokenizer-json excludes --tokenizer, --tokenizer-model and --vocab-size")
    if args.tokenizer == "bytes" and args.tokenizer_model:
        fail("--tokenizer bytes and --tokenizer-model exclude each other")
    if args.tokenizer_model and args.vocab_size:
        fail("--vocab-size trains a model; --tokenizer-model uses a given one: give one of them")
    kind = "huggingface" if args.tokenizer_json else (
        "sentencepiece" if args.tokenizer_model else (args.tokenizer or "bytes"))
    if kind == "bytes" and args.vocab_size:
        fail("--vocab-size applies to --tokenizer sentencepiece (the byte vocabulary is 256)")

    n_files, data = read_text(args.inputs)
    os.makedirs(args.out_dir, exist_ok=True)
    # A tokenizer of an earlier preparation must not sit next to new data.
    for stale in ("tokenizer.model", "tokenizer.json", "tokenizer_info.json"):
        path = os.path.join(args.out_dir, stale)
        keep = {"sentencepiece": "tokenizer.model", "huggingface": "tokenizer.json"}.get(kind)
        if os.path.exists(path) and stale != keep:
            os.remove(path)
    if kind == "sentencepiece":
        tok = SentencePiece(args.out_dir, data, args.tokenizer_model, args.vocab_size)
    elif kind == "huggingface":
        tok = HuggingFace(args.out_dir, args.tokenizer_json)
    else:
        tok = Bytes()
    wide = tok.vocab_size >= 65536
    dtype = "uint32" if wide else "uint16"
    cut = int(len(data) * (1 - args.valid_fraction))
    counts = []
    for name, chunk in (("train.bin", data[:cut]), ("valid.bin", data[cut:])):
        tokens = array.array("I" if wide else "H", tok.encode(chunk))
        if tokens.itemsize != (4 if wide else 2):
            fail("this Python's array type has an unexpected item size")
        if sys.byteorder != "little":
            tokens.byteswap()
        with open(os.path.join(args.out_dir, name), "wb") as f:
            tokens.tofile(f)
        counts.append(len(tokens))
    info = {
        "kind": tok.kind,
        "vocab_size": tok.vocab_size,
        "bos_id": tok.bos_id,
        "eos_id": tok.eos_id,
        "dtype": dtype,
        "files": {f: sha256(os.path.join(args.out_dir, f)) for f in tok.files},
        "source": os.path.abspath(args.tokenizer_model or args.tokenizer_json) if (
            args.tokenizer_model or args.tokenizer_json) else None,
        "text_sha256": hashlib.sha256(data).hexdigest(),
    }
    with open(os.path.join(args.out_dir, "tokenizer_info.json"), "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    print(f"prepare_text: {n_files} files, {len(data)} bytes -> {counts[0]} train and {counts[1]} valid tokens "
          f"({tok.kind}, vocabulary {tok.vocab_size}, {dtype}) -> {args.out_dir}/train.bin, valid.bin"
          + "".join(f", {f}" for f in tok.files) + ", tokenizer_info.json")
    if wide:
        print("prepare_text: the vocabulary needs uint32 tokens: set data.dtype: uint32")


if __name__ == "__main__":
    main()
