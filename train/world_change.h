// The line a resume prints when the world differs from the one that wrote
// the checkpoint: an elastic launcher (torchrun --nnodes 1:2) restarted the
// job on fewer nodes after one was lost, or on more when it came back, or a
// user relaunched with another size. The state is resharded from the
// checkpoint and the global batch is kept by changing the accumulation
// (pipeline/pipeline_plan.h microbatches_per_step); this says so, with the
// launcher's reason where it gives one, so that a loss curve with a kink at a
// restart can be read from the log alone.
#pragma once

#include <string>

#include "checkpoint/checkpoint.h"
#include "comm/launch.h"
#include "config/config.h"

namespace trainer {

// "" when the world size and layout are the checkpoint's; otherwise
//   "world: 2 ranks on 1 node now; the checkpoint of step 4 was written by 4
//    ranks (tp2.pp1.dp2.cp1.ep1.zero0 -> tp2.pp1.dp1.cp1.ep1.zero0): data
//    parallel 2 -> 1, the global batch of 8 sequences kept by 4 micro-batches
//    of 2 per rank (was 2), the state resharded from the checkpoint; why:
//    torchrun restart 1 admitted 1 node (it had 2 before): a node was lost
//    or left the job\n"
// `group_world_size`: the launcher's node count for this round (torchrun's
// GROUP_WORLD_SIZE), 0 when it gives none.
std::string describe_world_change(const CheckpointMeta& saved, const Config& cfg, const LaunchInfo& launch,
                                  int nodes_now, int dp_now, int group_world_size);

}  // namespace trainer
