#!/usr/bin/env python3
"""`trainer export`'s tokenizer files against transformers' AutoTokenizer.

Each case trains a SentencePiece model (or takes bytes), prepares data with
scripts/prepare_text.py, trains a tiny llama for one step and exports it.
Then, on 3000+ texts not used in training (whole fortunes, newlines inside,
from files the models never saw, plus variations: leading, trailing and
repeated spaces, tabs, emoji and CJK that only byte fallback spells, the
literal texts "<s>", "</s>", "<unk>", "<0x41>" and "▁"):
  - fast: AutoTokenizer.from_pretrained(DIR) with default arguments, in a
    process where `google.protobuf` and `sentencepiece` cannot be imported,
    must be a fast tokenizer and give `tok(text)["input_ids"]` equal to the
    expected ids for every text;
  - slow: AutoTokenizer.from_pretrained(DIR, use_fast=False) (LlamaTokenizer,
    which calls sentencepiece; protobuf blocked) must give the same ids.
Expected ids are SentencePiece's own encode (python3-sentencepiece). The one
deliberate difference: text equal to a control or unknown piece ("<s>",
"</s>", "<unk>") is that token on both Hugging Face paths, as on every Llama
tokenizer; SentencePiece reads its characters. So the expected ids of a text
are SentencePiece's encode of the stretches between such pieces, with the
pieces' ids in between; texts without them must equal encode() of the whole.
Decoding, on the texts without control-token text or <unk> (whose decoding
differs: "<unk>" against SentencePiece's " ⁇ "): the fast path equals
SentencePiece's decode of the ids; the slow path (LlamaTokenizer, legacy
mode) too, less a first space (LlamaTokenizer drops it; it also puts spaces
around special tokens, hence those texts are left out). For the run's own
model (no dummy prefix, byte fallback) the fast path gives back every text,
control-token text included ("▁" reads as a space, as in SentencePiece).

Cases:
  run       the model prepare_text.py trains (BPE, identity, no dummy prefix,
            byte fallback): tokenizer.json written;
  llama     a model as Llama's (BPE, identity, dummy prefix, byte fallback),
            given with --tokenizer-model: written;
  squeeze   dummy prefix, extra whitespace removed, no byte fallback: written;
  nfkc      BPE with SentencePiece's default nmt_nfkc normalization: refused;
  unigram   a Unigram model: refused;
  user      a user-defined piece: refused;
  bytes     prepare_text.py's default byte tokens: tokenizer.json written,
            ids = the UTF-8 bytes (use_fast=False gives the same fast
            tokenizer: there is no slow byte tokenizer class).
A refused case must say why in export's report, write no tokenizer.json, and
its slow path must still encode as above.

Usage: tokenizer_export_test.py TRAINER SOURCE_DIR WORK_DIR. Exit 77 when
transformers or sentencepiece cannot be imported (ctest: skipped).
"""
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time

SENTINEL = "--hf-worker"


def block_imports(names):
    """Makes `import name` fail in this process, as where it is not installed."""
    for n in names:
        sys.modules[n] = None


def worker(mode, spec_file, out_file):
    """Runs in a child: encodes and decodes every case's texts with transformers."""
    block_imports(["google", "google.protobuf"] + (["sentencepiece"] if mode == "fast" else []))
    try:
        import google.protobuf  # noqa: F401
        sys.exit("the protobuf block did not hold")
    except ImportError:
        pass
    import transformers
    transformers.utils.logging.set_verbosity_error()
    spec = json.load(open(spec_file))
    texts = json.load(open(spec["texts"]))
    out = {}
    for name, d in spec["dirs"].items():
        try:
            tok = (transformers.AutoTokenizer.from_pretrained(d) if mode == "fast"
                   else transformers.AutoTokenizer.from_pretrained(d, use_fast=False))
        except Exception as e:  # reported, and judged by the parent
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            continue
        ids = tok(texts)["input_ids"]
        out[name] = {"class": type(tok).__name__, "is_fast": tok.is_fast, "ids": ids,
                     "decoded": [tok.decode(x) for x in ids]}
    json.dump(out, open(out_file, "w"))


if len(sys.argv) > 1 and sys.argv[1] == SENTINEL:
    worker(*sys.argv[2:5])
    sys.exit(0)

try:
    import sentencepiece as spm
    import transformers  # noqa: F401  (the workers use it)
except ImportError as e:
    print(f"tokenizer_export_test: skipped: {e}")
    sys.exit(77)

TRAINER, SRC, WORK = sys.argv[1:4]
FORTUNES = "/usr/share/games/fortunes"
TRAIN_FILES = ["computers", "linux", "science", "wisdom", "people", "work"]
TEST_FILES = ["fortunes", "songs-poems", "zippy", "definitions", "literature", "politics", "humorists"]
failures = []
started = time.time()


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), **kw)
    if p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:])
        raise SystemExit(f"{' '.join(cmd[:3])} ...: exit {p.returncode}")
    return p.stdout


def read_fortunes(names):
    out = []
    for n in names:
        with open(os.path.join(FORTUNES, n), encoding="utf-8", errors="replace") as f:
            out += [t for t in f.read().split("\n%\n") if t.strip()]
    return out


