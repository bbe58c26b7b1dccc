#!/usr/bin/env python3
"""Prepares a corpus of documents for the trainer: Megatron .bin/.idx with
one sequence per document, split into train and validation by documents.

Inputs (any mix, globs allowed; the order given, a glob's matches sorted):
  JSON lines (*.jsonl, *.json, *.ndjson, optionally .gz or .zst): one document
      per record, its text in --text-field (default "text");
  Parquet (*.parquet): the --text-field column;
  a Hugging Face datasets folder (save_to_disk; a DatasetDict's --hf-split);
  plain text (any other file): --text-split file (the whole file one
      document, the default), paragraph (blank-line separated) or line.
Parquet and datasets folders need pyarrow, .zst the zstandard module
(scripts/setup.sh test puts pyarrow in .venv-hf and python3-zstandard in
Debian's python3).

Tokenizers: bytes (the default, vocabulary 256), a SentencePiece model
(--tokenizer-model), a Hugging Face tokenizer.json (--tokenizer-json, needs
the tokenizers package, e.g. .venv-hf/bin/python). Every document gets the
tokenizer's BOS before it and its EOS after it where it has them (--no-bos,
--no-eos).

Output in --out-dir: train.bin/.idx and valid.bin/.idx (Megatron's indexed
dataset, the document index included; tokens uint16 below 65500 ids, else
int32, Megatron's rule), the tokenizer file, tokenizer_info.json (which the
trainer reads next to the data) and rejected.tsv (every bad record: file,
place, reason). A document goes to validation when a hash of its text falls
in --valid-fraction, so the split, like every output byte, is the same for
any --workers. Everything is written into DIR/.partial and moved into place
at the end: an interrupted run leaves an earlier preparation intact.

Bad records (a blank line, bad UTF-8, a line that is not a JSON object, a
missing, null, non-string or empty text field, a truncated compressed file)
are counted, listed in rejected.tsv and summarised on the console; they never
stop the run unless no document is left.

Train on it with data.train: [DIR/train], data.valid: [DIR/valid].
"""
import argparse
import array
import collections
import hashlib
import json
import multiprocessing
import os
import shutil
import time

from corpus import chat as chat_mod
from corpus import readers
from corpus.megatron_writer import MegatronWriter, token_dtype
from corpus.progress import ProgressLine
from corpus.text_tokenizers import Bytes, HuggingFace, SentencePiece, fail
from corpus.tokenizer_info import write_tokenizer_info

CHUNK_BYTES = 1 << 20  # text per task sent to a worker, at most


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="files, globs or datasets folders")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--text-field", default="text", help="the field (JSON) or column (Parquet, datasets) of the text")
    ap.add_argument("--text-split", choices=["file", "paragraph", "line"], default="file",
                    help="documents of plain text files")
    ap.add_argument("--hf-split", default="train", help="the split of a DatasetDict folder")
    ap.add_argument("--valid-fraction", type=float, default=0.01, help="share of documents for validation")
    ap.add_argument("--tokenizer-model", default="", help="a SentencePiece .model")
    ap.add_argument("--tokenizer-json", default="", help="a Hugging Face tokenizer.json")
    ap.add_argument("--no-bos", action="store_true", help="no BOS before each document")
    ap.add_argument("--no-eos", action="store_true", help="no EOS after each document")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="tokenizing processes (default: cores)")
    ap.add_argument("--chunk-docs", type=int, default=2048, help="documents per worker task, at most")
    ap.add_argument("--progress", choices=["auto", "bar", "lines", "none"], default="auto")
    ap.add_argument("--chat", action="store_true",
                    help="records are conversations (--messages-field) rendered with the tokenizer's chat template")
    ap.add_argument("--messages-field", default="messages", help="with --chat: the list of {role, content}")
    ap.add_argument("--chat-template", default="",
                    help="with --chat: the tokenizer_config.json holding chat_template (default: the one beside "
                         "--tokenizer-json)")
    ap.add_argument("--loss-on", choices=["assistant", "all"], default="assistant",
                    help="with --chat: train on the assistant's replies only (a loss mask), or on every token")
    args = ap.parse_args()
    if args.chat and not args.tokenizer_json:
        fail("--chat renders conversations with a Hugging Face tokenizer's chat template: give --tokenizer-json")
    if args.chat and not args.chat_template:
        args.chat_template = os.path.join(os.path.dirname(os.path.abspath(args.tokenizer_json)),
                                          "tokenizer_config.json")
    if args.chat and not os.path.isfile(args.chat_template):
        fail(f"--chat: no {args.chat_template} (the tokenizer_config.json with the chat_template); "
             "give it with --chat-template")
    if args.tokenizer_model and args.tokenizer_json:
        fail("--tokenizer-model and --tokenizer-json exclude each other")
    if not 0 <= args.valid_fraction < 1:
        fail(f"--valid-fraction {args.valid_fraction}: must be in [0, 1)")
    if args.chunk_docs < 1:
        fail(f"--chunk-docs {args.chunk_docs}: must be at least 1")
    if args.workers < 1:
        fail(f"--workers {args.workers}: must be at least 1")
    return args


