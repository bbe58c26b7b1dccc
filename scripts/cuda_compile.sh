#!/usr/bin/env bash
# The CUDA compiler launcher (CMakeLists.txt: CMAKE_CUDA_COMPILER_LAUNCHER):
#
#   cuda_compile.sh [ccache] NVCC ARGS...
#
# Runs the compile as given (through ccache when CMake found it, which
# replays nvcc's output on a hit) and keeps ptxas's resource report of the
# object, which the module's flags ask for (-Xptxas=-v), beside it as
# OBJECT.ptxas with the rest of what nvcc printed (its warnings count there):
# scripts/kernel_budgets.py --from-build checks the kernels the build made
# from it instead of compiling them a second time. The report's lines are not
# echoed; everything else nvcc prints (warnings, errors) is.
set -uo pipefail
obj=""
args=("$@")
for ((i = 0; i + 1 < ${#args[@]}; i++)); do
  [[ ${args[i]} == -o ]] && obj=${args[i + 1]}
done
log=$(mktemp)
trap 'rm -f "$log"' EXIT
[[ -n $obj ]] && rm -f "$obj.ptxas"
"$@" 2> "$log"
rc=$?
# ptxas -v: "ptxas info : ..." lines, and the stack/spill line under each
# "Function properties for" line.
report='^ptxas info|^ +[0-9]+ bytes stack frame'
if [[ -n $obj && $rc -eq 0 ]] && grep -qE "$report" "$log"; then
  cp "$log" "$obj.ptxas"
fi
grep -vE "$report" "$log" >&2
exit $rc
