#!/usr/bin/env bash
# Tokenizers end to end, through the real binary and scripts/prepare_text.py:
# a tiny model trained on SentencePiece data records its tokenizer, samples
# text at the end, and `trainer generate` continues a prompt from its
# checkpoint with the key/value cache, greedily equal to the no-cache path;
# the same for byte-level data; then the bad inputs: a tokenizer larger than
# model.vocab_size (exit 2), an empty prompt (exit 2), a missing or corrupt
# checkpoint (exit 1), a recorded tokenizer whose file is gone (exit 1).
# Without libsentencepiece in the build or python3-sentencepiece it says why
# and exits 77 (skipped).
set -euo pipefail
BIN=$1 SRC=$2 WORK=$3 HAVE_SP=$4
if [ "$HAVE_SP" != "ON" ]; then
  echo "skipped: this build has no libsentencepiece (apt-get install libsentencepiece-dev, reconfigure)"; exit 77
fi
if ! /usr/bin/python3 -c "import sentencepiece" 2>/dev/null; then
  echo "skipped: /usr/bin/python3 has no sentencepiece module (apt-get install python3-sentencepiece)"; exit 77
fi
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
fail() { echo "FAIL: $*"; exit 1; }
expect_exit() {  # CODE WHAT CMD...: runs CMD, which must exit CODE; its stderr in err.txt
  local code=$1 what=$2; shift 2
  set +e; "$@" > out.txt 2> err.txt; local rc=$?; set -e
  [ "$rc" = "$code" ] || { cat out.txt err.txt; fail "$what: exit $rc, expected $code"; }
}

/usr/bin/python3 "$SRC/scripts/prepare_text.py" --out-dir sp --tokenizer sentencepiece --vocab-size 400 \
  '/usr/share/common-licenses/*' | tee prep.txt
grep -q "sentencepiece, vocabulary 400, uint16" prep.txt || fail "prepare_text did not report the tokenizer"
# Deterministic: the same text gives the same model and tokens.
/usr/bin/python3 "$SRC/scripts/prepare_text.py" --out-dir sp2 --tokenizer sentencepiece --vocab-size 400 \
  '/usr/share/common-licenses/*' > /dev/null
cmp sp/tokenizer.model sp2/tokenizer.model && cmp sp/train.bin sp2/train.bin || fail "two preparations differ"
/usr/bin/python3 "$SRC/scripts/prepare_text.py" --out-dir bytes '/usr/share/common-licenses/*' > /dev/null

TINY=(--set model.vocab_size=400 --set model.d_model=32 --set model.max_seq_len=32 --set train.seq_len=32
      --set train.steps=40 --set train.micro_batch_size=8 --set train.global_batch_size=8 --set train.eval_interval=0
      --set log.interval=20 --set log.progress=lines --set checkpoint.interval=40 --set log.sample_tokens=16
      --set log.sample_prompt=The --set train.threads=2)
"$BIN" --config "$SRC/configs/tiny.yaml" "${TINY[@]}" --set run.dir="$WORK/run_sp" \
  --set data.train="[$WORK/sp/train.bin]" --set data.valid="[$WORK/sp/valid.bin]" > train.txt 2>&1 ||
  { cat train.txt; fail "training on SentencePiece data"; }
grep -q "^tokenizer: sentencepiece $WORK/sp/tokenizer.model, vocabulary 400 (model.vocab_size 400)" train.txt ||
  { cat train.txt; fail "the run did not report its tokenizer"; }
[ -f run_sp/tokenizer/tokenizer.model ] && [ -f run_sp/tokenizer/tokenizer_info.json ] ||
  fail "the tokenizer was not copied into the run directory"
grep -q '"data_dir"' run_sp/tokenizer/tokenizer_info.json || fail "tokenizer_info.json does not say where it came from"
sed -n '/^sample/,$p' train.txt | tee sample.txt
sed -n 2p sample.txt | grep -q "^The" || fail "the end-of-run sample does not start with its prompt as text"

CK=run_sp/ckpt/step_00000040
"$BIN" generate --checkpoint $CK --prompt "The license" --tokens 24 --temperature 0 --compare > gen.txt 2> gen_err.txt ||
  { cat gen.txt gen_err.txt; fail "generate on the SentencePiece checkpoint"; }
