#include "planner/layout_search.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <exception>
#include <mutex>
#include <thread>

#include "model/sharding.h"
#include "pipeline/pipeline_plan.h"
#include "planner/memory_plan.h"
#include "planner/gpu_memory.h"
#include "planner/step_estimate.h"

namespace trainer {

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

std::string layout_name(const LayoutResult& r) {
  const Config& c = r.cfg;
  char buf[200];
  std::snprintf(buf, sizeof buf, "tp %d%s x pp %d x dp %d x cp %d%s, ZeRO %d, mb %d, recompute %s%s", r.mesh.tp,
                c.parallel.sp ? " sp" : "", r.mesh.pp, r.mesh.dp, r.mesh.cp,
                r.mesh.ep > 1 ? (" ep " + std::to_string(r.mesh.ep)).c_str() : "", c.parallel.zero_stage,
                c.train.micro_batch_size, c.train.recompute.c_str(),
                r.mesh.pp > 1 ? (", " + c.parallel.pp_schedule).c_str() : "");
  return buf;
}

std::string ms(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 10 ? "%.2f s" : "%.1f s", s);
  return buf;
}

// Memory, and for a layout that fits the time estimate; for one that does
// not (or only tightly), only its compute time (what it would take at best).
void cost(LayoutResult& r, const Hardware& hw) {
  const LayoutShardings plans = layout_shardings(r.cfg, r.mesh, kGpuStorage);
  const GpuMemory mem = gpu_memory_of(r.mesh, hw, plans, r.cfg.parallel.zero_stage);
  r.memory = double(mem.total());
  r.fits = mem.fits();
  r.tight = mem.tight();
  if (!r.fits) {
    r.step_s = r.compute_s = compute_seconds(r.cfg, r.mesh, hw, kGpuStorage);
    return;
  }
  const StepEstimate e = estimate_step(r.cfg, r.mesh, hw, kGpuStorage, plans);
  r.step_s = e.step_s;
  r.tokens_per_s = e.tokens_per_s;
  r.mfu = e.mfu;
  r.compute_s = e.compute_s;
  r.recompute_s = e.recompute_s;
  r.exposed_comm_s = e.exposed_comm_s;
  r.idle_s = e.idle_s;
  r.optimizer_s = e.optimizer_s;
  r.bubble = e.bubble;
}

int schedule_rank(const std::string& s) {
  if (s == "1f1b") return 0;
  if (s == "gpipe") return 1;
  if (s == "zb-h1") return 2;
  return 3;
}

int recompute_rank(const std::string& r) { return r == "none" ? 0 : r == "selective" ? 1 : 2; }

}  // namespace

std::vector<int> simplicity(const LayoutResult& r) {
  const MeshShape& m = r.mesh;
  const Config& c = r.cfg;
  const int dims = (m.tp > 1) + (m.pp > 1) + (m.cp > 1) + (m.ep > 1);
  return {dims,
          m.tp * m.pp * m.cp * m.ep,
          c.parallel.zero_stage,
          recompute_rank(c.train.recompute),
          c.parallel.sp ? 1 : 0,
          m.pp > 1 ? schedule_rank(c.parallel.pp_schedule) : 0,
          -c.train.micro_batch_size};
}

bool ranks_before(const LayoutResult& a, const LayoutResult& b) {
  const long long ta = std::llround(a.step_s * 1e3), tb = std::llround(b.step_s * 1e3);
  if (ta != tb) return ta < tb;
  if (a.memory != b.memory) return a.memory < b.memory;
  return simplicity(a) < simplicity(b);
}

