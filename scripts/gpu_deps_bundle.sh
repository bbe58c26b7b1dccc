#!/usr/bin/env bash
# Builds gpu_deps/: the Debian-packaged headers, libraries and CMake package
# files that the lent GPU machine lacks (it has nvcc, CMake, ninja and PyTorch
# but no Debian packages and no network). The folder travels to that machine
# as a carried path; scripts/gpu-check.sh points CMake and the loader at it.
#
#   bash scripts/gpu_deps_bundle.sh          # build gpu_deps/, OpenBLAS xz-compressed
#                                            # (~10 MB; gpu-check.sh unpacks it there)
#   bash scripts/gpu_deps_bundle.sh --no-xz  # same, uncompressed (~42 MB; not for carrying)
#   bash scripts/gpu_deps_bundle.sh --test   # also configure + build build-bundle/
#                                            # with only the bundle as hints
#
# It also stores the emulated device's PTX probe output (build/ptx_probe_emu,
# built first; PTX_PROBE_BUILD=DIR for another build) as gpu_deps/ptx_probe_emu.txt.
#
# Layout mirrors /usr so each package's own CMake files find their prefix by
# walking up from themselves; the few absolute /usr paths in them are rewritten.
set -euo pipefail
cd "$(dirname "$0")/.."

XZ=1
TEST=0
for a in "$@"; do
  case "$a" in
    --xz) XZ=1 ;;
    --no-xz) XZ=0 ;;
    --test) TEST=1 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "gpu_deps_bundle: unknown argument '$a'" >&2; exit 2 ;;
  esac
done

# (setup.sh installs the -dev packages this copies from; need() names a missing one.)

MULTI=x86_64-linux-gnu
D=gpu_deps
rm -rf "$D"
mkdir -p "$D/include/openblas" "$D/lib/$MULTI/cmake/yaml-cpp" "$D/lib/cmake/Catch2" \
         "$D/share/cmake/CLI11" "$D/share/cmake/Gloo" "$D/share/cmake/nlohmann_json"

need() { [ -e "$1" ] || { echo "gpu_deps_bundle: missing $1 (is its -dev package installed?)" >&2; exit 1; }; }
# Copies the file a (possibly symlinked) library path resolves to, under the
# name the loader asks for: links do not survive every transfer.
lib_as() {  # lib_as SRC DEST_NAME
  need "$1"
  cp -L "$1" "$D/lib/$2"
}

# --- headers -----------------------------------------------------------------
for h in yaml-cpp CLI catch2 gloo nlohmann; do need "/usr/include/$h"; cp -r "/usr/include/$h" "$D/include/"; done
for h in cblas.h f77blas.h openblas_config.h; do
  need "/usr/include/$MULTI/openblas-pthread/$h"
  cp "/usr/include/$MULTI/openblas-pthread/$h" "$D/include/openblas/"
done

# --- shared libraries (by soname) ----------------------------------------------
# OpenBLAS needs libgfortran and libquadmath at run time; the GPU image has
# neither. libgcc_s, libstdc++, libm and libc are on every Linux with gcc.
lib_as "/usr/lib/$MULTI/libopenblas.so.0" libopenblas.so.0
lib_as "/lib/$MULTI/libgfortran.so.5" libgfortran.so.5
lib_as "/lib/$MULTI/libquadmath.so.0" libquadmath.so.0
lib_as "/usr/lib/$MULTI/libyaml-cpp.so.0.7" libyaml-cpp.so.0.7
# Gloo: the CPU collectives of comm/ (find_package(Gloo) in CMakeLists.txt),
# with the libraries it loads (hiredis, ibverbs, netlink).
lib_as /usr/lib/libgloo.so.0 libgloo.so.0
for l in libhiredis.so.0.14 libibverbs.so.1 libnl-route-3.so.200 libnl-3.so.200; do
  lib_as "/lib/$MULTI/$l" "$l"
done
# Catch2's exported targets check that this archive exists, though the tests
# bring their own main; debug sections are most of its size.
need /usr/lib/libCatch2WithMain.a
cp /usr/lib/libCatch2WithMain.a "$D/lib/"
strip --strip-debug "$D/lib/libCatch2WithMain.a"

