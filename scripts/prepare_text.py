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
import os
import sys

from corpus.text_tokenizers import Bytes, HuggingFace, SentencePiece, fail
from corpus.tokenizer_info import write_tokenizer_info


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
    write_tokenizer_info(args.out_dir, tok, dtype, args.tokenizer_model or args.tokenizer_json,
                         hashlib.sha256(data).hexdigest())
    print(f"prepare_text: {n_files} files, {len(data)} bytes -> {counts[0]} train and {counts[1]} valid tokens "
          f"({tok.kind}, vocabulary {tok.vocab_size}, {dtype}) -> {args.out_dir}/train.bin, valid.bin"
          + "".join(f", {f}" for f in tok.files) + ", tokenizer_info.json")
    if wide:
        print("prepare_text: the vocabulary needs uint32 tokens: set data.dtype: uint32")


if __name__ == "__main__":
    main()
