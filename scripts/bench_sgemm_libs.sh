#!/usr/bin/env bash
# fp32 sgemm at the trainer's linear shapes with OpenBLAS (what the trainer
# links), BLIS and oneDNN, each in two settings, and one markdown table of
# GFLOP/s (bench/sgemm_libs.cpp says what is timed and how):
#
#   scripts/bench_sgemm_libs.sh [BUILD]        (default BUILD: build)
#
#   (a) the CPU's best kernels. OpenBLAS: OPENBLAS_CORETYPE=SkylakeX where the
#       CPU has AVX-512 F/BW/DQ/VL (Debian's OpenBLAS 0.3.21 picks Prescott on
#       a CPU whose model name is masked), Haswell where it has AVX2 only.
#       BLIS: BLIS_ARCH_TYPE=<skx> on the same AVX-512 condition: BLIS 0.9
#       counts the AVX-512 FMA units from the model name and, when it cannot
#       tell (a masked "Intel(R) Xeon(R) Processor"), falls back to haswell;
#       where it picks skx itself the setting changes nothing. oneDNN: its own
#       default.
#   (b) AVX2 only. OPENBLAS_CORETYPE=Haswell, BLIS_ARCH_TYPE=<haswell>,
#       ONEDNN_MAX_CPU_ISA=AVX2.
#   BLIS 0.9 reads BLIS_ARCH_TYPE as a NUMBER (its arch_t enum; a name such as
#   "haswell" reads as 0, which is skx): the number is asked of sgemm_blis
#   (--arch-id), which has it from blis.h.
#
# Every run prints the kernels it got (the KERNEL line); a setting that did
# not take (other kernels, other thread count, a serial build) stops the
# script. A wrong result (bench/sgemm_libs.cpp's check) stops it too.
#
# Environment:
#   SGEMM_QUICK=1      short timing (--quick): checks that everything works, in
#                      about a minute; not for numbers
#   SGEMM_THREADS=T    threads for every library (default: all cores, nproc)
#   SGEMM_ARGS="..."   more arguments for the programs (--models quickstart,
#                      --min-time 1 --batches 7, ...)
#   SGEMM_NO_APT=1     do not install libblis-dev / libdnnl-dev
#
# Libraries: apt-get installs libblis-dev, libblis-openmp-dev (BLIS's OpenMP
# build, so it runs on the same libgomp and honours the thread count) and
# libdnnl-dev when one is missing. Builds sgemm_openblas, sgemm_blis and
# sgemm_onednn (with scripts/build.sh for build/, plain cmake for another
# BUILD). Raw output: BUILD/sgemm_libs/{a,b}-<lib>.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
THREADS=${SGEMM_THREADS:-$(nproc)}
LIBS=(openblas blis onednn)

die() {
  echo "bench_sgemm_libs.sh: ERROR: $*" >&2
  exit 1
}

# --- libraries --------------------------------------------------------------
pkgs=(libblis-dev libblis-openmp-dev libdnnl-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  [ -z "${SGEMM_NO_APT:-}" ] || die "missing ${missing[*]} and SGEMM_NO_APT is set"
  sudo=()
  if [ "$(id -u)" != 0 ]; then
    command -v sudo > /dev/null || die "missing ${missing[*]}; run as root or install them"
    sudo=(sudo)
  fi
  echo "installing ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" > /dev/null
fi

# --- build ------------------------------------------------------------------
targets=()
for l in "${LIBS[@]}"; do targets+=(--target "sgemm_$l"); done
if [ "$BUILD" = build ]; then
  bash scripts/build.sh "${targets[@]}"
else
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release > "$BUILD.configure.log" 2>&1 \
    || { cat "$BUILD.configure.log"; die "configure of $BUILD failed"; }
  cmake --build "$BUILD" -j"$(nproc)" "${targets[@]}"
fi
for l in "${LIBS[@]}"; do
  [ -x "$BUILD/bench/sgemm_$l" ] || die "$BUILD/bench/sgemm_$l was not built (see the configure's 'trainer: BLIS/oneDNN' lines)"
done

# --- settings ---------------------------------------------------------------
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2-) "
has() { [[ $flags == *" $1 "* ]]; }
cpu=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
avx512=0
has avx512f && has avx512bw && has avx512dq && has avx512vl && avx512=1
if ! has avx2 || ! has fma; then die "this CPU has no AVX2+FMA: neither setting applies"; fi
blis_id() { "$BUILD/bench/sgemm_blis" --arch-id "$1"; }
SKX=$(blis_id skx)
HASWELL=$(blis_id haswell)