def make_tokenizer(kind, out_dir, path):
    """Copies the tokenizer into out_dir unless it is already there."""
    if kind == "sentencepiece":
        return SentencePiece(out_dir, None, path, 0)
    if kind == "huggingface":
        return HuggingFace(out_dir, path)
    return Bytes()


_worker = {}


def worker_init(kind, staging, path, bos, eos, valid_fraction, chat):
    """chat: None, or (template, special tokens, loss_on) for conversations."""
    tok = make_tokenizer(kind, staging, path)
    renderer = None
    if chat:
        renderer = chat_mod.ChatRenderer(chat[0], chat[1])
    _worker.update(tok=tok, bos=bos, eos=eos, cut=int(valid_fraction * (1 << 64)), renderer=renderer,
                   loss_on=chat[2] if chat else None)


def doc_bytes(doc):
    """A document's bytes for the split hash and the digest: its text, or a conversation's JSON."""
    if isinstance(doc, str):
        return doc.encode("utf-8")
    return json.dumps(doc, ensure_ascii=False, sort_keys=True).encode("utf-8")


def encode_docs(docs):
    """(ids, loss mask or None, error or None) per document."""
    w = _worker
    if w["renderer"] is None:
        return [(ids, None, None) for ids in w["tok"].encode_batch(docs)]
    out = []
    for messages in docs:
        try:
            ids, mask = chat_mod.encode_chat(w["renderer"], w["tok"].tok, messages, w["loss_on"])
            out.append((ids, mask, None))
        except chat_mod.ChatError as e:
            out.append((None, None, str(e)))
    return out


def encode_chunk(docs):
    """Per document (bytes of its ids or None, is-validation, loss mask or None,
    error or None), the digest of the documents and their bytes."""
    tok, bos, eos, cut = _worker["tok"], _worker["bos"], _worker["eos"], _worker["cut"]
    typecode = "H" if tok.vocab_size < 65500 else "i"
    digest, out, nbytes = hashlib.sha256(), [], 0
    for doc, (ids, mask, error) in zip(docs, encode_docs(docs)):
        raw = doc_bytes(doc)
        digest.update(len(raw).to_bytes(8, "little") + raw)
        nbytes += len(raw)
        h = int.from_bytes(hashlib.blake2b(raw, digest_size=8, key=b"trainer-split").digest(), "little")
        if error is not None:
            out.append((None, False, None, error))
            continue
        head, tail = ([bos] if bos is not None else []), ([eos] if eos is not None else [])
        if mask is not None:
            mask = bytes(len(head)) + mask + bytes(len(tail))
        out.append((array.array(typecode, head + ids + tail).tobytes(), h < cut, mask, None))
    return out, digest.digest(), nbytes


def chunks(records, max_docs):
    """Groups records so that each group's good texts make one task."""
    group, size = [], 0
    for rec in records:
        group.append(rec)
        size += len(rec.text) if isinstance(rec.text, str) else len(json.dumps(rec.text)) if rec.text else 0
        if size >= CHUNK_BYTES or len(group) >= max_docs:
            yield group
            group, size = [], 0
    if group:
        yield group


def encoded(records, args, init_args):
    """(records, encode_chunk's result) per group, in input order, with at most
    two groups per worker in flight (bounded memory)."""
    if args.workers == 1:
        worker_init(*init_args)
        for group in chunks(records, args.chunk_docs):
            yield group, encode_chunk([r.text for r in group if r.text is not None])
        return
    with multiprocessing.get_context("fork").Pool(args.workers, worker_init, init_args) as pool:
        window = collections.deque()
        for group in chunks(records, args.chunk_docs):
            window.append((group, pool.apply_async(encode_chunk, ([r.text for r in group if r.text is not None],))))
            if len(window) > 2 * args.workers:
                group, result = window.popleft()
                yield group, result.get()
        while window:
            group, result = window.popleft()
            yield group, result.get()


class Outputs:
    def __init__(self, staging, dtype, masked):
        self.train = MegatronWriter(os.path.join(staging, "train"), dtype, masked)
        self.valid = MegatronWriter(os.path.join(staging, "valid"), dtype, masked)
        self.rejected = open(os.path.join(staging, "rejected.tsv"), "w", encoding="utf-8")
        self.rejected.write("file\twhere\treason\n")
        self.reasons = collections.Counter()
        self.first_bad = []
        self.digest = hashlib.sha256()
        self.docs = self.text_bytes = 0

    def take(self, group, result):
        docs, digest, nbytes = result
        self.digest.update(digest)
        self.text_bytes += nbytes
        it = iter(docs)
        for rec in group:
            if rec.text is None:
                self.reject(rec)
                continue
            ids, valid, mask, error = next(it)
            if error is not None:
                rec.error = error
                self.reject(rec)
                continue
            (self.valid if valid else self.train).add(array.array(self.train.typecode, ids), mask)
            self.docs += 1

    def reject(self, rec):
        self.rejected.write(f"{rec.source}\t{rec.where}\t{rec.error}\n")
        self.reasons[rec.error.split(" (")[0]] += 1
        if len(self.first_bad) < 10:
            self.first_bad.append(f"{rec.source}, {rec.where}: {rec.error}")

    def close(self):
        self.train.close()
        self.valid.close()
        self.rejected.close()


