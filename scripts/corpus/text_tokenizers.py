"""The tokenizers of the preparation tools (prepare_text.py, prepare_corpus.py).

Each one has kind, files (what is copied next to the data), vocab_size,
bos_id and eos_id (None where it has none), encode(bytes) for a chunk of
text and encode_batch(list of str) for documents. Constructing one copies
its file into the output folder; constructed again from that copy (as the
parallel workers do), it copies nothing.
"""
import io
import os
import shutil
import sys


def fail(msg):
    sys.exit(f"{os.path.basename(sys.argv[0]).removesuffix('.py')}: {msg}")


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

    def encode_batch(self, texts):
        return [list(t.encode("utf-8")) for t in texts]


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

    def encode_batch(self, texts):
        return self.sp.encode(texts)


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

    def encode_batch(self, texts):
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]
