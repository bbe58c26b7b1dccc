"""A Megatron-LM indexed dataset (PREFIX.bin + PREFIX.idx), written one
document at a time, each document one sequence.

The index, as Megatron's reader expects it (and data/dataset_megatron.cpp
reads it): "MMIDIDX\\0\\0", u64 version 1, u8 dtype code, u64 sequence count
S, u64 document count D + 1, i32 sizes[S], i64 byte pointers[S], i64
document_indices[D + 1] = 0, 1, ..., S (document d is sequence d).
The caller writes into a staging folder and moves the files into place when
everything is written (prepare_corpus.py), so an interrupted preparation
leaves an earlier dataset intact.
"""
import array
import struct
import sys

MAGIC = b"MMIDIDX\x00\x00"
# Megatron's DType codes for the two token types it writes.
DTYPES = {"uint16": (8, "H", 2), "int32": (4, "i", 4)}


def token_dtype(vocab_size):
    """Megatron's own rule (uint16 below 65500 ids, else int32)."""
    return "uint16" if vocab_size < 65500 else "int32"


class MegatronWriter:
    """masked: also PREFIX.lossmask (data/loss_mask.h): "TRLMASK1", u64 token
    count, one byte per token (1: a target), in the stream's order."""

    def __init__(self, prefix, dtype, masked=False):
        self.prefix, self.dtype = prefix, dtype
        self.code, self.typecode, self.itemsize = DTYPES[dtype]
        self.bin = open(prefix + ".bin", "wb")
        self.mask = open(prefix + ".lossmask", "wb") if masked else None
        if self.mask:
            self.mask.write(b"TRLMASK1" + bytes(8))  # the count is written at close
        self.sizes = array.array("i")
        self.tokens = 0

    def add(self, tokens, mask=None):
        """One document's token ids (a list or an array of self.typecode), and
        its mask bytes when the writer is masked."""
        a = tokens if isinstance(tokens, array.array) else array.array(self.typecode, tokens)
        if (self.mask is None) != (mask is None) or (mask is not None and len(mask) != len(a)):
            raise ValueError(f"{self.prefix}: a document of {len(a)} tokens with a mask of "
                             f"{None if mask is None else len(mask)} bytes")
        if sys.byteorder != "little":
            a.byteswap()
        a.tofile(self.bin)
        if self.mask:
            self.mask.write(mask)
        self.sizes.append(len(a))
        self.tokens += len(a)

    def close(self):
        self.bin.close()
        if self.mask:
            self.mask.seek(8)
            self.mask.write(struct.pack("<Q", self.tokens))
            self.mask.close()
        pointers = array.array("q", [0]) * len(self.sizes)
        at = 0
        for i, n in enumerate(self.sizes):
            pointers[i] = at
            at += n * self.itemsize
        docs = array.array("q", range(len(self.sizes) + 1))
        with open(self.prefix + ".idx", "wb") as f:
            f.write(MAGIC + struct.pack("<QBQQ", 1, self.code, len(self.sizes), len(docs)))
            for a in (self.sizes, pointers, docs):
                if sys.byteorder != "little":
                    a.byteswap()
                a.tofile(f)
