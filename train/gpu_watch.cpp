#include "train/gpu_watch.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "train/session.h"

namespace trainer {

void open_gpu_watch(Session& s) {
  const char* standin = std::getenv("TRAINER_NVML_LIBRARY");
  if (s.dev.device != Device::CUDA && !(standin && *standin)) {
    if (s.lead && !s.opt.quiet) std::printf("nvml: not read (a CPU run has no GPU to watch)\n");
    return;
  }
  std::string why;
  const int device = s.opt.launch.local_rank;
  s.nvml = NvmlReader::open(device, &why);
  if (!s.nvml) {
    if (s.lead) std::printf("nvml: not read: %s (no GPU clock, temperature, power or ECC reports)\n", why.c_str());
    return;
  }
  s.ecc_seen = s.nvml->ecc_uncorrected();
  if (s.ecc_seen > 0)
    std::fprintf(stderr, "nvml: rank %d's GPU %d has had %llu uncorrected ECC errors since the driver loaded\n",
                 s.opt.launch.rank, device, (unsigned long long)s.ecc_seen);
  if (s.lead && !s.opt.quiet)
    std::printf("nvml: %s, each rank's GPU (its local rank's): SM clock, temperature, power, throttle reasons, "
                "memory and ECC every log interval into ranks.jsonl; uncorrected ECC errors checked every step\n",
                s.nvml->library().c_str());
}

void check_gpu_errors(Session& s, int64_t step) {
  if (!s.nvml) return;
  const uint64_t now = s.nvml->ecc_uncorrected();
  if (now <= s.ecc_seen) return;
  const std::string host =
      size_t(s.opt.launch.rank) < s.places.host.size() ? s.places.host[size_t(s.opt.launch.rank)] : "?";
  // stderr and at once: every rank but 0 is quiet, and this cannot wait for the next log line.
  std::fprintf(stderr,
               "nvml: rank %d on %s: its GPU %d reports %llu new uncorrected ECC error%s after step %lld (%llu since "
               "the driver loaded): its memory returned wrong values; the replica check (train.replica_check_interval) "
               "and a rollback or a restart without this node are the remedies\n",
               s.opt.launch.rank, host.c_str(), s.opt.launch.local_rank, (unsigned long long)(now - s.ecc_seen),
               now - s.ecc_seen > 1 ? "s" : "", (long long)step, (unsigned long long)now);
  s.ecc_seen = now;
}

}  // namespace trainer
