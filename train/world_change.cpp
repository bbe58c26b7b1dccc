#include "train/world_change.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "pipeline/pipeline_plan.h"
#include "train/checkpointing.h"

namespace trainer {

namespace {

// The "dpN" part of a layout string ("tp2.pp1.dp2.cp1.ep1.zero0"); 0 when absent.
int layout_dp(const std::string& layout) {
  for (size_t at = 0; at < layout.size();) {
    const size_t end = std::min(layout.find('.', at), layout.size());
    const std::string part = layout.substr(at, end - at);
    if (part.size() > 2 && part.compare(0, 2, "dp") == 0) {
      try {
        return std::stoi(part.substr(2));
      } catch (const std::exception&) {
        return 0;
      }
    }
    at = end + 1;
  }
  return 0;
}

std::string count(int n, const char* one) { return std::to_string(n) + " " + one + (n == 1 ? "" : "s"); }

}  // namespace

std::string describe_world_change(const CheckpointMeta& saved, const Config& cfg, const LaunchInfo& launch,
                                  int nodes_now, int dp_now, int group_world_size) {
  const std::string layout_now = layout_string(cfg, dp_now);
  if (saved.world_size == launch.world_size && (saved.layout.empty() || saved.layout == layout_now)) return "";
  std::string s = "world: " + count(launch.world_size, "rank") + " on " + count(nodes_now, "node") +
                  " now; the checkpoint of step " + std::to_string(saved.step) + " was written by " +
                  count(saved.world_size, "rank") +
                  (saved.nodes > 0 ? " on " + count(saved.nodes, "node") : std::string()) + " (" +
                  (saved.layout.empty() ? "layout not recorded" : saved.layout) + " -> " + layout_now + ")";
  const int dp_saved = layout_dp(saved.layout);
  const int64_t micro = cfg.train.micro_batch_size;
  if (dp_saved > 0 && dp_saved != dp_now) {
    const int64_t m_now = microbatches_per_step(cfg, dp_now);
    s += ": data parallel " + std::to_string(dp_saved) + " -> " + std::to_string(dp_now) + ", the global batch of " +
         std::to_string(cfg.train.global_batch_size) + " sequences kept by " + std::to_string(m_now) +
         " micro-batches of " + std::to_string(micro) + " per rank";
    // The old accumulation holds when the batch settings are unchanged.
    if (cfg.train.global_batch_size % (micro * dp_saved) == 0)
      s += " (was " + std::to_string(cfg.train.global_batch_size / (micro * dp_saved)) + ")";
  }
  s += ", the state resharded from the checkpoint";
  // Why, as far as the launcher tells: an elastic restart's node count.
  const int nodes_before = saved.nodes;
  if (saved.world_size == launch.world_size) {
    s += "; why: the configuration's parallel layout differs from the checkpoint's";
  } else if (launch.launcher == "torchrun" && launch.restart_count > 0) {
    s += "; why: torchrun restart " + std::to_string(launch.restart_count);
    if (group_world_size > 0) s += " admitted " + count(group_world_size, "node");
    if (nodes_before > 0 && nodes_now < nodes_before)
      s += " (" + std::to_string(nodes_before) + " before): a node was lost or left the job";
    else if (nodes_before > 0 && nodes_now > nodes_before)
      s += " (" + std::to_string(nodes_before) + " before): a node joined or came back";
  } else {
    s += "; why: the launcher (" + launch.launcher + ") started " + count(launch.world_size, "rank") +
         (launch.restart_count > 0 ? " on restart " + std::to_string(launch.restart_count) : "") +
         " where the checkpoint had " + std::to_string(saved.world_size);
  }
  return s + "\n";
}

}  // namespace trainer
