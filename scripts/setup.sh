#!/usr/bin/env bash
# Installs the Debian packages (and the optional PyPI venvs) a purpose needs:
#
#   scripts/setup.sh run    what building `trainer` and the quickstart need
#                           (scripts/quickstart.sh): compiler, CMake, the
#                           libraries it links, ccache, the fortunes text
#   scripts/setup.sh test   all of `run`, and what the test suite adds
#                           (scripts/test.sh): Catch2, PyTorch, Open MPI,
#                           Slurm, clang and libFuzzer, the venvs; the default
#   scripts/setup.sh PURPOSE PACKAGE...   those packages as well
#
# Safe to re-run: it only calls apt-get when something is missing.
set -euo pipefail
what=${1:-test}
(($#)) && shift
RUN_PACKAGES=(
  build-essential cmake pkg-config
  ccache   # every build goes through it when present (CMakeLists.txt): rebuilds and the sanitizer builds reuse objects
  libyaml-cpp-dev libcli11-dev nlohmann-json3-dev
  libopenblas-dev libgloo-dev
  libopenblas0-openmp   # OpenBLAS on the OpenMP threads (CMakeLists.txt: one thread pool)
  python3   # scripts/prepare_text.py (standard library only for byte tokens)
  libsentencepiece-dev   # SentencePiece tokenizers in the binary
  fortunes   # ~2.5 MB of English text: the quickstart's training data
)
TEST_PACKAGES=(
  catch2   # the C++ tests (tests/CMakeLists.txt)
  libopenmpi-dev openmpi-bin   # mpirun launches (tests/multinode_test.sh)
  python3-torch python3-numpy python3-yaml python3-matplotlib   # the PyTorch reference, plots
  python3-venv   # .venv-tensorboard and .venv-hf below
  python3-sentencepiece   # scripts/prepare_text.py --tokenizer sentencepiece, tokenizer tests
  python3-zstandard   # scripts/prepare_corpus.py: .zst JSON lines (tests/prepare_corpus_test.py)
  slurm-wlm munge   # tests/slurm_srun.sh: a throwaway one-node Slurm cluster (scripts/slurm_local.sh)
  iproute2 util-linux   # tests/multinode_test.sh: ip netns, tc and unshare (scripts/netns_cluster.sh)
  clang-14 libclang-rt-14-dev   # scripts/fuzz_ci.sh: libFuzzer with ASan and UBSan (tests/fuzz)
)
case $what in
  run) PACKAGES=("${RUN_PACKAGES[@]}" "$@") ;;
  test) PACKAGES=("${RUN_PACKAGES[@]}" "${TEST_PACKAGES[@]}" "$@") ;;
  *) echo "setup: unknown purpose '$what' (run or test)" >&2; exit 2 ;;
esac
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
else
  echo "setup: all Debian packages for '$what' present"
fi
[ "$what" = test ] || exit 0

# Optional Python packages from PyPI (Debian does not package them), each in
# a venv beside the checkout that also sees Debian's packages (PyTorch):
#   optional_venv NAME IMPORTS WHAT-IS-SKIPPED TIMEOUT PIP-SPEC...
# Failing to get one only skips the tests that need it, which say so.
root="$(cd "$(dirname "$0")/.." && pwd)"
optional_venv() {
  local name=$1 imports=$2 skipped=$3 limit=$4
  local venv="$root/$name"
  shift 4
  if "$venv/bin/python" -c "import $imports" 2>/dev/null; then
    echo "setup: $imports present in $name"
  elif /usr/bin/python3 -m venv --system-site-packages "$venv" &&
       timeout "$limit" "$venv/bin/pip" install -q --disable-pip-version-check "$@"; then
    echo "setup: installed $* into $name"
  else
    echo "setup: could not install $* from PyPI: $skipped will be skipped"
  fi
}

# TensorBoard's own reader for tests/tensorboard_reader_test.py;
# tests/test_tensorboard.cpp reads the event files with its own reader regardless.
optional_venv .venv-tensorboard tensorboard tests/tensorboard_reader_test.py 300 tensorboard

# Hugging Face transformers for tests/hf/hf_interop_test.py and hf_features_test.py (the exported
# directories loaded by the real client). 4.40 is the newest line that still
# runs on Debian's torch 1.13 (later ones need torch 2). It brings the
# `tokenizers` package too, for tests/hf_tokenizer_test.sh and
# prepare_text.py --tokenizer-json. pyarrow and datasets: scripts/prepare_corpus.py reads
# Parquet and save_to_disk folders (tests/prepare_corpus_test.py writes them with datasets);
# pandas < 2.3 keeps Debian's numpy 1.24 (which torch 1.13 is built against) the one the venv sees.
# megatron-core (no dependencies of its own): Megatron's IndexedDataset reads what prepare_corpus writes.
# jinja2: transformers renders chat templates with it (prepare_corpus.py --chat, docs/FINE_TUNE.md) but
# does not require it, and Debian's python3-jinja2 comes only as a recommendation of other packages.
optional_venv .venv-hf "transformers, safetensors, pyarrow, datasets, megatron.core.datasets.indexed_dataset, jinja2" \
  "tests/hf/hf_*_test.py, tests/hf_tokenizer_test.sh and tests/prepare_corpus_test.py" 600 \
  "transformers==4.40.2" "safetensors>=0.4,<0.5" "pyarrow<17" "datasets==2.19.1" "pandas<2.3" "megatron-core==0.8.0" \
  "jinja2>=3.0"
