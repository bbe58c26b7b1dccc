// `trainer calibrate --config run.yaml [--out FILE] [--max-mib N] [--min-kib N] [--quick]`,
// launched exactly as the run is (one process, torchrun, mpirun, srun): the
// run's launch, rendezvous and process groups (runtime/distributed_run.h),
// then on the real cluster
//   - per kind of link found (calibrate/link_groups.h) the latency and
//     bandwidth of all_reduce, all_gather, reduce_scatter and send/receive
//     from --min-kib (4) to --max-mib (calibrate/link_timing.h), on groups made by
//     the run's communicator factory (ProcessGroups::subgroup);
//   - every rank's rate on the model's own matmuls (calibrate/matmul_timing.h);
// and rank 0 writes the `hardware:` section those numbers give the planner
// (calibrate/calibration_report.h) to --out (default <run dir>/hardware.yaml)
// and prints it. Runs and `trainer plan` read it through
// `hardware.calibration: FILE` (config/hardware_file.h).
#pragma once

#include <string>
#include <vector>

namespace trainer {

struct CalibrateOptions {
  std::string out;    // "": <run dir>/hardware.yaml
  int max_mib = 0;    // largest payload; 0: 64, or 4 with quick
  int min_kib = 4;    // smallest payload
  bool quick = false; // fewer sizes and repetitions: a first look in seconds
};

// Exit code 0; throws ConfigError for a mistake of the command line or the
// configuration (too little memory for --max-mib included), a runtime_error
// (DistributedFailure under a launcher) for a failed collective.
int run_calibrate(const std::string& config_path, const std::vector<std::string>& overrides, const CalibrateOptions& o);

}  // namespace trainer