# --- CMake package files, made relocatable ---------------------------------------
# Each file computes its prefix from its own location, except for a "/usr
# move" check against its original absolute path (harmless, but neutralised
# so nothing in the bundle points into /usr) and the library locations below.
cp /usr/lib/$MULTI/cmake/yaml-cpp/*.cmake "$D/lib/$MULTI/cmake/yaml-cpp/"
cp /usr/lib/cmake/Catch2/*.cmake "$D/lib/cmake/Catch2/"
cp /usr/share/cmake/CLI11/*.cmake "$D/share/cmake/CLI11/"
cp /usr/share/cmake/Gloo/*.cmake "$D/share/cmake/Gloo/"
# nlohmann/json is header-only; its targets already find the prefix three
# levels above themselves (share/cmake/nlohmann_json -> gpu_deps).
need /usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake
cp /usr/share/cmake/nlohmann_json/*.cmake "$D/share/cmake/nlohmann_json/"
# yaml-cpp: the bundle keeps one copy of the library under its soname, in lib/.
sed -i -e 's|${_IMPORT_PREFIX}/lib/'"$MULTI"'/libyaml-cpp.so.0.7.0|${_IMPORT_PREFIX}/lib/libyaml-cpp.so.0.7|g' \
  "$D/lib/$MULTI/cmake/yaml-cpp/yaml-cpp-targets-none.cmake"
# Gloo's targets name /usr/lib/libgloo.so.0.5.0 literally.
sed -i -e 's|"/usr/lib/libgloo.so.0.5.0"|"${_IMPORT_PREFIX}/lib/libgloo.so.0"|g' \
  "$D/share/cmake/Gloo/GlooTargets-relwithdebinfo.cmake"
# The "/usr move" checks: compare against a path that cannot exist.
sed -i -E 's|"/usr/lib/('"$MULTI"'/)?cmake/([A-Za-z0-9+-]+)"|"/nonexistent/gpu_deps/\2"|g' \
  "$D"/lib/$MULTI/cmake/yaml-cpp/*.cmake "$D"/lib/cmake/Catch2/*.cmake
sed -i -e 's|set(PACKAGE_PREFIX_DIR "/usr")|set(PACKAGE_PREFIX_DIR "${PACKAGE_PREFIX_DIR}")|' \
  "$D/lib/cmake/Catch2/Catch2Config.cmake"

# Nothing in a CMake file may still name /usr: it would silently use (or,
# on the GPU machine, miss) the system copy.
if grep -rn '/usr/' "$D"/lib/$MULTI/cmake "$D"/lib/cmake "$D"/share/cmake | grep -v ':[0-9]*:#'; then
  echo "gpu_deps_bundle: absolute /usr paths left in the CMake files above" >&2
  exit 1
fi
# Gloo's targets may name its dependencies by absolute path too.
if grep -n 'INTERFACE_LINK_LIBRARIES' "$D/share/cmake/Gloo/GlooTargets.cmake" | grep -q '/usr'; then
  echo "gpu_deps_bundle: Gloo's targets link absolute /usr libraries" >&2
  exit 1
fi

if ((XZ)); then
  # OpenBLAS is 35 MB of kernels for every x86 generation; xz makes it ~4 MB.
  xz -T0 -6 "$D/lib/libopenblas.so.0"
fi

# --- the emulator's PTX probe output ----------------------------------------------
# What the emulated device computes for every hand-written PTX instruction and
# warp builtin (tests/ptx_probe/): gpu-check.sh runs `ptx_probe --expect` on it,
# so the GPU machine never builds the emulator. Built first in $PTX_PROBE_BUILD
# (default build/, when configured) so that the output is this checkout's.
# Without it gpu-check records its probe phase as not run; the bundle is still
# made.
PROBE_BUILD=${PTX_PROBE_BUILD:-build}
PROBE=$PROBE_BUILD/ptx_probe_emu
probe_note=""
if [ -f "$PROBE_BUILD/CMakeCache.txt" ] &&
   ! cmake --build "$PROBE_BUILD" --target ptx_probe_emu > "$D/probe-build.log" 2>&1; then
  probe_note="cmake --build $PROBE_BUILD --target ptx_probe_emu failed: $(grep -m1 -iE 'error' "$D/probe-build.log" || true)"
fi
rm -f "$D/probe-build.log"
if [ -z "$probe_note" ] && [ -x "$PROBE" ]; then
  dirty=""
  git diff --quiet HEAD -- 2>/dev/null || dirty=" + uncommitted changes"
  probe_rc=0
  "$PROBE" > "$D/ptx_probe_emu.body" 2> "$D/ptx_probe_emu.refs" || probe_rc=$?
  if ((probe_rc == 0 || probe_rc == 1)) && [ -s "$D/ptx_probe_emu.body" ]; then
    { echo "# source: $(git rev-parse HEAD 2>/dev/null || echo unknown)$dirty"
      echo "# made by scripts/gpu_deps_bundle.sh from $PROBE at $(date -u '+%Y-%m-%d %H:%M:%S UTC') (exit $probe_rc)"
      sed 's/^/# /' "$D/ptx_probe_emu.refs"
      cat "$D/ptx_probe_emu.body"; } > "$D/ptx_probe_emu.txt"
    echo "gpu_deps_bundle: $D/ptx_probe_emu.txt: $(grep -vc '^#' "$D/ptx_probe_emu.txt") values from $PROBE"
    # The emulator disagreeing with the ISA as the probe reads it is an
    # emulator bug; the GPU comparison is still worth having.
    ((probe_rc == 0)) || echo "gpu_deps_bundle: warning: $PROBE's reference checks failed: $(grep -m1 WRONG "$D/ptx_probe_emu.refs")" >&2
  else
    probe_note="$PROBE exited $probe_rc: $(tail -1 "$D/ptx_probe_emu.refs")"
  fi
  rm -f "$D/ptx_probe_emu.body" "$D/ptx_probe_emu.refs"
elif [ -z "$probe_note" ]; then
  probe_note="no $PROBE (configure $PROBE_BUILD with the CUDA toolkit, or set PTX_PROBE_BUILD)"
fi
[ -z "$probe_note" ] || echo "gpu_deps_bundle: warning: no $D/ptx_probe_emu.txt: $probe_note" >&2

# --- README ---------------------------------------------------------------------
{
  echo "gpu_deps: what the GPU machine lacks to configure and build this repository."
  echo "Made by scripts/gpu_deps_bundle.sh on $(date -u +%Y-%m-%d) from this Debian system:"
  for p in libyaml-cpp-dev libyaml-cpp0.7 libcli11-dev catch2 libopenblas0-pthread libopenblas-pthread-dev \
           libgfortran5 libquadmath0 libgloo-dev libgloo0 libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200 \
           nlohmann-json3-dev; do
    v=$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null || true)
    [ -n "$v" ] && echo "  $p $v"
  done
  echo
  echo "Use (scripts/gpu-check.sh does this):"
  echo "  cmake -S . -B build-gpu -DCMAKE_PREFIX_PATH=\$PWD/gpu_deps \\"
  echo "        -DBLAS_LIBRARIES=\$PWD/gpu_deps/lib/libopenblas.so.0 -DCBLAS_INCLUDE_DIR=\$PWD/gpu_deps/include/openblas"
  echo "  export LD_LIBRARY_PATH=\$PWD/gpu_deps/lib:\$LD_LIBRARY_PATH"
  if ((XZ)); then
    echo "  (first: xz -dk gpu_deps/lib/libopenblas.so.0.xz, or python3's lzma module where xz is missing)"
  fi
  echo
  echo "Contents:"
  (cd "$D" && find . -type f ! -name README | sort | sed 's|^\./|  |' | grep -v '^  include/[^o]' )
  echo "  include/{yaml-cpp,CLI,catch2,gloo,nlohmann}/  (headers, $(find "$D/include" -type f | wc -l) files)"
  echo
  echo "Size: $(du -sh "$D" | cut -f1)"
} > "$D/README"

# gpu_deps/ must stay out of git and is carried explicitly.
grep -qxF 'gpu_deps/' .gitignore || echo 'gpu_deps/' >> .gitignore

size_kb=$(du -sk "$D" | cut -f1)
echo "gpu_deps_bundle: $D is $((size_kb / 1024)) MiB"
if ((size_kb > 50 * 1024)); then
  echo "gpu_deps_bundle: larger than 50 MiB; the carried tree may not exceed 64 MiB" >&2
  exit 1
fi

((TEST)) || exit 0

# --- self-test: configure and build with only the bundle as hints ----------------
# The system packages are still visible here, so the test checks that CMake's
# cache took the bundle's copies. Only the prefix path is given (no *_DIR):
# that proves the mirrored layout is searchable; gpu-check.sh passes the
# *_DIR hints as well, in case CMake there does not search lib/<multiarch>.
if ((XZ)); then xz -dk "$D/lib/libopenblas.so.0.xz"; fi
B=build-bundle
rm -rf "$B"
mkdir -p "$B"
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S . -B "$B" "${GEN[@]}" -DTRAINER_CUDA=OFF -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$PWD/$D" \
  -DBLAS_LIBRARIES="$PWD/$D/lib/libopenblas.so.0" -DCBLAS_INCLUDE_DIR="$PWD/$D/include/openblas" \
  > "$B/configure.log" 2>&1 || { cat "$B/configure.log"; exit 1; }
fail=0
for key in yaml-cpp_DIR CLI11_DIR Catch2_DIR Gloo_DIR nlohmann_json_DIR BLAS_LIBRARIES CBLAS_INCLUDE_DIR; do
  line=$(grep -E "^$key:" "$B/CMakeCache.txt" || true)
  echo "  cache: $line"
  [[ "$line" == *"$PWD/$D"* ]] || { echo "gpu_deps_bundle: $key does not point into $D" >&2; fail=1; }
done
((fail)) && exit 1
cmake --build "$B" -j2 --target trainer
ldd "$B/trainer" | grep -E 'yaml-cpp|openblas' || true
LD_LIBRARY_PATH="$PWD/$D/lib" ldd "$B/trainer" | grep -E 'yaml-cpp|openblas|gfortran|quadmath' | tee "$B/ldd.txt"
if grep -E 'yaml-cpp|openblas|gfortran|quadmath' "$B/ldd.txt" | grep -qv "$PWD/$D/lib"; then
  echo "gpu_deps_bundle: the trainer loads a system copy instead of the bundle's" >&2
  exit 1
fi
LD_LIBRARY_PATH="$PWD/$D/lib" "$B/trainer" --config configs/tiny.yaml --print-config > /dev/null
echo "gpu_deps_bundle: self-test passed (configure, build, load, run with the bundle)"
