"""tokenizer_info.json: what the trainer reads next to the data at start-up
(interop/run_tokenizer.cpp) and copies into its run directory."""
import hashlib
import json
import os


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_tokenizer_info(out_dir, tok, dtype, source, text_sha256, extra=None):
    """source: the tokenizer file the user gave (None when trained here or bytes)."""
    info = {
        "kind": tok.kind,
        "vocab_size": tok.vocab_size,
        "bos_id": tok.bos_id,
        "eos_id": tok.eos_id,
        "dtype": dtype,
        "files": {f: sha256(os.path.join(out_dir, f)) for f in tok.files},
        "source": os.path.abspath(source) if source else None,
        "text_sha256": text_sha256,
    }
    info.update(extra or {})
    with open(os.path.join(out_dir, "tokenizer_info.json"), "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