def test_texts():
    """Held-out fortunes (their newlines kept) and variations of them."""
    rnd = random.Random(7)
    seen = set(read_fortunes(TRAIN_FILES))  # a few fortunes are in two files
    base = [t for t in read_fortunes(TEST_FILES) if t not in seen]
    rnd.shuffle(base)
    texts = base[:2400]
    odd = ["", " ", "  ", "\n", "\t", "a", " a", "a ", "  two  spaces  ", "\ttab first", "line\n\nbreaks\n",
           "<s>", "</s>", "<unk>", "<s></s>", " <s> ", "a<s>b", "x</s>\n<s>y", "<0x41>", "\u2581", "\u2581x \u2581",
           "\U0001F600", "日本語のテキスト", "emoji \U0001F680\U0001F30D and CJK 漢字 mixed", "café naïve ﬁ Å"]
    texts += odd
    extras = [" \U0001F600", " 日本", " <s>", "</s>", "\t", "  ", " <unk> ", " <0x41>", " \u2581"]
    for t in base[2400:3200]:
        t = t[:300]
        r = rnd.random()
        if r < 0.2:
            t = " " * rnd.randint(1, 3) + t
        elif r < 0.35:
            t = t + " " * rnd.randint(1, 3)
        elif r < 0.5:
            t = t.replace(" ", "  ")
        elif r < 0.6:
            t = t.replace(" ", "\t", 3)
        pos = rnd.randint(0, len(t))
        texts.append(t[:pos] + rnd.choice(extras) + t[pos:])
    return texts


def expected_ids(sp, text, specials):
    """SentencePiece's ids, with each control/unknown piece's text read as that token."""
    if not specials:
        return sp.encode(text)
    pattern = "(" + "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)) + ")"
    ids = []
    for part in re.split(pattern, text):
        if part in specials:
            ids.append(specials[part])
        elif part:
            ids += sp.encode(part)
    return ids


def train_sentencepiece(path, text, **options):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text.split("\n")), model_writer=model, vocab_size=400,
                                   num_threads=1, input_sentence_size=0, shuffle_input_sentence=False,
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2, **options)
    with open(path, "wb") as f:
        f.write(model.getvalue())


def train_and_export(name, prepare_args, vocab):
    d = os.path.join(WORK, name)
    run(["/usr/bin/python3", os.path.join(SRC, "scripts/prepare_text.py"), "--out-dir", f"{d}/data"] + prepare_args)
    cfg = os.path.join(d, "run.yaml")
    with open(cfg, "w") as f:
        f.write(f"model: {{arch: llama, vocab_size: {vocab}, d_model: 32, n_layers: 1, n_heads: 4, n_kv_heads: 2, "
                "d_ff: 64, max_seq_len: 16}\n"
                "train: {device: cpu, steps: 1, seq_len: 16, micro_batch_size: 2, global_batch_size: 2, "
                "eval_interval: 0}\n"
                f"data: {{train: [{d}/data/train.bin]}}\n"
                "checkpoint: {interval: 1}\nlog: {interval: 1, progress: lines}\n")
    run([TRAINER, "--config", cfg, "--set", f"run.dir={d}/run"])
    report = run([TRAINER, "export", "--checkpoint", f"{d}/run/ckpt", "--out", f"{d}/hf"])
    print(f"[{name}] " + report.strip().replace("\n", f"\n[{name}] "))
    return f"{d}/hf", report