SearchResult search(const Config& c, int world, const Hardware& hw) {
  SearchResult out;
  const int G = std::max(1, hw.gpus_per_node);
  const bool moe = c.model.moe.num_experts > 0;
  std::vector<LayoutResult> layouts;
  for (int tp : divisors(std::min(world, G)))
    for (int pp : divisors(world / tp))
      for (int cp : divisors(world / tp / pp)) {
        const int dp = world / tp / pp / cp;
        if (c.train.global_batch_size % dp != 0) continue;
        const int per_dp = c.train.global_batch_size / dp;
        for (int ep : moe ? divisors(dp * cp) : std::vector<int>{1})
          for (bool sp : tp > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false})
            for (int zero = 0; zero <= 3; ++zero)
              for (int mb = 1; mb <= std::min(per_dp, 32); mb *= 2) {
                if (per_dp % mb != 0) continue;
                for (const char* rc : {"none", "selective", "full"})
                  for (const char* sched : pp > 1 ? std::vector<const char*>{"1f1b", "gpipe", "interleaved", "zb-h1"}
                                                  : std::vector<const char*>{"1f1b"}) {
                    ++out.considered;
                    Config t = c;
                    t.parallel.tp = tp;
                    t.parallel.pp = pp;
                    t.parallel.cp = cp;
                    t.parallel.dp = dp;
                    t.parallel.ep = ep;
                    t.parallel.sp = sp;
                    t.parallel.zero_stage = zero;
                    t.parallel.pp_schedule = sched;
                    t.parallel.pp_layers.clear();
                    t.train.micro_batch_size = mb;
                    t.train.recompute = rc;
                    LayoutResult r;
                    try {
                      // The run's own checks decide what is a layout.
                      validate_config(t, world);
                      r.mesh = resolve_mesh(t.parallel, world, std::min(world, G));
                    } catch (const ConfigError&) {
                      ++out.refused;
                      continue;
                    } catch (const std::invalid_argument&) {
                      ++out.refused;  // a schedule the generators refuse (interleaved micro-batch groups)
                      continue;
                    }
                    r.cfg = std::move(t);
                    layouts.push_back(std::move(r));
                  }
              }
      }
  // Each layout is priced on its own: spread them over the cores.
  const unsigned n = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  std::vector<std::thread> workers;
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mu;
  for (unsigned w = 0; w < n; ++w)
    workers.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < layouts.size();) {
        try {
          cost(layouts[i], hw);
        } catch (const ConfigError&) {
          layouts[i].refused = true;  // the sharding plan refuses it (naming the key)
        } catch (const std::invalid_argument&) {
          layouts[i].refused = true;  // a schedule the generators refuse (interleaved micro-batch groups)
        } catch (...) {
          std::lock_guard<std::mutex> lock(failure_mu);
          if (!failure) failure = std::current_exception();
        }
      }
    });
  for (std::thread& t : workers) t.join();
  if (failure) std::rethrow_exception(failure);
  for (LayoutResult& r : layouts) {
    if (r.refused)
      ++out.refused;
    else
      (r.fits ? out.fitting : out.not_fitting).push_back(std::move(r));
  }
  auto faster = [](const LayoutResult& a, const LayoutResult& b) { return a.step_s < b.step_s; };
  std::stable_sort(out.fitting.begin(), out.fitting.end(), ranks_before);
  std::stable_sort(out.not_fitting.begin(), out.not_fitting.end(), faster);
  return out;
}

