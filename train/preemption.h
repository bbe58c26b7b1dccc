// Signals that ask a run to stop (docs/ARCHITECTURE.md "Preemption"):
// SIGTERM (Slurm at the time limit or on preemption, torchrun, kill),
// SIGUSR1 (Slurm's --signal=USR1@SECONDS, the early warning) and SIGINT
// (Ctrl-C). The first sets a flag the training loop reads once a step; the
// ranks agree on it inside the step's loss all-reduce, so all of them stop
// after the same step, write a checkpoint there (synchronously, together)
// and exit with kPreemptedExitCode. A second signal exits at once with the
// same code: checkpoints are written into step_N.partial and renamed when
// complete, so an exit mid-save leaves the newest complete one intact.
#pragma once

namespace trainer {

// "Temporary failure, try again" (sysexits' EX_TEMPFAIL): the run stopped
// on a signal after saving; relaunching resumes it. torchrun restarts on
// any non-zero exit (--max-restarts); scripts/sbatch_example.sh requeues
// the job on this code.
inline constexpr int kPreemptedExitCode = 75;

void install_preemption_handlers();
// Signals received so far (0: none), and the last one's name ("SIGTERM").
int preemption_requests();
// preemption_requests() > 0, as a plain function (runtime/watchdog.h).
bool preemption_requested();
const char* preemption_signal();

}  // namespace trainer
