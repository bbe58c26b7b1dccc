#include "optim/zero.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <functional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/device_memory.h"
#include "kernels/ops.h"

namespace trainer {

namespace {
// Unit buffers per pool: the unit in use, a tied embedding the head also
// needs, one prefetch or reduction in flight, and one spare so that the
// next unit never waits for a buffer whose reduction is still running.
constexpr size_t kPoolSlots = 4;

// Slot sizes: the largest kPoolSlots unit sizes, largest first. Any set of
// up to kPoolSlots units fits (the i-th largest of them is no larger than the
// i-th slot), while a large embedding or head does not make every buffer its
// size. Units go to the smallest slot that holds them.
std::vector<size_t> slot_bytes(const std::vector<UnitLayout>& units) {
  std::vector<size_t> b;
  for (const auto& u : units) b.push_back(u.bytes);
  std::sort(b.begin(), b.end(), std::greater<>());
  b.resize(kPoolSlots, b.empty() ? 0 : b.back());
  return b;
}

// A slot's staging buffer holds one shard of whatever unit uses the slot.
int min_shards(const std::vector<UnitLayout>& units) {
  int s = units.empty() ? 1 : units.front().shards;
  for (const auto& u : units) s = std::min(s, u.shards);
  return s;
}

// Bytes of the gradient (and, at stage 3, weight) unit pools.
size_t pool_bytes(const std::vector<UnitLayout>& units, bool weights) {
  size_t total = 0;
  for (size_t b : slot_bytes(units))
    total += arena_round(b) + arena_round(b / size_t(min_shards(units))) + (weights ? arena_round(b) : 0);
  return total;
}

int moment_count(bool mixed) { return mixed ? 3 : 2; }

void* base_of(const Arena& a) { return a.capacity() ? a.flat_f32().data : nullptr; }
}  // namespace

std::vector<size_t> zero_pool_slot_bytes(const std::vector<UnitLayout>& units) { return slot_bytes(units); }

ModelStorage zero_model_storage(int stage) {
  ModelStorage s;
  s.full_params = stage < 3;
  s.full_grads = stage < 2;
  return s;
}

ZeroBytes zero_bytes(const ShardingPlan& plan, int stage, bool offload) {
  const auto& units = plan.units;
  const size_t elem = dtype_size(plan.local.act);
  const size_t full = units_total_bytes(units);
  const size_t shard = size_t(shard_offsets(units, elem).back()) * elem;
  const int nm = moment_count(needs_master_weights(plan.params));
  ZeroBytes b;
  const size_t wpool = pool_bytes(units, true) - pool_bytes(units, false);
  b.params = stage < 3 ? full : shard + wpool;
  b.grads = stage < 2 ? full : shard + pool_bytes(units, false);
  const size_t elems = stage == 0 ? full / elem : shard / elem;
  b.optimizer = arena_round(size_t(nm) * 4 * elems);
  if (offload) {
    // As the optimizer allocates them: m | v | master, fp32 gradients, staging.
    b.optimizer = 0;
    b.host = arena_round(size_t(moment_count(true)) * 4 * elems) + arena_round(4 * elems) +
             (elem != 4 ? arena_round(elem * elems) : 0);
  }
  return b;
}

ZeroOptimizer::ZeroOptimizer(Model& m, int stage, Communicator& dense, Communicator& expert, Communicator& host,
                             const AdamWConfig& cfg)
    : m_(m), stage_(stage), dense_(dense), expert_(expert), host_(host), cfg_(cfg) {
  if (stage < 0 || stage > 3) throw std::invalid_argument("parallel.zero_stage must be 0, 1, 2 or 3");
  if (m.placement.size() != m.params.size())
    throw std::logic_error("ZeroOptimizer: the model has no placement for its parameters (build_model from a plan)");
  if (host.size() < dense.size())
    throw std::logic_error("ZeroOptimizer: the host group (" + host.describe() +
                           ") must hold every rank of the job, at least the data-parallel group " + dense.describe());
  const Device dev = model_device(m);
  elem_ = dtype_size(m.dims.act);
  mixed_ = needs_master_weights(m.params);
  units_ = m.units;
  for (size_t u = 0; u < units_.size(); ++u) {
    const Communicator& c = comm(int(u));
    if (c.size() != units_[u].shards)
      throw std::logic_error("ZeroOptimizer: unit " + std::to_string(u) + " is laid out for " +
                             std::to_string(units_[u].shards) + " shards, its " +
                             grad_group_name(units_[u].group) + " communicator has " + std::to_string(c.size()) +
                             " ranks");
    urank_.push_back(c.rank());
  }
  shard_off_ = shard_offsets(units_, elem_);
  if ((stage < 3) != (m.param_arena.capacity() == units_total_bytes(units_)) ||
      (stage < 2) != (m.grad_arena.capacity() == units_total_bytes(units_)))
    throw std::logic_error("ZeroOptimizer: model not built with zero_model_storage(" + std::to_string(stage) + ")");
  save_pieces_ = shard_pieces(units_, m.params, elem_, urank_);
  opt_pieces_ = stage == 0 ? all_pieces(units_, m.params, elem_) : save_pieces_;
  opt_elems_ = stage == 0 ? int64_t(units_total_bytes(units_) / elem_) : shard_off_.back();
  offload_ = cfg.offload;
  if (offload_) {
    // ZeRO-Offload: m | v | fp32 master in host memory (the master even in
    // fp32 runs: the device keeps only the weights it computes with), the
    // fp32 gradient the host update reads, and a staging copy in the
    // weights' dtype when that is not fp32.
    opt_arena_ = Arena("optimizer state (host)", size_t(moment_count(true)) * 4 * size_t(opt_elems_), Device::CPU);
    host_grads_ = Arena("gradients (host)", 4 * size_t(opt_elems_), Device::CPU);
    if (m.dims.act != DType::F32) host_stage_ = Arena("offload staging (host)", elem_ * size_t(opt_elems_), Device::CPU);
  } else {
    opt_arena_ = Arena("optimizer state", size_t(moment_count(mixed_)) * 4 * size_t(opt_elems_), dev);
  }

  const size_t shard_bytes = size_t(shard_off_.back()) * elem_;
  if (stage >= 3) param_shard_ = Arena("parameter shard", shard_bytes, dev);
  if (stage >= 2) grad_shard_ = Arena("gradient shard", shard_bytes, dev);
  if (stage >= 2) {
    pool_arena_ = Arena("unit buffers", pool_bytes(units_, stage >= 3), dev);
    auto carve = [&](const char* what, size_t bytes) {
      return pool_arena_.alloc({what, {std::max<int64_t>(int64_t(bytes / elem_), 1)}, m.dims.act});
    };
    for (size_t b : slot_bytes(units_)) {
      Slot g;
      g.buf = carve("grad unit", b);
      g.staging = carve("grad staging", b / size_t(min_shards(units_)));
      gslots_.push_back(std::move(g));
      if (stage >= 3) {
        Slot w;
        w.buf = carve("weight unit", b);
        wslots_.push_back(std::move(w));
      }
    }
  }
  w_slots_ = weight_slots(m.dims, m.params, m.w);
  g_slots_ = weight_slots(m.dims, m.params, m.gw);
}

size_t ZeroOptimizer::grad_bytes() const {
  size_t b = m_.grad_arena.capacity() + grad_shard_.capacity();
  for (const Slot& g : gslots_) b += arena_round(g.buf.nbytes()) + arena_round(g.staging.nbytes());
  return b;
}

size_t ZeroOptimizer::param_bytes() const {
  size_t pool = 0;
  for (const Slot& g : gslots_) pool += arena_round(g.buf.nbytes()) + arena_round(g.staging.nbytes());
  return m_.param_arena.capacity() + param_shard_.capacity() + (pool_arena_.capacity() - pool);
}

Communicator& ZeroOptimizer::comm(int unit) const {
  return units_[size_t(unit)].group == GradGroup::Edp ? expert_ : dense_;
}

ZeroOptimizer::~ZeroOptimizer() {
  // Buffers of a collective still in flight must outlive it.
  for (auto* pool : {&wslots_, &gslots_})
    for (Slot& s : *pool)
      if (s.pending) try { s.pending->wait(); } catch (...) {}
  for (auto& w : pending_)
    if (w) try { w->wait(); } catch (...) {}
  for (auto& w : param_gathers_)
    if (w) try { w->wait(); } catch (...) {}
}

Tensor ZeroOptimizer::flat(void* base, DType t, int64_t offset, int64_t count) const {
  return Tensor(static_cast<char*>(base) + offset * int64_t(dtype_size(t)), t, {count}, model_device(m_));
}

int64_t ZeroOptimizer::opt_index(const ZeroPiece& p) const {
  const UnitLayout& u = units_[size_t(p.unit)];
  if (stage_ == 0) return int64_t(u.offset / elem_) + p.unit_elem;
  return shard_off_[size_t(p.unit)] + p.unit_elem - int64_t(urank_[size_t(p.unit)]) * shard_elems(u, elem_);
}

Tensor ZeroOptimizer::weight_view(const ZeroPiece& p) const {
  if (stage_ >= 3) return flat(base_of(param_shard_), m_.dims.act, opt_index(p), p.count);
  return flat(m_.param_tensors[size_t(p.param)].data, m_.dims.act, p.begin, p.count);
}

Tensor ZeroOptimizer::grad_view(const ZeroPiece& p) const {
  if (stage_ >= 2) return flat(base_of(grad_shard_), m_.dims.act, opt_index(p), p.count);
  return flat(m_.grad_tensors[size_t(p.param)].data, m_.dims.act, p.begin, p.count);
}

Tensor ZeroOptimizer::opt_view(const Arena& a, int which, const ZeroPiece& p, DType t) const {
  Tensor v = flat(base_of(a), t, int64_t(which) * opt_elems_ + opt_index(p), p.count);
  v.device = a.device();  // offloaded state lives on the host
  return v;
}

Tensor ZeroOptimizer::fp32_weight(const ZeroPiece& p) const {
  return mixed_ || offload_ ? opt_view(opt_arena_, 2, p) : weight_view(p);
}
Tensor ZeroOptimizer::moment_m(const ZeroPiece& p) const { return opt_view(opt_arena_, 0, p); }
Tensor ZeroOptimizer::moment_v(const ZeroPiece& p) const { return opt_view(opt_arena_, 1, p); }

Tensor ZeroOptimizer::unit_range(const Arena& a, int unit) const {
  const UnitLayout& u = units_[size_t(unit)];
  return flat(base_of(a), m_.dims.act, int64_t(u.offset / elem_), int64_t(u.bytes / elem_));
}

Tensor ZeroOptimizer::own_shard(const Arena& a, int unit) const {
  const UnitLayout& u = units_[size_t(unit)];
  const int64_t s = shard_elems(u, elem_);
  return flat(base_of(a), m_.dims.act, int64_t(u.offset / elem_) + urank_[size_t(unit)] * s, s);
}

Tensor ZeroOptimizer::shard_of(const Arena& a, int unit) const {
  return flat(base_of(a), m_.dims.act, shard_off_[size_t(unit)], shard_elems(units_[size_t(unit)], elem_));
}

void ZeroOptimizer::bind(std::vector<std::vector<Tensor*>>& slots, int unit, void* base) {
  const UnitLayout& u = units_[size_t(unit)];
  for (int p = u.first; p < u.end; ++p)
    for (Tensor* t : slots[size_t(p)]) {
      t->data = base ? static_cast<char*>(base) + u.param_offset[size_t(p - u.first)] : nullptr;
      t->device = model_device(m_);
    }
}

// Stages 1-2: every unit's updated shards to every rank. With overlap the
// gathers stay in flight into the next step, each waited for where its
// unit is first used (forward_begin), as Megatron's overlapped parameter
// gather does; else they are waited for here.
void ZeroOptimizer::gather_all_units(bool leave_in_flight) {
  if (stage_ == 0 || stage_ == 3) return;
  settle();
  param_gathers_.resize(units_.size());
  for (size_t u = 0; u < units_.size(); ++u)
    if (units_[u].bytes && shards(int(u)) > 1)
      param_gathers_[u] = comm(int(u)).all_gather_async(unit_range(m_.param_arena, int(u)), own_shard(m_.param_arena, int(u)));
  if (!leave_in_flight) settle();
}

void ZeroOptimizer::settle_unit(int unit) {
  if (size_t(unit) >= param_gathers_.size() || !param_gathers_[size_t(unit)]) return;
  std::unique_ptr<Work> w = std::move(param_gathers_[size_t(unit)]);
  w->wait();
}

void ZeroOptimizer::settle() {
  for (size_t u = 0; u < param_gathers_.size(); ++u) settle_unit(int(u));
}

void ZeroOptimizer::drop_gathered() {
  for (Slot& s : wslots_) release(s);
}

namespace {
// Host staging per read, bounded: a whole piece (a 50k-row embedding is
// 150 MiB) staged at once would show as a start-up peak above the plan.
constexpr int64_t kLoadChunk = int64_t(1) << 22;

// dst's elements from `read`, in chunks; a host F32 destination is read into
// directly, anything else through one bounded staging buffer.
void load_into(Tensor dst, const std::function<void(int64_t, int64_t, float*)>& read, std::vector<float>& stage) {
  const int64_t count = dst.numel();
  const bool direct = dst.device == Device::CPU && dst.dtype == DType::F32;
  for (int64_t off = 0; off < count; off += kLoadChunk) {
    const int64_t n = std::min(kLoadChunk, count - off);
    if (direct) {
      read(off, n, dst.f32() + off);
      continue;
    }
    stage.resize(size_t(n));
    read(off, n, stage.data());
    write_from_host(Tensor(static_cast<char*>(dst.data) + off * 4, DType::F32, {n}, dst.device), stage.data());
  }
}
}  // namespace

void ZeroOptimizer::load(const PieceReader& read, bool moments) {
  settle();
  std::vector<float> stage;
  for (const ZeroPiece& p : opt_pieces_) {
    auto from = [&](const char* what) {
      return [&, what](int64_t off, int64_t n, float* dst) { read(what, p.param, p.begin + off, n, dst); };
    };
    load_into(fp32_weight(p), from("model"), stage);
    if (offload_)
      weights_from_host(p);
    else if (mixed_)
      ops::convert(weight_view(p), fp32_weight(p));
    // Without moments they stay as allocated: zero (device_alloc). Writing
    // the zeros again would touch every page of the optimizer state at
    // start-up, before the first step needs it.
    if (moments) {
      load_into(moment_m(p), from("optim/m"), stage);
      load_into(moment_v(p), from("optim/v"), stage);
    }
  }
  gather_all_units(false);
  drop_gathered();
}

void ZeroOptimizer::begin_step() {
  fingerprint_ = 0;
  if (stage_ < 2) {
    zero_grads(m_);
  } else {
    if (shard_off_.back() > 0) ops::fill(flat(base_of(grad_shard_), m_.dims.act, 0, shard_off_.back()), 0.f);
  }
}

// The units that must be resident together with `unit`: a layer's dense
// parameters and its experts, the head and a tied embedding.
std::vector<int> ZeroOptimizer::units_for(int unit) const {
  const UnitLayout& u = units_[size_t(unit)];
  if (u.kind == UnitKind::Layer || u.kind == UnitKind::Experts) return m_.unit_index.layers[size_t(u.layer)];
  const int embedding = m_.unit_index.embedding;
  if (u.kind == UnitKind::Head && m_.dims.tied && embedding >= 0) return {unit, embedding};
  return {unit};
}

// The smallest buffer that holds `unit` and is not pinned: a free one if
// there is, else the least recently used (its prefetch, if any, is waited
// for and wasted). Slots are ordered largest first.
ZeroOptimizer::Slot* ZeroOptimizer::take_slot(std::vector<Slot>& pool, int unit, const std::vector<int>& pinned) {
  const size_t need = units_[size_t(unit)].bytes;
  Slot* best = nullptr;
  for (Slot& s : pool) {
    if (s.buf.nbytes() < need || std::find(pinned.begin(), pinned.end(), s.unit) != pinned.end()) continue;
    if (s.unit < 0) {
      best = &s;  // later free slots are smaller: keep looking
    } else if (!best || (best->unit >= 0 && s.used < best->used)) {
      best = &s;
    }
  }
  if (!best) return nullptr;
  release(*best);
  return best;
}

void ZeroOptimizer::release(Slot& s) {
  if (s.pending) s.pending->wait();
  s.pending.reset();
  if (s.unit >= 0) bind(w_slots_, s.unit, nullptr);
  s.unit = -1;
}

// Largest first: the i-th largest unit of a set always fits the i-th
// largest buffer. A unit placed earlier (a prefetch) may sit in a buffer
// that a larger one of the set needs; then the set is placed afresh.
void ZeroOptimizer::make_resident(std::vector<int> need) {
  std::sort(need.begin(), need.end(), [&](int a, int b) { return units_[size_t(a)].bytes > units_[size_t(b)].bytes; });
  for (int attempt = 0; attempt < 2; ++attempt) {
    bool ok = true;
    for (int u : need) ok = ok && weights_resident(u, need);
    if (ok) return;
    for (Slot& s : wslots_)
      if (std::find(need.begin(), need.end(), s.unit) != need.end()) release(s);
  }
  throw std::logic_error("ZeRO-3: the weight buffers cannot hold unit " + std::to_string(need.front()) +
                         " and the units it is used with");
}

bool ZeroOptimizer::weights_resident(int unit, const std::vector<int>& pinned) {
  for (Slot& s : wslots_)
    if (s.unit == unit) {
      if (s.pending) s.pending->wait();
      s.pending.reset();
      s.used = ++clock_;
      bind(w_slots_, unit, s.buf.data);
      return true;
    }
  Slot* slot = take_slot(wslots_, unit, pinned);
  if (!slot) return false;
  Slot& s = *slot;
  s.unit = unit;
  s.used = ++clock_;
  const UnitLayout& u = units_[size_t(unit)];
  if (u.bytes) comm(unit).all_gather(flat(s.buf.data, m_.dims.act, 0, int64_t(u.bytes / elem_)), shard_of(param_shard_, unit));
  bind(w_slots_, unit, s.buf.data);
  return true;
}

// Best effort: without a free buffer the unit is gathered when it is used.
void ZeroOptimizer::prefetch_weights(int unit, const std::vector<int>& pinned) {
  if (!overlap_) return;
  for (const Slot& s : wslots_)
    if (s.unit == unit) return;
  Slot* slot = take_slot(wslots_, unit, pinned);
  if (!slot) return;
  Slot& s = *slot;
  s.unit = unit;
  s.used = ++clock_;
  const UnitLayout& u = units_[size_t(unit)];
  if (u.bytes)
    s.pending = comm(unit).all_gather_async(flat(s.buf.data, m_.dims.act, 0, int64_t(u.bytes / elem_)),
                                            shard_of(param_shard_, unit));
}

void ZeroOptimizer::forward_begin(Model&, int unit, const MicroBatch&) {
  const std::vector<int> need = units_for(unit);
  if (stage_ < 3) {
    for (int u : need) settle_unit(u);
    return;
  }
  make_resident(need);
  if (unit + 1 < int(units_.size())) prefetch_weights(unit + 1, need);
}

void ZeroOptimizer::backward_begin(Model&, int unit, const MicroBatch&) {
  const std::vector<int> need = units_for(unit);
  for (int u : need) settle_unit(u);  // a backward with no forward before it (none today) still sees the weights
  if (stage_ >= 3) {
    make_resident(need);
    if (unit > 0) prefetch_weights(unit - 1, need);
  }
  if (stage_ >= 2)
    for (int u : need) open_grads(u);
}

// Gradients that are partial sums over tensor-parallel ranks are completed
// before the data-parallel reduction, at the same point of the step on every
// tp rank (units come in backward order everywhere): the norms under
// sequence parallelism (over all of tp), and a kv head replicated on several
// tp ranks (over those ranks: an all-gather of every rank's part, summed in
// rank order, so that the replicas stay bit for bit equal).
void ZeroOptimizer::sum_over_tp(int unit, bool bound) {
  const UnitLayout& u = units_[size_t(unit)];
  for (int p = u.first; p < u.end; ++p) {
    const ParamPlacement& pl = m_.placement[size_t(p)];
    if (!pl.tp_sum && pl.kv_replicas == 1) continue;
    if (!m_.tp) throw std::logic_error("ZeRO: '" + m_.params[size_t(p)].spec.name + "' is summed over tp, the model has no tp group");
    const Tensor g = bound ? *g_slots_[size_t(p)].front() : m_.grad_tensors[size_t(p)];
    if (pl.tp_sum) {
      m_.tp->all_reduce(g);
      continue;
    }
    const int tp = m_.tp->size(), first = m_.tp->rank() / pl.kv_replicas * pl.kv_replicas;
    const int64_t n = g.numel();
    if (kv_scratch_.capacity() < size_t(tp * n) * elem_)
      kv_scratch_ = Arena("kv gradient gather", size_t(tp * n) * elem_, model_device(m_));
    const Tensor all = flat(base_of(kv_scratch_), m_.dims.act, 0, tp * n);
    m_.tp->all_gather(all, g);
    ops::copy(g, flat(base_of(kv_scratch_), m_.dims.act, first * n, n));
    for (int r = first + 1; r < first + pl.kv_replicas; ++r)
      ops::add_inplace(g, flat(base_of(kv_scratch_), m_.dims.act, r * n, n));
  }
}

void ZeroOptimizer::set_pipeline(Communicator* pp) {
  pp_ = pp;
  for (size_t u = 0; u < units_.size(); ++u)
    if (has_tied(int(u)) && stage_ >= 2)
      throw std::logic_error("ZeRO-" + std::to_string(stage_) +
                             " reduces gradients every micro-batch; a tied embedding split over pipeline stages is "
                             "summed once per step (use ZeRO 0 or 1 with pipeline parallelism)");
}

bool ZeroOptimizer::has_tied(int unit) const {
  const UnitLayout& u = units_[size_t(unit)];
  for (int p = u.first; p < u.end; ++p)
    if (m_.placement[size_t(p)].tie_sum) return true;
  return false;
}

void ZeroOptimizer::before_reduction(Tensor grads) {
  if (grads.numel() == 0) return;
  if (poison_) {
    poison_ = false;
    ops::fill(grads.view({grads.numel()}).slice0(0, 1), std::numeric_limits<float>::quiet_NaN());
  }
  if (fingerprint_on_) fingerprint_ += ops::sum_squares(grads);
}

void ZeroOptimizer::issue_reduction(int unit) {
  if (units_[size_t(unit)].bytes > 0) before_reduction(unit_range(m_.grad_arena, unit));
  if (shards(unit) == 1 || units_[size_t(unit)].bytes == 0) return;
  if (stage_ == 0)
    pending_.push_back(comm(unit).all_reduce_async(unit_range(m_.grad_arena, unit)));
  else
    pending_.push_back(comm(unit).reduce_scatter_async(own_shard(m_.grad_arena, unit), unit_range(m_.grad_arena, unit)));
  if (!overlap_) {
    pending_.back()->wait();
    pending_.pop_back();
  }
}

void ZeroOptimizer::backward_end(Model&, int unit, const MicroBatch& mb) {
  if (stage_ >= 2) {
    sum_over_tp(unit, true);
    close_grads(unit);
    return;
  }
  if (!mb.last) return;  // gradient accumulation synchronises only on the last micro-batch
  sum_over_tp(unit, false);
  // The other pipeline end may still be computing: its copy of the tied
  // table is added in finish_backward, after every backward of the step.
  if (pp_ && pp_->size() > 1 && has_tied(unit)) {
    tied_units_.push_back(unit);
    return;
  }
  issue_reduction(unit);
}

void ZeroOptimizer::land(Slot& s) {
  s.pending->wait();
  s.pending.reset();
  const Tensor own = shard_of(grad_shard_, s.unit);
  ops::add_inplace(own, flat(s.staging.data, m_.dims.act, 0, own.numel()));
  s.unit = -1;
}

void ZeroOptimizer::open_grads(int unit) {
  for (const Slot& s : gslots_)
    if (s.unit == unit && !s.pending) return;  // a tied embedding opened by the head
  // The smallest free buffer that holds the unit, else the one whose
  // reduction was issued first among those that do.
  const size_t need = units_[size_t(unit)].bytes;
  Slot* pick = nullptr;
  for (Slot& s : gslots_)
    if (s.buf.nbytes() >= need && s.unit < 0) pick = &s;
  if (!pick)
    for (Slot& s : gslots_)
      if (s.buf.nbytes() >= need && s.pending && (!pick || s.used < pick->used)) pick = &s;
  if (!pick) throw std::logic_error("ZeRO: no gradient buffer is free for unit " + std::to_string(unit));
  if (pick->pending) land(*pick);
  pick->unit = unit;
  pick->used = ++clock_;
  const UnitLayout& u = units_[size_t(unit)];
  if (u.bytes) ops::fill(flat(pick->buf.data, m_.dims.act, 0, int64_t(u.bytes / elem_)), 0.f);
  bind(g_slots_, unit, pick->buf.data);
}

void ZeroOptimizer::close_grads(int unit) {
  for (Slot& s : gslots_)
    if (s.unit == unit && !s.pending) {
      const UnitLayout& u = units_[size_t(unit)];
      bind(g_slots_, unit, nullptr);
      s.used = ++clock_;
      if (u.bytes == 0) {
        s.unit = -1;
        return;
      }
      const int64_t se = shard_elems(u, elem_);
      before_reduction(flat(s.buf.data, m_.dims.act, 0, int64_t(u.bytes / elem_)));
      s.pending = comm(unit).reduce_scatter_async(flat(s.staging.data, m_.dims.act, 0, se),
                                                  flat(s.buf.data, m_.dims.act, 0, int64_t(u.bytes / elem_)));
      if (!overlap_) land(s);
      return;
    }
  throw std::logic_error("ZeRO: gradients of unit " + std::to_string(unit) + " closed but never opened");
}

void ZeroOptimizer::finish_backward() {
  // A tied table on the first and the last pipeline stage: both copies get
  // the sum of the two gradients (a + b on one end, b + a on the other: the
  // same bits), then the data-parallel reduction.
  for (int unit : tied_units_) {
    const UnitLayout& u = units_[size_t(unit)];
    for (int p = u.first; p < u.end; ++p) {
      if (!m_.placement[size_t(p)].tie_sum) continue;
      const Tensor g = m_.grad_tensors[size_t(p)];
      if (tie_scratch_.capacity() < g.nbytes()) tie_scratch_ = Arena("tied embedding gradient", g.nbytes(), model_device(m_));
      const Tensor other = flat(base_of(tie_scratch_), g.dtype, 0, g.numel());
      const int peer = pp_->rank() == 0 ? pp_->size() - 1 : 0;
      pp_->batch_send_recv({{true, g, peer}, {false, other, peer}});
      ops::add_inplace(g, other);
    }
    issue_reduction(unit);
  }
  tied_units_.clear();
  for (auto& w : pending_) w->wait();
  pending_.clear();
  std::vector<Slot*> inflight;
  for (Slot& s : gslots_)
    if (s.pending) inflight.push_back(&s);
  std::sort(inflight.begin(), inflight.end(), [](const Slot* a, const Slot* b) { return a->used < b->used; });
  for (Slot* s : inflight) land(*s);
}

// Every element of the global gradient counts once: each rank sums its own
// shard (at stage 0 the data-parallel replicas hold the same gradient and
// rank 0 of the group counts it), of the copies tp or a tied pair hold
// alike only the saved one, and the host group adds the ranks' sums.
double ZeroOptimizer::grad_sum_squares() {
  // The norm counts each element once (a tensor-parallel replica or a
  // data-parallel copy on one rank only), but a NaN or Inf in any rank's own
  // copy must flag the step: an update applied there would make the
  // replicas disagree and the run die a step later. So the pieces the norm
  // does not count are looked at too, and a non-finite one makes the
  // all-reduced sum NaN on every rank.
  double s[2] = {0, 0};  // sum of squares, pieces with a non-finite element
  for (const ZeroPiece& p : opt_pieces_) {
    const bool counted = m_.placement[size_t(p.param)].saved && !(stage_ == 0 && urank_[size_t(p.unit)] != 0);
    const double q = ops::sum_squares(grad_view(p));
    if (counted)
      s[0] += q;
    else if (!std::isfinite(q))
      s[1] += 1;
  }
  local_sum_squares_ = s[0];
  if (host_.size() > 1) host_.all_reduce(Tensor(s, DType::F64, {2}));
  return s[1] > 0 ? std::numeric_limits<double>::quiet_NaN() : s[0];
}

std::string ZeroOptimizer::first_nonfinite_gradient() {
  for (const ZeroPiece& p : opt_pieces_)
    if (!std::isfinite(ops::sum_squares(grad_view(p)))) return m_.params[size_t(p.param)].spec.name;
  return "";
}

// The device weights of a piece from its host fp32 master.
void ZeroOptimizer::weights_from_host(const ZeroPiece& p) {
  if (m_.dims.act == DType::F32) {
    copy_between_devices(weight_view(p), fp32_weight(p));
    return;
  }
  const Tensor stage = opt_view(host_stage_, 0, p, m_.dims.act);
  ops::convert(stage, fp32_weight(p));
  copy_between_devices(weight_view(p), stage);
}

// ZeRO-Offload's step: each piece's reduced gradient to the host (as fp32),
// the CPU backend's AdamW on the host state, the updated weights back.
void ZeroOptimizer::offload_step(const ops::AdamWStep& st) {
  std::vector<Tensor> masters, grads, ms, vs;
  std::vector<float> decays;
  for (const ZeroPiece& p : opt_pieces_) {
    const Tensor g = opt_view(host_grads_, 0, p);
    if (m_.dims.act == DType::F32) {
      copy_between_devices(g, grad_view(p));
    } else {
      const Tensor stage = opt_view(host_stage_, 0, p, m_.dims.act);
      copy_between_devices(stage, grad_view(p));
      ops::convert(g, stage);
    }
    masters.push_back(fp32_weight(p));
    grads.push_back(g);
    ms.push_back(moment_m(p));
    vs.push_back(moment_v(p));
    decays.push_back(m_.params[size_t(p.param)].decay ? float(cfg_.weight_decay) : 0.f);
  }
  // The masters are their own "weights" here: the op updates them in place.
  ops::adamw_update_master_multi(masters, masters, grads, ms, vs, decays, st);
  for (const ZeroPiece& p : opt_pieces_) weights_from_host(p);
}

void ZeroOptimizer::step(double lr, double grad_scale) {
  settle();  // the shards being updated are the last gathers' inputs
  step_ += 1;
  // One multi-tensor update over all of this rank's pieces: on a GPU one
  // launch instead of one per piece, on the CPU the pieces in order; either
  // way each piece gets exactly the single-tensor update. Without master
  // weights (F32) a piece's fp32 weight is its weight, which the op takes as
  // adamw_update.
  const size_t n = opt_pieces_.size();
  std::vector<Tensor> params, masters, grads, ms, vs;
  std::vector<float> decays;
  for (auto* list : {&params, &masters, &grads, &ms, &vs}) list->reserve(n);
  decays.reserve(n);
  for (const ZeroPiece& p : opt_pieces_) {
    params.push_back(weight_view(p));
    masters.push_back(fp32_weight(p));
    grads.push_back(grad_view(p));
    ms.push_back(moment_m(p));
    vs.push_back(moment_v(p));
    decays.push_back(m_.params[size_t(p.param)].decay ? float(cfg_.weight_decay) : 0.f);
  }
  const ops::AdamWStep st{float(lr),   float(cfg_.beta1), float(cfg_.beta2), float(cfg_.eps),
                          /*weight_decay: per piece*/ 0.f, step_, float(grad_scale)};
  if (offload_)
    offload_step(st);
  else
    ops::adamw_update_master_multi(params, masters, grads, ms, vs, decays, st);
  gather_all_units(overlap_);
  drop_gathered();
}

std::vector<std::vector<float>> ZeroOptimizer::gather_fp32_weights(const std::vector<ParamInfo>& global) {
  settle();
  std::unordered_map<std::string, size_t> index;
  std::vector<int64_t> off(global.size() + 1, 0);
  for (size_t i = 0; i < global.size(); ++i) {
    index[global[i].spec.name] = i;
    off[i + 1] = off[i] + global[i].spec.numel();
  }
  std::vector<float> all(size_t(off.back()), 0.f), piece;
  // Each element comes from one rank (its saved copy, its ZeRO shard), so
  // the sum over the host group assembles the whole model exactly.
  for (const ZeroPiece& z : save_pieces_) {
    const ParamInfo& p = m_.params[size_t(z.param)];
    if (!m_.placement[size_t(z.param)].saved) continue;
    auto it = index.find(p.spec.name);
    if (it == index.end()) throw std::logic_error("gather_fp32_weights: '" + p.spec.name + "' is not in the model");
    piece.resize(size_t(z.count));
    read_to_host(fp32_weight(z), piece.data());
    float* dst = all.data() + off[it->second];
    for_each_global_run(p, z.begin, z.count, [&](int64_t local, int64_t g, int64_t n) {
      std::copy(piece.begin() + (local - z.begin), piece.begin() + (local - z.begin + n), dst + g);
    });
  }
  if (host_.size() > 1) host_.all_reduce(Tensor(all.data(), DType::F32, {int64_t(all.size())}));
  std::vector<std::vector<float>> out(global.size());
  for (size_t i = 0; i < out.size(); ++i) out[i].assign(all.begin() + off[i], all.begin() + off[i + 1]);
  return out;
}

}  // namespace trainer