std::string search_layouts(const Config& c, int world, const Hardware& hw, int top) {
  const SearchResult s = search(c, world, hw);
  const double device = hw.memory_gib * 1024.0 * 1024.0 * 1024.0;
  size_t tight = 0;
  for (const LayoutResult& r : s.not_fitting) tight += r.tight;
  char buf[768];
  std::snprintf(buf, sizeof buf,
                "\nsearch: %d layouts of %d GPUs with the global batch of %d sequences: %d refused by the "
                "configuration checks, %zu do not fit in %.0f GiB, %zu tight (over the %.0f%% a plan may fill, "
                "%s), %zu fit.\n"
                "ranked by estimated step time to the millisecond (predictions, not measurements); equal times by "
                "memory per GPU (more headroom first), then by simplicity: fewer of tp, pp, cp, ep in use, a smaller "
                "tp x pp x cp x ep, a lower ZeRO stage, less recompute, no sp, 1f1b before gpipe, zb-h1, "
                "interleaved, larger micro-batches:\n",
                s.considered, world, c.train.global_batch_size, s.refused, s.not_fitting.size() - tight,
                hw.memory_gib, tight, 100 * kUsableMemoryShare, format_bytes(kUsableMemoryShare * device).c_str(),
                s.fitting.size());
  std::string out = buf;
  std::snprintf(buf, sizeof buf, "  %3s  %-66s %10s %9s %11s %6s  %s\n", "#", "layout", "memory", "step", "tokens/s",
                "MFU", "why it ranks below #1");
  out += buf;
  const size_t n = std::min(s.fitting.size(), size_t(std::max(top, 0)));
  const LayoutResult* best = s.fitting.empty() ? nullptr : &s.fitting.front();
  for (size_t i = 0; i < n; ++i) {
    const LayoutResult& r = s.fitting[i];
    std::string why;
    if (i > 0) {
      char w[240];
      if (std::llround(r.step_s * 1e3) == std::llround(best->step_s * 1e3)) {
        if (r.memory != best->memory)
          std::snprintf(w, sizeof w, "same step to the ms, %s more memory", format_bytes(r.memory - best->memory).c_str());
        else
          std::snprintf(w, sizeof w, "same step to the ms and memory, less simple");
      } else {
        // The parts of the step (each >= 0, adding up to it) against the winner's,
        // rounded to the ms first: a difference of -0.2 ms prints as +0, not -0.
        auto d = [](double a, double b) { return double(std::llround(1e3 * (a - b))) + 0.0; };
        std::snprintf(w, sizeof w, "+%s: compute %+.0f ms, recompute %+.0f ms, exposed comm %+.0f ms, idle %+.0f ms, "
                      "optimizer %+.0f ms",
                      ms(r.step_s - best->step_s).c_str(),
                      d(r.compute_s - r.recompute_s, best->compute_s - best->recompute_s),
                      d(r.recompute_s, best->recompute_s), d(r.exposed_comm_s, best->exposed_comm_s),
                      d(r.idle_s, best->idle_s), d(r.optimizer_s, best->optimizer_s));
      }
      why = w;
    }
    std::snprintf(buf, sizeof buf, "  %3zu  %-66s %10s %9s %11.0f %5.1f%%  %s\n", i + 1, layout_name(r).c_str(),
                  format_bytes(r.memory).c_str(), ms(r.step_s).c_str(), r.tokens_per_s, 100 * r.mfu, why.c_str());
    out += buf;
  }
  // The fastest that do not fit, one per mesh shape (the others differ in
  // ZeRO stage or micro-batch and tell nothing more).
  std::vector<const LayoutResult*> shown;
  for (const LayoutResult& r : s.not_fitting) {
    if (shown.size() == 5) break;
    bool seen = false;
    for (const LayoutResult* o : shown) seen |= o->mesh == r.mesh && o->cfg.parallel.sp == r.cfg.parallel.sp;
    if (!seen) shown.push_back(&r);
  }
  if (!shown.empty()) {
    out += "  the fastest layouts that do not fit or are tight, one per mesh (step: their compute alone):\n";
    for (const LayoutResult* p : shown) {
      const LayoutResult& r = *p;
      const std::string why = r.tight ? "tight: " + format_bytes(r.memory - kUsableMemoryShare * device) + " over the " +
                                            std::to_string(int(100 * kUsableMemoryShare + 0.5)) + "% limit"
                                      : "does not fit by " + format_bytes(r.memory - device);
      std::snprintf(buf, sizeof buf, "       %-66s %10s %9s  %s\n", layout_name(r).c_str(), format_bytes(r.memory).c_str(),
                    ms(r.step_s).c_str(), why.c_str());
      out += buf;
    }
  }
  return out;
}

}  // namespace trainer