# One run's environment and the kernels it must print (lib setting).
# Sets: env_vars (array), want (exact kernel name, or a pattern for oneDNN (a)).
setting_env() {
  local lib=$1 setting=$2
  env_vars=()
  case $lib/$setting in
    openblas/a)
      if ((avx512)); then env_vars=(OPENBLAS_CORETYPE=SkylakeX); want=SkylakeX
      else env_vars=(OPENBLAS_CORETYPE=Haswell); want=Haswell; fi ;;
    blis/a)
      if ((avx512)); then env_vars=(BLIS_ARCH_TYPE="$SKX"); want=skx
      else env_vars=(BLIS_ARCH_TYPE="$HASWELL"); want=haswell; fi ;;
    onednn/a)
      # Its own choice; on an AVX-512 CPU that must be an AVX-512 ISA.
      if ((avx512)); then want='cpu_isa_avx512_core*'; else want='cpu_isa_avx2*'; fi ;;
    openblas/b) env_vars=(OPENBLAS_CORETYPE=Haswell); want=Haswell ;;
    blis/b) env_vars=(BLIS_ARCH_TYPE="$HASWELL"); want=haswell ;;
    onednn/b) env_vars=(ONEDNN_MAX_CPU_ISA=AVX2); want=cpu_isa_avx2 ;;
  esac
}

# A clean environment for each run: none of the libraries' own knobs leak in
# from the caller; OMP_NUM_THREADS as the programs set it (they also set their
# library's count explicitly).
run_env() {
  env -u OPENBLAS_CORETYPE -u OPENBLAS_NUM_THREADS -u GOTO_NUM_THREADS -u OPENBLAS_VERBOSE \
    -u BLIS_ARCH_TYPE -u BLIS_NUM_THREADS -u BLIS_JC_NT -u BLIS_IC_NT -u BLIS_JR_NT -u BLIS_IR_NT \
    -u ONEDNN_MAX_CPU_ISA -u DNNL_MAX_CPU_ISA -u ONEDNN_CPU_ISA_HINTS -u DNNL_CPU_ISA_HINTS \
    OMP_NUM_THREADS="$THREADS" "$@"
}

# Checks a KERNEL line: kernel name, thread count, a threaded build.
check_kernel() {
  local file=$1 lib=$2 setting=$3 line kernel threads threading
  line=$(grep -m1 $'^KERNEL\t' "$file") || die "$lib ($setting): no KERNEL line in $file"
  IFS=$'\t' read -r _ _ kernel threads threading _ <<< "$line"
  # shellcheck disable=SC2053  # $want may be a pattern
  [[ $kernel == $want ]] || die "$lib setting ($setting): kernels '$kernel', wanted '$want': the setting did not take ($line)"
  [ "$threads" = "$THREADS" ] || die "$lib setting ($setting): $threads threads, wanted $THREADS ($line)"
  [ "$threading" != serial ] || die "$lib setting ($setting): a serial build ($line)"
}

args=(--threads "$THREADS")
[ -z "${SGEMM_QUICK:-}" ] || args+=(--quick)
# shellcheck disable=SC2206  # word splitting wanted
[ -z "${SGEMM_ARGS:-}" ] || args+=($SGEMM_ARGS)

