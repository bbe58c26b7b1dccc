// What `trainer calibrate` measured, turned into the `hardware:` section
// it writes (config/hardware_file.h) and the tables that go with it as
// comments: per link and collective the measured time of every size, the
// line t(n) = a + n/B fitted on every other size and the planner's time on
// the fitted hardware numbers (planner/link_fit.h), each with its error,
// the held-out sizes marked; per rank the model's matmul rate.
#pragma once

#include <string>
#include <vector>

#include "calibrate/matmul_timing.h"
#include "config/config.h"
#include "planner/hardware.h"
#include "planner/link_fit.h"

namespace trainer {

struct Calibration {
  std::string when;         // "2025-06-01 10:00 UTC"
  std::string config;       // the configuration's path
  std::string device;       // "cpu", "NVIDIA H100 80GB HBM3"
  std::string storage;      // "fp32", "bf16"
  const Hardware* gpu = nullptr;  // the GPU table's entry for the device, if any
  double memory_gib = 0;    // of the device (the host's on the CPU)
  std::vector<std::string> host_of_rank;
  int gpus_per_node = 1;    // ranks on node 0
  std::string sizes;        // "4 KiB .. 4 MiB by factors of 4, median of 5 calls after 1 warm-up"
  std::vector<std::string> link_labels;     // one per link measured, as in `links`' across_nodes order
  std::vector<CollectiveTimes> links;       // every collective of every link measured
  std::vector<std::string> notes;           // what was not measured and why
  std::vector<double> rank_flop_per_s;      // the model's matmul rate of each rank
  std::vector<MatmulTiming> matmuls;        // rank 0's shapes
};

struct CalibrationReport {
  Config numbers;                 // the hardware section's values
  std::vector<std::string> keys;  // the keys written, in order
  Hardware hardware;              // what the planner makes of them (links not measured: placeholders)
  double worst_held_out = 0;      // the planner's largest |error| on a held-out size (0: no link)
  std::string yaml;               // the file: comments, then `hardware:`
};

// Throws std::invalid_argument when a link's times cannot be fitted.
CalibrationReport make_calibration_report(const Calibration& c);

}  // namespace trainer
