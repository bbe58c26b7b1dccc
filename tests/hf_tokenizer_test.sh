#!/usr/bin/env bash
# A Hugging Face tokenizer.json end to end: the `tokenizers` package (from
# PyPI, in .venv-hf when scripts/setup.sh could install it) trains a
# byte-level BPE on the license texts; scripts/prepare_text.py --tokenizer-json
# encodes them with it; a tiny model trains on them and records it; the
# binary's decoding of the data's first ids (through `trainer generate`)
# equals the package's own decode. Without the package: exit 77 (skipped).
set -euo pipefail
BIN=$1 SRC=$2 WORK=$3
PY="$SRC/.venv-hf/bin/python"
if ! "$PY" -c "import tokenizers" 2>/dev/null; then
  echo "skipped: no Python with the tokenizers package at $PY (scripts/setup.sh installs it from PyPI when it can)"
  exit 77
fi
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK"
fail() { echo "FAIL: $*"; exit 1; }
"$PY" - <<'PY'
import glob
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train(sorted(glob.glob("/usr/share/common-licenses/*")),
          trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
tok.save("tokenizer.json")
PY
"$PY" "$SRC/scripts/prepare_text.py" --out-dir data --tokenizer-json tokenizer.json '/usr/share/common-licenses/*' | tee prep.txt
grep -q "(huggingface, vocabulary 400, uint16)" prep.txt || fail "prepare_text did not report the tokenizer"
"$BIN" --config "$SRC/configs/tiny.yaml" --set model.vocab_size=400 --set model.d_model=32 --set train.steps=5 \
  --set train.seq_len=32 --set model.max_seq_len=32 --set train.eval_interval=0 --set checkpoint.interval=5 \
  --set log.progress=lines --set run.dir="$WORK/run" --set data.train="[$WORK/data/train.bin]" \
  --set data.valid="[$WORK/data/valid.bin]" > train.txt 2>&1 || { cat train.txt; fail "training"; }
grep -q "^tokenizer: huggingface $WORK/data/tokenizer.json, vocabulary 400" train.txt || fail "no tokenizer line"
ids=$("$PY" -c "import array; a = array.array('H'); a.frombytes(open('data/train.bin', 'rb').read()[:60]); print(' '.join(map(str, a)))")
"$BIN" generate --checkpoint run/ckpt --prompt "$ids" --tokens 1 --temperature 0 > cpp.txt 2> err.txt ||
  { cat err.txt; fail "generate"; }
grep -q "a prompt must be token ids" err.txt || fail "no warning that the prompt is ids"
"$PY" - "$ids" <<'PY'
import sys
from tokenizers import Tokenizer
ref = Tokenizer.from_file("tokenizer.json").decode([int(x) for x in sys.argv[1].split()], skip_special_tokens=False)
# The generated token may end in part of a UTF-8 character: compare as text
# up to the prompt's last whole character.
ref = ref.rstrip("\ufffd")
cpp = open("cpp.txt", encoding="utf-8", errors="replace").read()
print(f"hf decode: {ref!r}\ntrainer:   {cpp[:len(ref) + 10]!r}")
sys.exit(0 if len(ref) > 20 and cpp.startswith(ref) else "the binary's decoding differs from the tokenizers package's")
PY
# A vocabulary of 65536 ids or more needs uint32 tokens: a word-level
# tokenizer of 70000 entries (the license words first).
"$PY" - <<'PY'
import glob, re
from tokenizers import Tokenizer, models, pre_tokenizers
words = sorted({w for p in glob.glob("/usr/share/common-licenses/*") for w in re.findall(r"\w+|[^\w\s]", open(p, errors="replace").read())})
vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
for i in range(70000 - len(vocab)):
    vocab[f"filler{i}"] = len(vocab)
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.save("wide.json")
PY
"$PY" "$SRC/scripts/prepare_text.py" --out-dir wide --tokenizer-json wide.json '/usr/share/common-licenses/*' | tee wide.txt
grep -q "(huggingface, vocabulary 70000, uint32)" wide.txt && grep -q "set data.dtype: uint32" wide.txt ||
  fail "a 70000-id vocabulary did not give uint32 tokens"
grep -q '"dtype": "uint32"' wide/tokenizer_info.json || fail "tokenizer_info.json does not say uint32"
WIDE=(--config "$SRC/configs/tiny.yaml" --set model.vocab_size=70000 --set model.d_model=32 --set train.steps=2
      --set train.seq_len=32 --set model.max_seq_len=32 --set train.eval_interval=0 --set log.progress=lines
      --set run.dir="$WORK/run_wide" --set data.train="[$WORK/wide/train.bin]" --set data.valid="[$WORK/wide/valid.bin]")
"$BIN" "${WIDE[@]}" --set data.dtype=uint32 > wide_train.txt 2>&1 || { cat wide_train.txt; fail "training on uint32 tokens"; }
set +e; "$BIN" "${WIDE[@]}" --set data.dtype=uint16 > wide_bad.txt 2>&1; rc=$?; set -e
[ $rc = 2 ] && grep -q "the data was written as uint32 tokens, data.dtype is uint16" wide_bad.txt ||
  { cat wide_bad.txt; fail "data.dtype uint16 on uint32 data: exit $rc"; }
echo "hf_tokenizer_test: tokenizer.json data trained on, decoded like the tokenizers package; 70000 ids as uint32"
