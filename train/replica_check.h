// Copies that must be identical, checked (train.replica_check_interval).
// Silent data corruption leaves every rank running and the loss plausible
// while replicas stop being the same model; Megatron-LM compares a hash of
// the weights across data-parallel replicas for this. Here every rank takes
// ops::checksum of each piece it holds that other ranks hold too:
//   - data-parallel replicas (the ZeRO group, which spans cp and ep): the
//     weights at ZeRO 0-2, and at ZeRO 0 AdamW's m, v and fp32 masters
//     (ZeroOptimizer::replica_pieces);
//   - tensor-parallel copies: parameters tp does not cut (norms), and a
//     key/value head replicated over several tp ranks;
//   - the tied embedding's copies on the first and the last pipeline stage.
// One all-gather over the host group brings every rank's records to every
// rank, and each judges them the same way, so all reach one verdict.
//
// Who is named: where a majority of a set of copies agrees, the others.
// Two copies have no majority. Then, in this order: a rank that is in every
// disagreeing set (its data-parallel pair and its tensor-parallel pair);
// the copies that differ from their ZeRO shard's owner (what the gather
// sent); otherwise both, with a message that says the check cannot tell.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <stdexcept>

namespace trainer {

// train.replica_policy=stop, or a rollback that could not help: exit 5.
struct ReplicaMismatch : std::runtime_error {
  using std::runtime_error::runtime_error;
};
inline constexpr int kReplicaMismatchExitCode = 5;

class StageModels;
class DistributedRun;
struct ParamInfo;

enum class ReplicaGroup : uint64_t { DataParallel = 0, TensorParallel = 1, PipelineEnds = 2 };

// One piece of one rank: which set of copies it belongs to and its checksum.
struct ReplicaRecord {
  uint64_t group = 0;   // ReplicaGroup
  uint64_t set = 0;     // the set's first global rank (with group, names the set)
  uint64_t param = 0;   // index into the whole model's parameter list
  uint64_t what = 0;    // index into kReplicaWhat
  uint64_t begin = 0;   // first element of the piece in this rank's slice
  uint64_t hash = 0;
  int64_t owner = -1;   // ZeRO 1-2: the rank whose copy the others received
  int64_t rank = 0;
};
inline constexpr const char* kReplicaWhat[] = {"weights", "optim m", "optim v", "fp32 master"};

struct ReplicaVerdict {
  bool ok = true;
  std::vector<int> ranks;  // the ranks named
  std::string message;     // one paragraph: set, ranks and nodes, first tensor, how they were picked
  size_t pieces = 0, sets = 0;
};

// The verdict on every rank's records (any order). `names`: the whole
// model's parameter names; `host_of_rank`: each global rank's node.
ReplicaVerdict judge_replicas(const std::vector<ReplicaRecord>& all, const std::vector<std::string>& names,
                              const std::vector<std::string>& host_of_rank);

// This rank's records (after settling ZeRO's in-flight gathers).
std::vector<ReplicaRecord> replica_records(StageModels& models, DistributedRun& dist,
                                           const std::vector<ParamInfo>& global);

// Collective over the host group: every rank's records, judged.
ReplicaVerdict check_replicas(StageModels& models, DistributedRun& dist, const std::vector<ParamInfo>& global,
                              const std::vector<std::string>& host_of_rank);

}  // namespace trainer
