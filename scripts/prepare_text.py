#!/usr/bin/env python3
"""Byte-level tokenisation of text files into uint16 token files.

Every byte is one token (vocabulary 256), so no tokenizer download is needed.
The concatenated text is split into train.bin and valid.bin (the last
--valid-fraction of the bytes); files are read in sorted order so the output
is the same on every machine.
"""
import argparse
import array
import glob
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("inputs", nargs="+", help="text files or glob patterns")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--valid-fraction", type=float, default=0.1)
    args = ap.parse_args()

    paths = []
    for pat in args.inputs:
        hits = sorted(glob.glob(pat)) or ([pat] if os.path.exists(pat) else [])
        if not hits:
            sys.exit(f"prepare_text: no file matches {pat!r}")
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
        sys.exit(f"prepare_text: only {len(data)} bytes of text; need at least 1024")
    cut = int(len(data) * (1 - args.valid_fraction))
    os.makedirs(args.out_dir, exist_ok=True)
    for name, chunk in (("train.bin", data[:cut]), ("valid.bin", data[cut:])):
        tokens = array.array("H", memoryview(chunk).tolist())  # one uint16 per byte
        if sys.byteorder != "little":
            tokens.byteswap()
        with open(os.path.join(args.out_dir, name), "wb") as f:
            tokens.tofile(f)
    print(f"prepare_text: {len(seen)} files, {cut} train and {len(data) - cut} valid tokens "
          f"-> {args.out_dir}/train.bin, valid.bin")


if __name__ == "__main__":
    main()
