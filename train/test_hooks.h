// Faults on purpose, for the tests of the operations features only: the
// environment variable TRAINER_TEST_HOOKS holds comma-separated entries
//   nan_grad=RANK:STEP   this rank's first owned gradient element becomes NaN
//                        after the backward of STEP (1-based)
//   delay=RANK:MS        this rank sleeps MS milliseconds in every step's compute
//   kill=RANK:STEP       this rank SIGKILLs itself at the start of STEP, on the
//                        first launch only (torchrun's TORCHELASTIC_RESTART_COUNT
//                        unset or 0)
//   signal=RANK:STEP     this rank sends itself SIGTERM at the start of STEP
//                        (first launch only)
//   kill_in_save=RANK:STEP  this rank SIGKILLs itself while it saves the
//                        checkpoint of STEP, its file written and its report
//                        not sent (first launch only)
//   skip=*:STEP          every rank treats STEP as flagged by train.nonfinite
//                        (the reference a NaN run is compared with); like
//                        nan_grad, only the first time STEP runs (a rollback
//                        runs it again). May repeat: the reference of an fp16
//                        run whose loss scale overflowed at several steps
//   flip_bit=RANK:STEP   after the update of STEP this rank flips the lowest bit
//                        of the first byte of final_norm.weight (its last stage
//                        holds it), as silent corruption of one copy would;
//                        only the first time STEP runs
// RANK may be * (every rank).
// Unset in every real run; a malformed entry is an error naming it.
#pragma once

#include <cstdint>
#include <set>

namespace trainer {

struct TestHooks {
  int64_t nan_grad_step = -1;  // for this rank; -1: none
  double delay_ms = 0;
  int64_t kill_step = -1, signal_step = -1, kill_in_save_step = -1;
  int64_t flip_bit_step = -1;
  std::set<int64_t> skip_steps;  // each taken once (StepRunner erases it)
};

// The hooks that apply to `rank`.
TestHooks test_hooks_for(int rank);

}  // namespace trainer
