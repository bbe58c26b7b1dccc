#include "app/calibrate_command.h"

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>

#include "calibrate/calibration_report.h"
#include "calibrate/link_groups.h"
#include "calibrate/link_timing.h"
#include "calibrate/matmul_timing.h"
#include "comm/launch.h"
#include "core/cuda_backend.h"
#include "interop/hf_import.h"
#include "kernels/cpu/blas_info.h"
#include "observe/placement_report.h"
#include "runtime/device_select.h"
#include "runtime/distributed_run.h"

namespace trainer {

namespace {

// How much is measured, from the options.
struct Plan {
  LinkTimingOptions links;
  MatmulTimingOptions matmuls;
  int max_mib = 64;
};

Plan plan_of(const CalibrateOptions& o) {
  Plan p;
  if (o.max_mib < 0) throw ConfigError("--max-mib " + std::to_string(o.max_mib) + ": must be >= 1");
  p.max_mib = o.max_mib > 0 ? o.max_mib : o.quick ? 4 : 64;
  if (o.min_kib < 1 || int64_t(o.min_kib) > (int64_t(p.max_mib) << 10) / 16)
    throw ConfigError("--min-kib " + std::to_string(o.min_kib) + ": must be >= 1 and leave three sizes up to --max-mib " +
                      std::to_string(p.max_mib) + " (at most " + std::to_string((p.max_mib << 10) / 16) + ")");
  p.links.sizes = calibration_sizes(int64_t(o.min_kib) << 10, int64_t(p.max_mib) << 20);
  p.links.warmup = o.quick ? 1 : 2;
  p.links.repetitions = o.quick ? 3 : 7;
  p.matmuls.warmup = 1;
  p.matmuls.repetitions = o.quick ? 3 : 7;
  p.matmuls.budget_s = o.quick ? 0.5 : 3;
  p.matmuls.min_s = o.quick ? 0.05 : 0.3;
  return p;
}

// /proc/meminfo's value of `key` ("MemAvailable:") in bytes; 0 when unknown.
double meminfo_bytes(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string k;
  double kib = 0;
  while (in >> k >> kib) {
    if (k == key) return kib * 1024;
    in.ignore(1 << 10, '\n');
  }
  return 0;
}

// Every rank checks that its buffers fit; all stop together if one does not
// (a rank that went on would wait in the first collective for the others).
void check_memory(const Plan& p, bool any_link, const std::vector<LinearShape>& shapes, DType storage,
                  const DeviceChoice& dev, int ranks_here, Communicator& host) {
  const double links = any_link ? double(link_buffer_bytes(p.links)) : 0;
  const double matmuls = double(linear_buffer_bytes(shapes, storage));
  const double have = dev.device == Device::CUDA ? double(dev.memory_bytes) * 0.9
                                                 : meminfo_bytes("MemAvailable:") / std::max(1, ranks_here);
  double short_of = have > 0 && links + matmuls > have ? 1 : 0;
  host.all_reduce(Tensor(&short_of, DType::F64, {1}, Device::CPU), ReduceOp::Max);
  if (short_of == 0) return;
  const double mib = 1 << 20;
  char b[512];
  std::snprintf(b, sizeof b,
                "calibrate: the buffers do not fit in memory: links up to --max-mib %d need %.0f MiB per rank, the "
                "model's largest linear %.0f MiB, and a rank has about %.0f MiB (%s); lower --max-mib, or "
                "train.micro_batch_size for the matmuls",
                p.max_mib, links / mib, matmuls / mib, have / mib,
                dev.device == Device::CUDA ? "90% of the device" : "the host's available memory / its ranks");
  throw ConfigError(have > 0 && links + matmuls > have ? b : "calibrate: another rank has too little memory for --max-mib " +
                                                               std::to_string(p.max_mib) + " (its error says how much)");
}

// The measured links, every rank taking part in every one.
void time_links(DistributedRun& dist, const std::vector<LinkGroup>& links, Device device, const Plan& p,
                Calibration& c, int rank) {
  for (const LinkGroup& link : links) {
    if (rank == 0) {
      std::string others;
      for (size_t g = 1; g < link.concurrent.size(); ++g) others.append(" and ").append(format_rank_list(link.concurrent[g]));
      std::printf("calibrate: timing %s (ranks %s%s): all_reduce, all_gather, reduce_scatter, send/recv at %zu "
                  "sizes\n", link.label.c_str(), format_rank_list(link.members).c_str(),
                  others.empty() ? "" : (others + " at the same time").c_str(), p.links.sizes.size());
    }
    std::fflush(stdout);
    // Each group is made collectively in turn; a rank keeps the one it is in.
    std::unique_ptr<Communicator> group;
    const std::string base = link.across_nodes ? "calib_across" : "calib_inside";
    for (size_t g = 0; g < link.concurrent.size(); ++g) {
      std::string name = base;
      if (g > 0) name.append(1, '_').append(std::to_string(g));
      if (auto made = dist.groups()->subgroup(name, link.concurrent[g])) group = std::move(made);
    }
    for (CollectiveTimes& t : time_link(group.get(), dist.host(), link, device, p.links, dist.watchdog())) {
      c.links.push_back(std::move(t));
      c.link_labels.push_back(link.label);
    }
  }
}

// This rank's matmul rate, and every rank's in c.
void time_matmuls(DistributedRun& dist, const std::vector<LinearShape>& shapes, const DeviceChoice& dev,
                  DType storage, const Plan& p, Calibration& c) {
  int64_t step = 0;
  for (const LinearShape& s : shapes) {
    // The ranks compute at once, as in a step, shape by shape: none waits
    // for the others longer than one shape.
    if (Watchdog* wd = dist.watchdog()) wd->progress(++step, "calibrate: matmuls");
    dist.host().barrier();
    for (MatmulTiming& m : time_linears({s}, dev.device, storage, p.matmuls)) c.matmuls.push_back(m);
  }
  double mine = model_matmul_rate(c.matmuls);
  c.rank_flop_per_s.assign(size_t(dist.host().size()), 0);
  dist.host().all_gather(Tensor(c.rank_flop_per_s.data(), DType::F64, {int64_t(c.rank_flop_per_s.size())}, Device::CPU),
                         Tensor(&mine, DType::F64, {1}, Device::CPU));
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char b[64];
  std::strftime(b, sizeof b, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&t));
  return b;
}

void describe_device(const DeviceChoice& dev, DType storage, Calibration& c) {
  c.storage = storage == DType::BF16 ? "bf16" : storage == DType::F16 ? "fp16" : "fp32";
  if (dev.device == Device::CUDA) {
    c.device = cuda_backend(nullptr)->device_info(dev.index).name;
    c.gpu = gpu_of_device_line(c.device);
    c.memory_gib = double(dev.memory_bytes) / double(1ull << 30);
  } else {
    c.device = "cpu";
    c.memory_gib = meminfo_bytes("MemTotal:") / double(1ull << 30);
  }
}

void write_file(const std::string& path, const std::string& text) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  if (target.has_parent_path()) fs::create_directories(target.parent_path());
  const std::string tmp = path + ".partial";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    if (!f.flush()) throw std::runtime_error("calibrate: cannot write " + tmp);
  }
  fs::rename(tmp, target);
}

