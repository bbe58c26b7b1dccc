#!/usr/bin/env bash
# Installs every Debian package the build, the tests and the examples need.
# Safe to re-run: it only calls apt-get when something is missing.
set -euo pipefail
PACKAGES=(
  build-essential cmake pkg-config
  libyaml-cpp-dev libcli11-dev catch2 nlohmann-json3-dev
  libopenblas-dev libgloo-dev
  libopenmpi-dev openmpi-bin
  python3 python3-torch python3-numpy python3-yaml python3-matplotlib
  python3-venv   # .venv-tensorboard below
  python3-sentencepiece libsentencepiece-dev   # SentencePiece tokenizers: scripts/prepare_text.py and the binary
  fortunes   # ~2.5 MB of English text: the quickstart's training data
  slurm-wlm munge   # tests/slurm_srun.sh: a throwaway one-node Slurm cluster (scripts/slurm_local.sh)
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi

# Optional: TensorBoard's own reader for tests/tensorboard_reader_test.py,
# from PyPI into a venv beside the checkout (Debian does not package it).
# Failing to get it only skips that test; tests/test_tensorboard.cpp reads
# the event files with its own reader regardless.
venv="$(cd "$(dirname "$0")/.." && pwd)/.venv-tensorboard"
if "$venv/bin/python" -c "import tensorboard" 2>/dev/null; then
  echo "setup: tensorboard present in .venv-tensorboard"
elif /usr/bin/python3 -m venv --system-site-packages "$venv" &&
     timeout 300 "$venv/bin/pip" install -q --disable-pip-version-check tensorboard; then
  echo "setup: installed tensorboard into .venv-tensorboard"
else
  echo "setup: could not install tensorboard from PyPI: tests/tensorboard_reader_test.py will be skipped"
fi

# Optional: Hugging Face transformers for tests/hf/hf_interop_test.py (the
# exported directories loaded by the real client), from PyPI into a venv
# that sees Debian's PyTorch. 4.40 is the newest line that still runs on
# Debian's torch 1.13 (later ones need torch 2). Failing to get it only
# skips those tests, saying so. It brings the `tokenizers` package too, for
# tests/hf_tokenizer_test.sh and prepare_text.py --tokenizer-json.
hfvenv="$(cd "$(dirname "$0")/.." && pwd)/.venv-hf"
if "$hfvenv/bin/python" -c "import transformers, safetensors" 2>/dev/null; then
  echo "setup: transformers present in .venv-hf"
elif /usr/bin/python3 -m venv --system-site-packages "$hfvenv" &&
     timeout 600 "$hfvenv/bin/pip" install -q --disable-pip-version-check "transformers==4.40.2" "safetensors>=0.4,<0.5"; then
  echo "setup: installed transformers into .venv-hf"
else
  echo "setup: could not install transformers from PyPI: tests/hf/hf_interop_test.py will be skipped"
fi
