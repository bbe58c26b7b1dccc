#!/usr/bin/env bash
# Does a source change leave the kernels' device code alone? Compiles every
# kernels/cuda/*.cu to PTX for every architecture the build targets, once as
# of BEFORE_REF (default HEAD) and once from the working tree, and compares:
#
#   scripts/ptx_compare.sh [--strict] [BEFORE_REF]
#
# One line per file and architecture: identical, or DIFFERENT with the first
# lines of the diff. Exit 0 when all are identical, 1 when any differs, 2 when
# a compile fails.
#
# The flags are the module's (CMakeLists.txt, Release): -O3 -DNDEBUG, its
# definitions, the repository root as include root, --expt-relaxed-constexpr,
# -lineinfo, -std=c++20; host-only flags (-Xcompiler, -Xptxas) change no PTX.
#
# Two things in PTX follow where the source is rather than what it says:
# - nvcc names anonymous namespaces after the source file's path
#   (_GLOBAL__N__<hash>_..., _INTERNAL_<hash>_...), so both trees are
#   compiled from the same scratch directory, one after the other: the names
#   then match without rewriting them, and the .file paths are alike too;
# - -lineinfo's .loc / .file directives and .debug_str section hold line
#   numbers, which any edit above a kernel moves. They are left out of the
#   comparison and reported as "line info differs"; --strict compares them too.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
strict=0
before_ref=HEAD
for arg in "$@"; do
  case $arg in
    --strict) strict=1 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) before_ref=$arg ;;
  esac
done
git -C "$root" rev-parse --verify --quiet "$before_ref^{commit}" > /dev/null ||
  { echo "ptx_compare: no commit $before_ref" >&2; exit 2; }
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[[ -x $nvcc ]] || { echo "ptx_compare: nvcc not found (set NVCC)" >&2; exit 2; }
read -r -a archs <<< "$(sed -n 's/.*set(CMAKE_CUDA_ARCHITECTURES \([0-9 ]*\)).*/\1/p' "$root/CMakeLists.txt")"
((${#archs[@]})) || { echo "ptx_compare: no CMAKE_CUDA_ARCHITECTURES in CMakeLists.txt" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/ptx_compare.XXXXXX")
trap 'rm -rf "$work"' EXIT
src=$work/src  # both trees in turn, at this one path
flags=(-O3 -DNDEBUG -DTRAINER_HAVE_CUDA=1 -DTRAINER_HAVE_NCCL=1 -Dtrainer_cuda_EXPORTS -I"$src"
       --expt-relaxed-constexpr -lineinfo -std=c++20)

# The tree as of the commit: its tracked files.
stage_commit() {
  rm -rf "$src" && mkdir -p "$src"
  git -C "$root" archive "$before_ref" | tar -x -C "$src"
}

# The working tree: tracked and untracked files that git does not ignore,
# less those deleted and not yet committed.
stage_working_tree() {
  rm -rf "$src" && mkdir -p "$src"
  (cd "$root" && git ls-files -z --cached --others --exclude-standard |
     while IFS= read -r -d '' f; do [[ -e $f ]] && printf '%s\0' "$f"; done |
     tar --null -T - -cf -) | tar -x -C "$src"
}

# One file for one architecture -> OUT_DIR/<file>.<arch>.ptx.
compile_one() {
  local f=$1 arch=$2 out
  out=$3/$(basename "$f" .cu).$arch.ptx
  (cd "$src" && "$nvcc" "${flags[@]}" -arch="$arch" -ptx "$f" -o "$out") > "$out.log" 2>&1 ||
    { echo "ptx_compare: nvcc failed on $f for $arch ($4):" >&2; cat "$out.log" >&2; return 1; }
}

# Every .cu file of the staged tree, for every architecture, nproc at a time.
compile_side() {
  local side=$1 running=0 failed=0 f a
  mkdir -p "$work/$side"
  (cd "$src" && ls kernels/cuda/*.cu) > "$work/$side.files"
  while read -r f; do
    for a in "${archs[@]}"; do
      compile_one "$f" "sm_$a" "$work/$side" "$side" &
      running=$((running + 1))
      if ((running >= $(nproc))); then wait -n || failed=1; running=$((running - 1)); fi
    done
  done < "$work/$side.files"
  while ((running > 0)); do wait -n || failed=1; running=$((running - 1)); done
  return $failed
}

# -lineinfo's directives and the debug section they point into.
strip_line_info() {
  awk '/^[ \t]*\.(loc|file)[ \t]/ { next }
       /^[ \t]*\.section[ \t]+\.debug/ { skip = 1 }
       skip { if ($0 ~ /^[ \t]*}/) skip = 0; next }
       { print }' "$1"
}

# One line for a file and architecture; returns 1 when it differs.
compare_one() {
  local f=$1 arch=$2 name
  name=$(basename "$f" .cu).$arch.ptx
  local before=$work/before/$name after=$work/after/$name
  local label
  label=$(printf '%-40s %s' "$f" "$arch")
  if [[ ! -e $before || ! -e $after ]]; then
    echo "$label  DIFFERENT: only $([[ -e $before ]] && echo "at $before_ref" || echo "in the working tree")"
    return 1
  fi
  if cmp -s "$before" "$after"; then echo "$label  identical"; return 0; fi
  strip_line_info "$before" > "$before.code"
  strip_line_info "$after" > "$after.code"
  if cmp -s "$before.code" "$after.code"; then
    if ((strict)); then
      echo "$label  DIFFERENT (line info only)"
      diff "$before" "$after" | head -n 8 | sed 's/^/    /'
      return 1
    fi
    echo "$label  identical (line info differs)"
    return 0
  fi
  echo "$label  DIFFERENT"
  diff "$before.code" "$after.code" | head -n 12 | sed 's/^/    /'
  return 1
}

version=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
lines=$( ((strict)) && echo "line info compared" || echo "line info left out")
echo "ptx_compare: $before_ref vs the working tree, ${archs[*]/#/sm_}, nvcc $version, $lines"
stage_commit
compile_side before || exit 2
stage_working_tree
compile_side after || exit 2
status=0
for f in $(sort -u "$work/before.files" "$work/after.files"); do
  for a in "${archs[@]}"; do compare_one "$f" "sm_$a" || status=1; done
done
((status == 0)) && echo "ptx_compare: all identical" || echo "ptx_compare: DIFFERENCES"
exit $status
