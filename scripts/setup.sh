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

# Optional: the Hugging Face `tokenizers` package for tests/hf_tokenizer_test.sh
# and prepare_text.py --tokenizer-json (PyPI only). Without it that test is skipped.
venv="$(cd "$(dirname "$0")/.." && pwd)/.venv-tokenizers"
if "$venv/bin/python" -c "import tokenizers" 2>/dev/null; then
  echo "setup: tokenizers present in .venv-tokenizers"
elif /usr/bin/python3 -m venv --system-site-packages "$venv" &&
     timeout 300 "$venv/bin/pip" install -q --disable-pip-version-check tokenizers; then
  echo "setup: installed tokenizers into .venv-tokenizers"
else
  echo "setup: could not install tokenizers from PyPI: tests/hf_tokenizer_test.sh will be skipped"
fi