cat gen.txt gen_err.txt
grep -q "^The license" gen.txt || fail "generate did not print the prompt as text"
[ "$(wc -c < gen.txt)" -gt 20 ] || fail "generate printed almost nothing"
grep -q "tokenizer sentencepiece from $WORK/run_sp/tokenizer" gen_err.txt || fail "generate did not use the run's tokenizer"
grep -q "tokens agree: 24 of 24" gen_err.txt || fail "greedy cached tokens differ from the no-cache path"
# Sampling is reproducible under a seed; top-k runs.
"$BIN" generate --checkpoint $CK --prompt "The" --tokens 60 --top-k 5 --seed 3 > s1.txt 2> /dev/null
"$BIN" generate --checkpoint $CK --prompt "The" --tokens 60 --top-k 5 --seed 3 > s2.txt 2> s_err.txt
cmp -s s1.txt s2.txt || fail "the same seed sampled different text"
grep -q "the window slides" s_err.txt || fail "generating past the window did not say how it continues"
# The checkpoint root (with `latest`) works too.
"$BIN" generate --checkpoint run_sp/ckpt --prompt "The" --tokens 4 > /dev/null 2>&1 || fail "--checkpoint ROOT"

# Byte-level data: text too, with the bytes tokenizer recorded by the run.
"$BIN" --config "$SRC/configs/tiny.yaml" "${TINY[@]}" --set model.vocab_size=256 --set run.dir="$WORK/run_bytes" \
  --set data.train="[$WORK/bytes/train.bin]" --set data.valid="[$WORK/bytes/valid.bin]" > train_b.txt 2>&1 ||
  { cat train_b.txt; fail "training on byte data"; }
grep -q "^tokenizer: bytes, vocabulary 256" train_b.txt || fail "the byte-level run did not report its tokenizer"
"$BIN" generate --checkpoint run_bytes/ckpt/step_00000040 --prompt "The " --tokens 20 --temperature 0 --compare \
  > gen_b.txt 2> gen_b_err.txt || { cat gen_b.txt gen_b_err.txt; fail "generate on the byte checkpoint"; }
cat gen_b.txt
grep -q "^The " gen_b.txt && grep -q "tokens agree: 20 of 20" gen_b_err.txt || fail "byte-level generate"

# Bad inputs.
expect_exit 2 "a tokenizer larger than model.vocab_size" "$BIN" --config "$SRC/configs/tiny.yaml" "${TINY[@]}" \
  --set model.vocab_size=300 --set run.dir="$WORK/run_small" --set data.train="[$WORK/sp/train.bin]" \
  --set data.valid="[$WORK/sp/valid.bin]"
grep -q "$WORK/sp/tokenizer.model: the data's tokenizer has a vocabulary of 400 ids, larger than model.vocab_size 300" \
  err.txt || { cat err.txt; fail "the vocabulary error does not name the file and both sizes"; }
expect_exit 2 "generate with a tokenizer larger than the checkpoint's model" "$BIN" generate \
  --checkpoint run_bytes/ckpt --prompt "The" --tokenizer sp/tokenizer.model
grep -q "sp/tokenizer.model: the tokenizer has a vocabulary of 400 ids, larger than the checkpoint's model.vocab_size 256" \
  err.txt || { cat err.txt; fail "generate's vocabulary error does not name the file and both sizes"; }
expect_exit 2 "an empty prompt" "$BIN" generate --checkpoint $CK --prompt ""
grep -q "prompt is empty" err.txt || fail "the empty prompt message"
expect_exit 1 "a missing checkpoint" "$BIN" generate --checkpoint "$WORK/nowhere" --prompt "The"
grep -q "$WORK/nowhere: no such directory" err.txt || fail "the missing checkpoint is not named"
cp -r $CK broken_ck
f=$(ls broken_ck/*.safetensors | head -1)
printf 'XXXX' | dd of="$f" bs=1 seek=200 conv=notrunc 2> /dev/null
expect_exit 1 "a corrupt checkpoint" "$BIN" generate --checkpoint broken_ck --prompt "The"
grep -q "broken_ck/rank_" err.txt || { cat err.txt; fail "the corrupt checkpoint file is not named"; }
rm run_sp/tokenizer/tokenizer.model
expect_exit 1 "a recorded tokenizer whose file is missing" "$BIN" generate --checkpoint $CK --prompt "The"
grep -q "$WORK/run_sp/tokenizer/tokenizer.model is missing" err.txt || { cat err.txt; fail "the missing tokenizer message"; }
# --tokenizer overrides the lookup.
"$BIN" generate --checkpoint $CK --prompt "The" --tokens 4 --tokenizer sp/tokenizer.model > /dev/null 2>&1 ||
  fail "--tokenizer FILE"
echo "generate_test: SentencePiece and byte runs generate text, greedy equals no-cache, bad inputs refused"
