#!/usr/bin/env bash
# Sets up, builds, prepares English text (the quotations of Debian's
# `fortunes` package, installed by setup.sh) and trains configs/quickstart.yaml,
# which ends by printing text the model generates. Byte-level tokens by
# default; QUICKSTART_TOKENIZER=sentencepiece trains a 1024-piece SentencePiece
# model on the same text first and uses it (about a quarter slower per step,
# twice the text per token). Arguments go to the trainer (--set key=value).
set -euo pipefail
cd "$(dirname "$0")/.."
# Only what the run needs: the packages of `setup.sh run` and the `trainer`
# target (with the CUDA module where nvcc is found), not the test suite's.
t0=$SECONDS
sp=()
[ "${QUICKSTART_TOKENIZER:-bytes}" = sentencepiece ] && sp=(python3-sentencepiece)  # prepare_text.py trains the model
bash scripts/setup.sh run "${sp[@]}"
t_setup=$((SECONDS - t0))
t0=$SECONDS
bash scripts/build.sh --target trainer
t_build=$((SECONDS - t0))
t0=$SECONDS
mapfile -t texts < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' ! -name '*art*' | sort)
extra=()
if [ "${QUICKSTART_TOKENIZER:-bytes}" = sentencepiece ]; then
  [ -f data/fortunes-sp/train.bin ] ||
    /usr/bin/python3 scripts/prepare_text.py --out-dir data/fortunes-sp --tokenizer sentencepiece --vocab-size 1024 "${texts[@]}"
  extra=(--set model.vocab_size=1024 --set "data.train=[data/fortunes-sp/train.bin]"
         --set "data.valid=[data/fortunes-sp/valid.bin]" --set run.name=quickstart-sp)
elif [ ! -f data/fortunes/train.bin ]; then
  python3 scripts/prepare_text.py --out-dir data/fortunes "${texts[@]}"
fi
t_data=$((SECONDS - t0))
t0=$SECONDS
build/trainer --config configs/quickstart.yaml "${extra[@]}" "$@"
t_train=$((SECONDS - t0))
run=runs/quickstart
[ "${QUICKSTART_TOKENIZER:-bytes}" = sentencepiece ] && run=runs/quickstart-sp
echo
echo "quickstart: set-up ${t_setup} s, build ${t_build} s, data ${t_data} s, training ${t_train} s"
echo "more text from the trained model: build/trainer generate --checkpoint $run/ckpt --prompt \"The \""