out=$BUILD/sgemm_libs
mkdir -p "$out"
rm -f "$out"/*.txt

# The Debian package of the libblis.so.4 that sgemm_blis loads.
blis_package() {
  local so
  so=$(ldd "$BUILD/bench/sgemm_blis" | awk '$1 ~ /^libblis/ { print $3; exit }')
  [ -n "$so" ] && dpkg -S "$so" 2> /dev/null | cut -d: -f1 | head -1 || echo "$so"
}

# What each library picks with no override, for the header.
defaults=()
for l in "${LIBS[@]}"; do
  line=$(run_env "$BUILD/bench/sgemm_$l" --info | grep -m1 $'^KERNEL\t')
  IFS=$'\t' read -r _ _ kernel _ threading version _ <<< "$line"
  defaults+=("$l=$kernel")
  case $l in
    openblas) v_openblas="${version#OpenBLAS }"; v_openblas="${v_openblas%% *} ($threading build)" ;;
    blis) v_blis="$version ($threading build, $(blis_package))" ;;
    onednn) v_onednn="$version ($threading runtime)" ;;
  esac
done

for setting in a b; do
  for l in "${LIBS[@]}"; do
    setting_env "$l" "$setting"
    f=$out/$setting-$l.txt
    echo "== ($setting) sgemm_$l ${env_vars[*]:-(library default)} ${args[*]}"
    rc=0
    run_env "${env_vars[@]}" "$BUILD/bench/sgemm_$l" "${args[@]}" > "$f" || rc=$?
    ((rc == 0)) || die "sgemm_$l in setting ($setting) failed with status $rc (3: a wrong result); output in $f"
    grep -m1 $'^KERNEL\t' "$f"
    check_kernel "$f" "$l" "$setting"
  done
done

# --- the table --------------------------------------------------------------
kern() { grep -m1 $'^KERNEL\t' "$out/$1-$2.txt" | cut -f3 | sed 's/^cpu_isa_//'; }
echo
echo "## fp32 sgemm, GFLOP/s ($(date -u '+%Y-%m-%d %H:%M UTC'))"
echo
echo "CPU: $cpu ($(nproc) cores, AVX-512 F/BW/DQ/VL: $( ((avx512)) && echo yes || echo no)); threads: $THREADS per library;" \
  "OpenBLAS $v_openblas, BLIS $v_blis, oneDNN $v_onednn;" \
  "defaults without overrides: ${defaults[*]}; timing: ${args[*]}; median batch."
echo
awk -F'\t' -v k1="$(kern a openblas)" -v k2="$(kern a blis)" -v k3="$(kern a onednn)" \
  -v k4="$(kern b openblas)" -v k5="$(kern b blis)" -v k6="$(kern b onednn)" '
  FNR == 1 { name = FILENAME; sub(/.*\//, "", name); sub(/\.txt$/, "", name) }
  $1 == "TOTAL" {
    key = $3 SUBSEP $4
    if (!(key in seen)) { seen[key] = 1; order[++n] = key }
    g[key, name] = $7
  }
  function cell(key, col,    v, best, c) {
    v = g[key, col]
    if (v == "") return "n/a"
    # The best of its setting in bold.
    best = 1
    for (c = 1; c <= 3; c++) if (g[key, substr(col, 1, 2) lib[c]] + 0 > v + 0) best = 0
    return best ? sprintf("**%.1f**", v) : sprintf("%.1f", v)
  }
  END {
    lib[1] = "openblas"; lib[2] = "blis"; lib[3] = "onednn"
    printf "| model | product | (a) OpenBLAS %s | (a) BLIS %s | (a) oneDNN %s | (b) OpenBLAS %s | (b) BLIS %s | (b) oneDNN %s |\n", k1, k2, k3, k4, k5, k6
    print "|---|---|---:|---:|---:|---:|---:|---:|"
    for (i = 1; i <= n; i++) {
      split(order[i], kp, SUBSEP)
      prod = kp[2] == "all" ? "**all (weighted)**" : kp[2]
      printf "| %s | %s", kp[1], prod
      for (s = 1; s <= 2; s++)
        for (c = 1; c <= 3; c++)
          printf " | %s", cell(order[i], (s == 1 ? "a-" : "b-") lib[c])
      print " |"
    }
  }' "$out"/a-openblas.txt "$out"/a-blis.txt "$out"/a-onednn.txt \
     "$out"/b-openblas.txt "$out"/b-blis.txt "$out"/b-onednn.txt
echo
echo "Rows: a model's linears as one step runs them (a block's linears x the layers, lm_head once), sum of flops / sum of median times;" \
  "'all' = forward + dX + dW, the number that decides. Per-shape numbers: $out/{a,b}-<lib>.txt (RESULT lines)."
