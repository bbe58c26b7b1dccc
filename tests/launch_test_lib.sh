# Sourced by the shell tests that launch real jobs (tests/multinode_test.sh,
# tests/multinode_slurm_test.sh, tests/slurm_srun.sh) with their arguments
# TRAINER SOURCE WORK, after setting `name` (their lines' prefix):
#   name=multinode; source "$(dirname "$0")/launch_test_lib.sh" "$@"
# Sets trainer (made absolute), source, work (emptied) and SKIP (77, which
# ctest reports as skipped); defines say and fail; and clears the variables
# of an enclosing launcher (ctest run inside a Slurm allocation, under
# torchrun or mpirun) and the test hooks, which would otherwise make the
# one-process reference think it is a rank of something.
trainer=$1 source=$2 work=$3
SKIP=77
say() { echo "$name: $*"; }
fail() { say "FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work"
trainer=$(cd "$(dirname "$trainer")" && pwd)/$(basename "$trainer")
while IFS= read -r var; do
  case "$var" in SLURM_* | OMPI_* | PMIX_* | RANK | WORLD_SIZE | LOCAL_RANK | LOCAL_WORLD_SIZE | MASTER_ADDR | MASTER_PORT | TORCHELASTIC_*)
    unset "$var" ;;
  esac
done < <(compgen -e)
unset TRAINER_TEST_HOOKS

# Byte tokens (uint16) of a license text, for runs that need no tokenizer.
write_gpl_tokens() {  # FILE
  python3 - "$1" <<'PYEOF'
import struct, sys
text = open("/usr/share/common-licenses/GPL-3", "rb").read()
open(sys.argv[1], "wb").write(struct.pack("<%dH" % len(text), *text))
PYEOF
}
