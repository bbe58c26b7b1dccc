// Pipeline schedules as data (docs/ARCHITECTURE.md "Pipeline parallelism").
//
// A schedule says, for every pipeline rank, the ordered actions of one
// training step: the forward of micro-batch i on model chunk c, its backward
// (or the two halves of it: the input gradient, which the previous stage
// waits for, and the weight gradient, which nobody waits for), and the
// point-to-point transfers between neighbouring stages. With v chunks per
// rank (interleaving) the model's layers form p*v virtual stages; virtual
// stage k = c*p + r lives on rank r as chunk c.
//
// Transfers are explicit: a forward of a virtual stage other than the first
// receives its input activation, a forward other than the last sends its
// output; a backward other than the last virtual stage's receives the
// output gradient, one other than the first sends the input gradient.
// Consecutive transfers of a rank form one batch (Communicator::
// batch_send_recv): neighbours that send to each other in the same step do
// so in one batch, as Megatron's send_forward_recv_backward does. A batch
// completes when every message in it meets its partner in the partner's
// current batch; the simulator (pipeline/simulate.h) checks that every
// schedule can run that way before a step does.
//
// Sends do not wait for their receiver: a batch returns once its receives
// have arrived, and a send's buffer is only reused after the send completed
// (the executor waits for a micro-batch's sends when it gives its slot
// back, see slot_releases). A schedule that keeps computing while a
// neighbour has not yet asked for its output is therefore not held up.
//
// Generators (one file each): GPipe (all forwards, then all backwards),
// 1F1B (p - r - 1 warm-up forwards, then one forward one backward, p
// micro-batches of activations in flight at most on rank 0), interleaved
// 1F1B (v chunks per rank), ZB-H1 (1F1B with the backward split: the input
// gradient on 1F1B's critical path, the weight gradient deferred into what
// would be the bubble).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

enum class ActionKind {
  Forward,         // forward of (mb, chunk)
  Backward,        // input and weight gradients of (mb, chunk)
  BackwardInput,   // input gradient only (zero-bubble schedules)
  BackwardWeight,  // weight gradient only
  SendActivation,  // output of (mb, chunk) to the next virtual stage
  RecvActivation,  // input of (mb, chunk) from the previous virtual stage
  SendGradient,    // input gradient of (mb, chunk) to the previous virtual stage
  RecvGradient,    // output gradient of (mb, chunk) from the next virtual stage
};
const char* action_name(ActionKind k);  // "F", "B", "BI", "BW", "send-act", ...
bool is_transfer(ActionKind k);

struct Action {
  ActionKind kind = ActionKind::Forward;
  int mb = 0;
  int chunk = 0;
  int peer = -1;  // transfers: the pipeline rank on the other end
  // A forward of the steady state that runs together with the backward after
  // it (interleaved 1F1B): both receive first, both send after.
  bool paired = false;
  bool operator==(const Action&) const = default;
};
std::string describe(const Action& a);  // "F(mb 3, chunk 1)", "send-act(mb 3, chunk 1) -> rank 2"

enum class ScheduleKind { GPipe, OneFOneB, Interleaved, ZeroBubbleH1 };
const char* schedule_name(ScheduleKind k);  // "gpipe", "1f1b", "interleaved", "zb-h1"
// "gpipe" | "1f1b" | "interleaved" | "zb-h1"; throws std::invalid_argument naming the allowed values.
ScheduleKind parse_schedule(const std::string& name);

struct Schedule {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int stages = 1;        // pipeline ranks p
  int chunks = 1;        // model chunks per rank v
  int microbatches = 1;  // m
  std::vector<std::vector<Action>> ranks;  // ranks[r]: rank r's actions in order
  int virtual_stages() const { return stages * chunks; }
};

// The compute actions of one rank in order; the transfers are added by
// add_transfers. Generators (pipeline/gpipe.cpp, pipeline/one_f_one_b.cpp).
std::vector<Action> gpipe_order(int stages, int rank, int microbatches);
std::vector<Action> one_f_one_b_order(int stages, int rank, int microbatches);
// pipeline/interleaved.cpp; throws std::invalid_argument unless stages divides microbatches.
std::vector<Action> interleaved_order(int stages, int rank, int chunks, int microbatches);
// pipeline/zero_bubble.cpp
std::vector<Action> zb_h1_order(int stages, int rank, int microbatches);
// Whether a schedule of this kind splits backwards into BI and BW (the model
// then keeps each micro-batch's output gradients for its weight half).
bool splits_backward(ScheduleKind k);

// Inserts the transfers around every compute action of every rank (see the
// top of this file). A forward marked `paired` and the backward after it are
// one unit: its two receives before it and its two sends after it.
void add_transfers(Schedule& s);

// The schedule of `kind` for p stages, m micro-batches and (interleaved) v
// chunks per rank, transfers included. Throws std::invalid_argument when m <
// 1, p < 1, v < 1, v > 1 for a schedule without chunks, or an interleaved m
// that p does not divide.
Schedule make_schedule(ScheduleKind kind, int stages, int microbatches, int chunks = 1);

// The last backward of each micro-batch on a rank: ZeRO and gradient
// reductions learn from it that the gradients of the step are complete.
bool is_last_backward(const std::vector<Action>& rank_actions, size_t index);

// Where a rank gives back each micro-batch's activation slot: after the
// action that completes both its weight gradients (B or BW) and the sending
// of its input gradient (nothing to send on the first virtual stage; a
// batch of transfers counts as its last action). Result[i]: the (mb, chunk)
// pairs released after action i. The executor and the simulator both use it.
struct SlotRef {
  int mb = 0;
  int chunk = 0;
  bool operator==(const SlotRef&) const = default;
};
std::vector<std::vector<SlotRef>> slot_releases(const std::vector<Action>& rank_actions, int rank, int stages);

// Early receives (TransferMode::early_receives): each batch's receives are
// posted as soon as the batch before it finished and its slots were given
// back, so their data moves while the rank computes the actions between
// the two batches; a received activation's slot is taken then. at_start:
// the first batch's receives, posted as the step begins; after[i]: those
// posted once action i (the end of a batch) and its releases are done.
// The executor and the simulator both use it.
struct ReceivePosting {
  std::vector<size_t> at_start;
  std::vector<std::vector<size_t>> after;
};
ReceivePosting early_receive_posting(const std::vector<Action>& rank_actions);

}  // namespace trainer
