// A checkpoint's model as one process holds it, for the commands that read a
// saved model (generate, eval): the step directory (or a root's `latest`),
// its saved configuration and every parameter whole in fp32, whatever the
// layout it was saved from.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "model/dims.h"

namespace trainer {

struct SavedModel {
  std::string dir;                          // the step directory
  LoadedCheckpoint ck;
  Config cfg;                               // as saved
  ModelDims dims;                           // one process, B = 1, T = train.seq_len, fp32
  std::vector<std::vector<float>> weights;  // the one-process plan's parameters, in its order
};

// Throws std::runtime_error naming the directory when it is not a checkpoint,
// does not verify, or its saved configuration does not load.
SavedModel load_saved_model(const std::string& checkpoint);

}  // namespace trainer