def report(out, args, seconds):
    bad = sum(out.reasons.values())
    mb = out.text_bytes / 1e6
    print(f"prepare_corpus: {out.docs} documents ({mb:.1f} MB of text) in {seconds:.1f} s "
          f"({out.docs / max(seconds, 1e-9):.0f} documents/s, {mb / max(seconds, 1e-9):.1f} MB/s, "
          f"{args.workers} workers): train {out.train.tokens} tokens in {len(out.train.sizes)} documents, "
          f"valid {out.valid.tokens} tokens in {len(out.valid.sizes)} documents -> {args.out_dir}")
    if bad:
        print(f"prepare_corpus: {bad} bad records left out, listed in {args.out_dir}/rejected.tsv: " +
              ", ".join(f"{n} {reason}" for reason, n in out.reasons.most_common()))
        for line in out.first_bad:
            print(f"  {line}")
    if args.valid_fraction > 0 and not out.valid.sizes:
        print(f"prepare_corpus: warning: no document fell into validation ({out.docs} documents, "
              f"--valid-fraction {args.valid_fraction}); data.valid would be empty")


def move_into_place(staging, out_dir, names):
    for name in names:
        os.replace(os.path.join(staging, name), os.path.join(out_dir, name))
    shutil.rmtree(staging)


def main():
    args = parse_args()
    kind = "huggingface" if args.tokenizer_json else "sentencepiece" if args.tokenizer_model else "bytes"
    path = args.tokenizer_json or args.tokenizer_model
    chat = None
    if args.chat:
        try:
            template, specials = chat_mod.load_template(args.chat_template)
            chat_mod.ChatRenderer(template, specials)  # a template Jinja cannot parse fails here, once
        except Exception as e:
            fail(f"--chat: {e}")
        chat = (template, specials, args.loss_on)
    field = args.messages_field if args.chat else args.text_field
    check = (lambda v: chat_mod.check_messages(v, field)) if args.chat else None
    progress, records = readers.records(args.inputs, field, args.text_split, args.hf_split, check)
    os.makedirs(args.out_dir, exist_ok=True)
    staging = os.path.join(args.out_dir, ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    tok = make_tokenizer(kind, staging, path)
    # A chat template writes its own special tokens.
    bos = None if args.no_bos or args.chat else tok.bos_id
    eos = None if args.no_eos or args.chat else tok.eos_id
    dtype = token_dtype(tok.vocab_size)
    masked = args.chat and args.loss_on == "assistant"
    out = Outputs(staging, dtype, masked)
    bar = ProgressLine(args.progress, progress)
    start = time.monotonic()
    init_args = (kind, staging, os.path.join(staging, tok.files[0]) if tok.files else "", bos, eos,
                 args.valid_fraction, chat)
    for group, result in encoded(records, args, init_args):
        out.take(group, result)
        bar.update(out.docs)
    out.close()
    bar.finish()
    if out.docs == 0:
        shutil.rmtree(staging)
        fail(f"no document left: {sum(out.reasons.values())} bad records ({dict(out.reasons)}); "
             "nothing written")
    write_tokenizer_info(staging, tok, dtype, path, None, {
        "format": "megatron", "documents": {"train": len(out.train.sizes), "valid": len(out.valid.sizes)},
        "tokens": {"train": out.train.tokens, "valid": out.valid.tokens}, "rejected": sum(out.reasons.values()),
        "bos_added": bos is not None, "eos_added": eos is not None, "documents_sha256": out.digest.hexdigest(),
        "chat": {"template": args.chat_template, "loss_on": args.loss_on} if args.chat else None})
    names = ["train.bin", "train.idx", "valid.bin", "valid.idx", "rejected.tsv", "tokenizer_info.json"] + tok.files
    if masked:
        names += ["train.lossmask", "valid.lossmask"]
    for stale in ("train.lossmask", "valid.lossmask"):  # a mask of earlier data must not sit next to new data
        if stale not in names and os.path.exists(os.path.join(args.out_dir, stale)):
            os.remove(os.path.join(args.out_dir, stale))
    if args.chat:
        shutil.copyfile(args.chat_template, os.path.join(staging, "tokenizer_config.json"))
        names.append("tokenizer_config.json")
    for stale in ("tokenizer.model", "tokenizer.json"):  # another tokenizer must not sit next to new data
        if stale not in tok.files and os.path.exists(os.path.join(args.out_dir, stale)):
            os.remove(os.path.join(args.out_dir, stale))
    move_into_place(staging, args.out_dir, names)
    report(out, args, time.monotonic() - start)


if __name__ == "__main__":
    main()