def main():
    if not os.path.isdir(FORTUNES):
        raise SystemExit(f"no {FORTUNES}: install Debian's fortunes package (scripts/setup.sh)")
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    train_paths = [os.path.join(FORTUNES, n) for n in TRAIN_FILES]
    train_text = "\n".join(open(p, encoding="utf-8", errors="replace").read() for p in train_paths)
    texts = test_texts()
    print(f"{len(texts)} test texts")
    with open(os.path.join(WORK, "texts.json"), "w") as f:
        json.dump(texts, f)

    base = dict(model_type="bpe", byte_fallback=True, character_coverage=0.9995, normalization_rule_name="identity",
                remove_extra_whitespaces=False, add_dummy_prefix=True)
    variants = {
        "llama": dict(base),
        "squeeze": dict(base, byte_fallback=False, remove_extra_whitespaces=True),
        "nfkc": dict(base, normalization_rule_name="nmt_nfkc"),
        "unigram": dict(base, model_type="unigram"),
        "user": dict(base, user_defined_symbols=["<sep>"]),
    }
    refusals = {"nfkc": "normalization 'nmt_nfkc' rewrites characters", "unigram": "it is a Unigram model",
                "user": "'<sep>' is user-defined"}
    cases = {}
    cases["run"] = train_and_export("run", ["--tokenizer", "sentencepiece", "--vocab-size", "400"] + train_paths, 400)
    for name, opts in variants.items():
        model = os.path.join(WORK, f"{name}.model")
        train_sentencepiece(model, train_text, **opts)
        cases[name] = train_and_export(name, ["--tokenizer-model", model] + train_paths, 400)
    cases["bytes"] = train_and_export("bytes", train_paths, 256)
    print(f"prepared, trained and exported {len(cases)} cases in {time.time() - started:.0f} s")

    spec = os.path.join(WORK, "spec.json")
    with open(spec, "w") as f:
        json.dump({"texts": os.path.join(WORK, "texts.json"), "dirs": {n: c[0] for n, c in cases.items()}}, f)
    results = {}
    for mode in ("fast", "slow"):
        out = os.path.join(WORK, f"{mode}.json")
        run([sys.executable, os.path.abspath(__file__), SENTINEL, mode, spec, out])
        results[mode] = json.load(open(out))

    for name, (hf_dir, report) in cases.items():
        fast, slow = results["fast"][name], results["slow"][name]
        has_json = os.path.exists(os.path.join(hf_dir, "tokenizer.json"))
        if name == "bytes":
            want = [list(t.encode("utf-8")) for t in texts]
            check(has_json and fast.get("is_fast") is True, f"bytes: tokenizer.json written, loads as "
                  f"{fast.get('class', fast.get('error'))} with no protobuf and no sentencepiece")
            for mode, r in (("fast", fast), ("use_fast=False", slow)):
                same = sum(a == b for a, b in zip(r.get("ids", []), want))
                check(same == len(texts), f"bytes, {mode}: {same} of {len(texts)} texts give their UTF-8 bytes")
                back = sum(a == b for a, b in zip(r.get("decoded", []), texts))
                check(back == len(texts), f"bytes, {mode}: {back} of {len(texts)} decode back to the text")
            continue
        sp = spm.SentencePieceProcessor(model_file=os.path.join(hf_dir, "tokenizer.model"))
        specials = {sp.id_to_piece(i): i for i in range(sp.get_piece_size()) if sp.is_control(i) or sp.is_unknown(i)}
        want = [expected_ids(sp, t, specials) for t in texts]
        plain = [i for i, t in enumerate(texts) if not any(s in t for s in specials)]
        sp_decodable = [i for i in plain if sp.unk_id() not in want[i]]
        check(all(want[i] == sp.encode(texts[i]) for i in plain), f"{name}: the expectation is SentencePiece's "
              f"encode for the {len(plain)} texts without control-token text")
        if name in refusals:
            check(not has_json and "no tokenizer.json written" in report and refusals[name] in report,
                  f"{name}: refused, the report says why ('{refusals[name]}'), no tokenizer.json")
        else:
            check(has_json and "both AutoTokenizer paths encode as SentencePiece" in report,
                  f"{name}: tokenizer.json written and reported")
            check(fast.get("is_fast") is True, f"{name}: AutoTokenizer default loads "
                  f"{fast.get('class', fast.get('error'))} with no protobuf and no sentencepiece")
            got = fast.get("ids", [])
            bad = [i for i in range(len(texts)) if i >= len(got) or got[i] != want[i]]
            if bad:
                i = bad[0]
                print(f"  first difference, text {texts[i][:80]!r}:\n    fast {got[i][:40] if i < len(got) else None}"
                      f"\n    want {want[i][:40]}")
            check(not bad, f"{name}, fast: {len(texts) - len(bad)} of {len(texts)} texts give the expected ids")
            # The run's models give every text back; the others' decoding
            # equals SentencePiece's (which drops dummy prefixes and squeezed
            # spaces) on texts without control-token text or <unk>.
            dec = fast.get("decoded", [])
            if name == "run":
                back = [i for i in range(len(texts)) if i < len(dec) and dec[i] == texts[i].replace("\u2581", " ")]
                check(len(back) == len(texts), f"{name}, fast decode: {len(back)} of {len(texts)} texts come back")
            else:
                back = [i for i in sp_decodable if i < len(dec) and dec[i] == sp.decode(want[i])]
                check(len(back) == len(sp_decodable), f"{name}, fast decode: {len(back)} of {len(sp_decodable)} "
                      "texts without control-token text or <unk> decode as SentencePiece decodes")
        got = slow.get("ids", [])
        check("error" not in slow and slow.get("class") == "LlamaTokenizer",
              f"{name}: use_fast=False loads {slow.get('class', slow.get('error'))} with no protobuf")
        bad = [i for i in range(len(texts)) if i >= len(got) or got[i] != want[i]]
        check(not bad, f"{name}, slow: {len(texts) - len(bad)} of {len(texts)} texts give the expected ids")
        # LlamaTokenizer (add_prefix_space) drops a first space the text had.
        dec = slow.get("decoded", [])
        back = [i for i in sp_decodable if i < len(dec) and dec[i] == less_first_space(sp.decode(want[i]))]
        check(len(back) == len(sp_decodable), f"{name}, slow decode: {len(back)} of {len(sp_decodable)} texts "
              "without control-token text or <unk> decode as SentencePiece decodes, less a first space")

    print(f"{time.time() - started:.0f} s")
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all tokenizer export checks passed")


def less_first_space(text):
    return text[1:] if text.startswith(" ") else text


if __name__ == "__main__":
    main()