std::string size_text(int64_t b) {
  return b >= (1 << 20) ? std::to_string(b >> 20) + " MiB" : std::to_string(b >> 10) + " KiB";
}

// Rank 0: the section and its tables, to the file and stdout.
void write_report(const Config& cfg, const DeviceChoice& dev, DType storage, const Plan& p, const CalibrateOptions& o,
                  Calibration& c) {
  c.when = utc_now();
  c.config = cfg.source;
  c.gpus_per_node = ranks_on_first_node(c.host_of_rank);
  describe_device(dev, storage, c);
  c.sizes = size_text(p.links.sizes.front()) + " .. " + size_text(p.links.sizes.back()) +
            " by factors of 4, the median of " + std::to_string(p.links.repetitions) + " calls (" +
            std::to_string(4 * p.links.repetitions) + " up to 256 KiB) after " + std::to_string(p.links.warmup) +
            " warm-up calls, a barrier before each";
  const CalibrationReport r = make_calibration_report(c);
  const std::string out = o.out.empty() ? cfg.run_dir() + "/hardware.yaml" : o.out;
  write_file(out, r.yaml);
  std::printf("%scalibrate: wrote %s (a run or `trainer plan` reads it with hardware.calibration: %s)\n",
              r.yaml.c_str(), out.c_str(), out.c_str());
}

}  // namespace

int run_calibrate(const std::string& config_path, const std::vector<std::string>& overrides, const CalibrateOptions& o) {
  const Plan p = plan_of(o);
  const LaunchInfo launch = detect_launch();
  const Config cfg = load_config_file(config_path, overrides, launch.world_size,
                                      [](Config& c) { adopt_init_from_settings(c); });
  const DeviceChoice dev = select_device(cfg.train.device, launch.local_rank);
  const DType storage = storage_dtype(cfg.train.precision, dev.device);
  if (cfg.train.threads > 0) cpu::set_cpu_threads(cfg.train.threads);
  if (launch.rank == 0) std::printf("config: %s\n%s\n%s\n", cfg.source.c_str(), launch.describe().c_str(), dev.line.c_str());
  DistributedRun dist(cfg, launch, dev.device);
  Calibration c;
  c.host_of_rank = gather_rank_places(dist.host(), launch.local_rank).host;
  const std::vector<LinkGroup> links = link_groups(c.host_of_rank, &c.notes);
  const std::vector<LinearShape> shapes = model_linears(cfg);
  check_memory(p, !links.empty(), shapes, storage, dev, launch.local_world_size, dist.host());
  try {
    time_links(dist, links, dev.device, p, c, launch.rank);
    time_matmuls(dist, shapes, dev, storage, p, c);
  } catch (...) {
    if (Watchdog* wd = dist.watchdog()) wd->rethrow_failure();
    throw;
  }
  if (launch.rank == 0) write_report(cfg, dev, storage, p, o, c);
  dist.finish();
  return 0;
}

}  // namespace trainer
