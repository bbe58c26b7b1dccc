#!/usr/bin/env bash
# The PTX probe on the emulated device (ctest ptx_probe_emu): its output agrees
# with the ISA as read on the host, `--expect` of its own output passes, and
# copies of that output changed past each probe's rule make --expect fail
# naming the probe, while changes inside the rule (a few ulp of ex2, the last
# bit of a random mma sum) pass: the comparison gpu-check.sh relies on when the
# emulator's output meets a real GPU's.
#   bash tests/ptx_probe_test.sh BUILD/ptx_probe_emu WORK_DIR
set -uo pipefail
PROBE=$1
W=$2
rm -rf "$W"
mkdir -p "$W"
fail=0
say() { echo "$1"; [[ $1 == ok* ]] || fail=1; }

"$PROBE" > "$W/out.txt" 2> "$W/ref.txt"
rc=$?
cat "$W/ref.txt"
((rc == 0)) && say "ok      the probe runs and exits 0" || say "FAILED  the probe exited $rc"
n_ok=$(grep -c '^reference .*: ok ' "$W/ref.txt")
n_probes=$(grep -c '^# [a-z0-9_]*: ' "$W/out.txt")
if ((n_ok == n_probes && n_probes >= 19)) && ! grep -q WRONG "$W/ref.txt"; then
  say "ok      all $n_probes reference checks pass"
else
  say "FAILED  $n_ok of $n_probes reference checks pass"
fi

# expect FILE WANT_RC LABEL [REGEX...]: --expect FILE exits WANT_RC and its
# report matches every REGEX.
expect() {
  local file=$1 want=$2 label=$3 rc re
  shift 3
  "$PROBE" --expect "$file" > /dev/null 2> "$W/report.txt"
  rc=$?
  if ((rc != want)); then
    say "FAILED  $label: exit $rc, expected $want"
    grep -v '^reference' "$W/report.txt" | sed 's/^/    /'
    return
  fi
  for re in "$@"; do
    grep -qE "$re" "$W/report.txt" && continue
    say "FAILED  $label: no line matches /$re/"
    sed 's/^/    /' "$W/report.txt"
    return
  done
  say "ok      $label"
}

# perturb OUT EDIT...: a copy of out.txt with lines changed; EDIT is
# PROBE:INDEX:OP:N, OP xor (flip bits N), add (N to the bits), or del.
perturb() {
  local out=$1
  shift
  python3 - "$W/out.txt" "$out" "$@" <<'PY'
import sys
src, dst, edits = sys.argv[1], sys.argv[2], [e.split(":") for e in sys.argv[3:]]
lines, done = [], set()
for line in open(src):
    f = line.split()
    for probe, index, op, n in edits:
        if len(f) == 3 and f[0] == probe and f[1] == index:
            v = int(f[2], 16)
            v = (v ^ int(n, 0) if op == "xor" else v + int(n)) & 0xFFFFFFFF
            line = None if op == "del" else f"{probe} {index} {v:08x}\n"
            done.add((probe, index))
    if line is not None:
        lines.append(line)
if len(done) != len(edits):
    sys.exit(f"perturb: not every edit found a line: {edits}")
open(dst, "w").writelines(lines)
PY
}

expect "$W/out.txt" 0 "--expect of its own output passes" '^probe ex2_approx_ftz: 4131 values, max difference 0 ulp' \
  '^ptx_probe --expect .*: ok, all 19 probes agree'

# One bit of an exact probe, and 6 ulp of one ex2 value (the bound is 4).
perturb "$W/bad.txt" ldmatrix_x4_trans:5:xor:0x100 ex2_approx_ftz:2000:add:6 || fail=1
expect "$W/bad.txt" 1 "a flipped bit and 6 ulp of ex2 fail, naming both probes" \
  '^probe ldmatrix_x4_trans: 128 values, max difference 1 bits .*: MISMATCH' \
  '^  index 5: ' \
  '^probe ex2_approx_ftz: 4131 values, max difference 6 ulp .*: MISMATCH' \
  '^  index 2000: .*2\^\(' \
  '^probe ldmatrix_x4: .*: ok' \
  'MISMATCH in 2 probe\(s\): ldmatrix_x4_trans ex2_approx_ftz'

# Inside the rules: 3 ulp of ex2, the last bit of a random mma sum.
perturb "$W/near.txt" ex2_approx_ftz:100:add:3 mma_f16_rand:7:xor:1 || fail=1
expect "$W/near.txt" 0 "3 ulp of ex2 and an mma sum's last bit pass" \
  '^probe ex2_approx_ftz: .*max difference 3 ulp.*: ok' '^probe mma_f16_rand: .*: ok'

# A special input has one right answer: 2^-inf (index 4099) off by 1 ulp fails.
perturb "$W/special.txt" ex2_approx_ftz:4099:add:1 || fail=1
expect "$W/special.txt" 1 "ex2 of a special input must be exact" '^probe ex2_approx_ftz: .*: MISMATCH'

# A value present on one side only, and a probe this program does not know.
perturb "$W/short.txt" shfl_idx:64:del:0 || fail=1
echo "no_such_probe 0 00000000" >> "$W/short.txt"
expect "$W/short.txt" 1 "a missing value and an unknown probe fail" \
  '^probe shfl_idx: .*: MISMATCH' '^  index 64: .* vs \(none\)' \
  '^probe no_such_probe: not a probe of this program' 'MISMATCH in 2 probe\(s\): shfl_idx no_such_probe'

# A line that is not a value is an error of the file, not a mismatch.
{ cat "$W/out.txt"; echo "mma_bf16_int 0 xyz"; } > "$W/garbage.txt"
expect "$W/garbage.txt" 2 "an unreadable line stops --expect (exit 2)" \
  "garbage.txt:[0-9]+: not '<probe> <index> <hex bits>'"

if ((fail)); then echo "ptx_probe_test: FAILED"; exit 1; fi
echo "ptx_probe_test: passed"
