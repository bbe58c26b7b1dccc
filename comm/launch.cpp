// Launcher detection. Every value that reaches LaunchInfo is checked here, at
// start-up, with the variable named: a wrong rank found later shows up as a
// hang in the first collective, which is far harder to trace back.
#include "comm/launch.h"

#include "core/fnv1a.h"

#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <utility>

namespace trainer {

namespace {

constexpr int kDefaultPort = 29500;  // torchrun's default, for launchers without a job id
constexpr size_t kMaxHosts = 1'000'000;

std::optional<int64_t> parse_int(std::string_view s) {
  if (s.empty()) return std::nullopt;
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// The environment of one launcher: lookups that name the variable (and the
// launcher) in every error.
class Env {
 public:
  Env(const GetEnv& getenv, std::string launcher) : getenv_(getenv), launcher_(std::move(launcher)) {}

  [[noreturn]] void fail(const std::string& msg) const {
    throw std::runtime_error("launch (" + launcher_ + "): " + msg);
  }

  std::optional<std::string> get(const char* name) const {
    const char* v = getenv_(name);
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
  }
  bool has(const char* name) const { return get(name).has_value(); }

  std::string require(const char* name, const std::string& why) const {
    auto v = get(name);
    if (!v) fail(std::string(name) + " is not set" + (why.empty() ? "" : " (" + why + ")"));
    return *v;
  }

  int to_int(const char* name, const std::string& value, int64_t lo, int64_t hi) const {
    auto v = parse_int(value);
    if (!v) fail(std::string(name) + "='" + value + "' is not an integer");
    if (*v < lo || *v > hi)
      fail(std::string(name) + "=" + value + " is out of range (" + std::to_string(lo) + " .. " +
           std::to_string(hi) + ")");
    return int(*v);
  }
  std::optional<int> get_int(const char* name, int64_t lo, int64_t hi) const {
    auto v = get(name);
    if (!v) return std::nullopt;
    return to_int(name, *v, lo, hi);
  }
  int require_int(const char* name, int64_t lo, int64_t hi, const std::string& why = "") const {
    return to_int(name, require(name, why), lo, hi);
  }

  // The first of `names` that is set, with its name.
  std::optional<std::pair<const char*, std::string>> first_of(std::initializer_list<const char*> names) const {
    for (const char* n : names)
      if (auto v = get(n)) return std::make_pair(n, *v);
    return std::nullopt;
  }

 private:
  const GetEnv& getenv_;
  std::string launcher_;
};

constexpr int64_t kIntMax = 1 << 30;

std::string kv(const std::string& name, int64_t v) { return name + "=" + std::to_string(v); }

void check_ranks(const Env& env, const LaunchInfo& li, const std::string& rank_var, const std::string& world_var,
                 const std::string& local_rank_var, const std::string& local_world_var) {
  if (li.rank >= li.world_size)
    env.fail(kv(rank_var, li.rank) + " must be less than " + kv(world_var, li.world_size));
  if (li.local_rank >= li.local_world_size)
    env.fail(kv(local_rank_var, li.local_rank) + " must be less than " + kv(local_world_var, li.local_world_size));
  if (li.local_world_size > li.world_size)
    env.fail(kv(local_world_var, li.local_world_size) + " exceeds " + kv(world_var, li.world_size));
}

int master_port(const Env& env, int world_size, std::optional<std::pair<const char*, std::string>> job_id) {
  // Port 0 would mean "any free port", which the other ranks could not guess.
  if (auto p = env.get_int("MASTER_PORT", world_size > 1 ? 1 : 0, 65535)) return *p;
  if (world_size == 1) return 0;
  if (job_id) return port_from_job_id(job_id->second);
  return kDefaultPort;
}

LaunchInfo detect_torchrun(const GetEnv& getenv) {
  Env env(getenv, "torchrun");
  LaunchInfo li;
  li.launcher = "torchrun";
  const std::string by_hand = "torchrun sets it; when launching by hand export RANK, WORLD_SIZE, "
                              "MASTER_ADDR and MASTER_PORT together";
  li.world_size = env.require_int("WORLD_SIZE", 1, kIntMax, by_hand);
  li.rank = env.require_int("RANK", 0, kIntMax, by_hand);
  // One process per container (Kubeflow's PyTorchJob) sets no LOCAL_*: that
  // process is alone on its node. A LOCAL_RANK without its size, though,
  // leaves the node layout unknown, and guessing it would put two ranks on
  // one GPU.
  auto local_rank = env.get_int("LOCAL_RANK", 0, kIntMax);
  auto local_world = env.get_int("LOCAL_WORLD_SIZE", 1, kIntMax);
  if (local_rank && !local_world)
    env.fail("LOCAL_RANK=" + std::to_string(*local_rank) + " is set but LOCAL_WORLD_SIZE is not");
  if (local_world && !local_rank)
    env.fail("LOCAL_WORLD_SIZE=" + std::to_string(*local_world) + " is set but LOCAL_RANK is not");
  li.local_rank = local_rank.value_or(0);
  li.local_world_size = local_world.value_or(1);
  check_ranks(env, li, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");

  if (li.world_size > 1) {
    li.master_addr = env.require("MASTER_ADDR", by_hand);
    li.master_port = env.require_int("MASTER_PORT", 1, 65535, by_hand);
  } else {
    li.master_addr = env.get("MASTER_ADDR").value_or("127.0.0.1");
    li.master_port = env.get_int("MASTER_PORT", 0, 65535).value_or(0);
  }
  li.restart_count = env.get_int("TORCHELASTIC_RESTART_COUNT", 0, kIntMax).value_or(0);
  li.run_id = env.get("TORCHELASTIC_RUN_ID").value_or("");
  // A port torchrun found free moments ago is safer than its neighbour, which
  // any process (a Gloo listener, an outgoing connection) may hold: the
  // ephemeral range is where torchrun draws MASTER_PORT from.
  li.agent_holds_master_port = env.get("TORCHELASTIC_USE_AGENT_STORE").value_or("True") != "False";
  return li;
}

LaunchInfo detect_openmpi(const GetEnv& getenv) {
  Env env(getenv, "mpirun");
  LaunchInfo li;
  li.launcher = "mpirun";
  const std::string always = "OpenMPI's mpirun sets it for every process";
  li.world_size = env.require_int("OMPI_COMM_WORLD_SIZE", 1, kIntMax, always);
  li.rank = env.require_int("OMPI_COMM_WORLD_RANK", 0, kIntMax, always);
  li.local_world_size = env.require_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1, kIntMax, always);
  li.local_rank = env.require_int("OMPI_COMM_WORLD_LOCAL_RANK", 0, kIntMax, always);
  check_ranks(env, li, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
              "OMPI_COMM_WORLD_LOCAL_SIZE");

  // OpenMPI tells a process nothing about where rank 0 runs. On one node that
  // is this node; across nodes only the user knows which address the other
  // nodes can reach.
  if (auto addr = env.get("MASTER_ADDR")) {
    li.master_addr = *addr;
  } else if (li.local_world_size == li.world_size) {
    li.master_addr = "127.0.0.1";
  } else {
    env.fail("MASTER_ADDR is not set and the " + std::to_string(li.world_size) +
             " processes span several nodes (OMPI_COMM_WORLD_LOCAL_SIZE=" + std::to_string(li.local_world_size) +
             " < OMPI_COMM_WORLD_SIZE=" + std::to_string(li.world_size) +
             "); OpenMPI does not say which host runs rank 0: pass it to every process, e.g. "
             "mpirun -x MASTER_ADDR=$(hostname) ... (optionally -x MASTER_PORT=29500)");
  }
  // OpenMPI 4 names the job in OMPI_MCA_ess_base_jobid (older: orte_ess_jobid);
  // OpenMPI 5 (PRRTE) only in PMIX_NAMESPACE.
  auto job = env.first_of({"OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE"});
  li.master_port = master_port(env, li.world_size, job);
  li.run_id = job ? job->second : "";
  return li;
}

// The tasks on this node: the step's own layout first (srun may run fewer
// tasks than the allocation holds), then the allocation's, then the
// --ntasks-per-node request. `source` names where the number came from.
int slurm_local_world(const Env& env, const LaunchInfo& li, std::string& source) {
  auto list = env.first_of({"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"});
  if (list) {
    std::vector<int> counts;
    try {
      counts = parse_tasks_per_node(list->second);
    } catch (const std::exception& e) {
      env.fail(std::string(list->first) + ": " + e.what());
    }
    bool uniform = true;
    for (int c : counts) uniform = uniform && c == counts[0];
    auto node = env.get_int("SLURM_NODEID", 0, kIntMax);
    if (node) {
      if (size_t(*node) >= counts.size())
        env.fail(kv("SLURM_NODEID", *node) + " but " + list->first + "='" + list->second + "' lists " +
                 std::to_string(counts.size()) + " node(s)");
      source = std::string(list->first) + "[node " + std::to_string(*node) + "]";
      return counts[*node];
    }
    source = list->first;
    if (uniform) return counts[0];
    env.fail(std::string(list->first) + "='" + list->second +
             "' differs between nodes and SLURM_NODEID is not set, so this node's share is unknown");
  }
  source = "SLURM_NTASKS_PER_NODE";
  if (auto n = env.get_int("SLURM_NTASKS_PER_NODE", 1, kIntMax)) return *n;
  auto nodes = env.get_int("SLURM_STEP_NUM_NODES", 1, kIntMax);
  if (!nodes) nodes = env.get_int("SLURM_JOB_NUM_NODES", 1, kIntMax);
  source = "tasks on this single node";
  if (nodes && *nodes == 1) return li.world_size;
  env.fail("cannot tell how many tasks run on this node: none of SLURM_STEP_TASKS_PER_NODE, "
           "SLURM_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE is set");
}

LaunchInfo detect_slurm(const GetEnv& getenv) {
  Env env(getenv, "srun");
  LaunchInfo li;
  li.launcher = "srun";
  li.rank = env.require_int("SLURM_PROCID", 0, kIntMax);
  // The step's task count first: an srun inside a larger allocation runs fewer
  // tasks than SLURM_NTASKS says.
  auto world = env.first_of({"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"});
  if (!world) env.fail("SLURM_PROCID is set but none of SLURM_STEP_NUM_TASKS, SLURM_NTASKS, SLURM_NPROCS is");
  li.world_size = env.to_int(world->first, world->second, 1, kIntMax);
  li.local_rank = env.require_int("SLURM_LOCALID", 0, kIntMax, "srun sets it for every task");
  std::string local_source;
  li.local_world_size = slurm_local_world(env, li, local_source);
  check_ranks(env, li, "SLURM_PROCID", world->first, "SLURM_LOCALID", local_source);

  if (auto addr = env.get("MASTER_ADDR")) {
    li.master_addr = *addr;
  } else if (auto nodes = env.first_of({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})) {
    try {
      li.master_addr = first_host(nodes->second);
    } catch (const std::exception& e) {
      env.fail(std::string(nodes->first) + ": " + e.what());
    }
  } else if (li.local_world_size == li.world_size) {
    li.master_addr = "127.0.0.1";
  } else {
    env.fail("no node list (SLURM_STEP_NODELIST, SLURM_JOB_NODELIST) to find rank 0's host; export MASTER_ADDR");
  }

  auto job = env.get("SLURM_JOB_ID");
  if (!job) job = env.get("SLURM_JOBID");
  li.master_port = master_port(env, li.world_size,
                               job ? std::optional(std::make_pair("SLURM_JOB_ID", *job)) : std::nullopt);
  li.run_id = job.value_or("");
  if (job)
    if (auto step = env.get("SLURM_STEP_ID")) li.run_id += "." + *step;
  li.restart_count = env.get_int("SLURM_RESTART_COUNT", 0, kIntMax).value_or(0);
  return li;
}

// --- host lists -------------------------------------------------------------

struct Range {
  int64_t lo, hi;
  int width;  // digits of the lower bound as written: "01" keeps zero padding
};

// One comma-separated element: literal text and bracket groups alternating,
// always starting and ending with a (maybe empty) literal.
struct HostPattern {
  std::vector<std::string> literals;         // size = brackets.size() + 1
  std::vector<std::vector<Range>> brackets;
};

[[noreturn]] void hostlist_error(const std::string& list, const std::string& why) {
  throw std::runtime_error("host list '" + list + "': " + why);
}

std::vector<Range> parse_ranges(const std::string& list, std::string_view body) {
  std::vector<Range> out;
  if (body.empty()) hostlist_error(list, "empty brackets []");
  size_t pos = 0;
  while (pos <= body.size()) {
    size_t comma = body.find(',', pos);
    if (comma == std::string_view::npos) comma = body.size();
    std::string_view item = body.substr(pos, comma - pos);
    size_t dash = item.find('-');
    std::string_view lo_s = item.substr(0, dash);
    std::string_view hi_s = dash == std::string_view::npos ? lo_s : item.substr(dash + 1);
    auto digits = [](std::string_view s) {
      if (s.empty() || s.size() > 18) return false;
      for (char c : s)
        if (c < '0' || c > '9') return false;
      return true;
    };
    if (!digits(lo_s) || !digits(hi_s))
      hostlist_error(list, "'" + std::string(item) + "' inside [] is not a number or a range like 01-04");
    Range r{*parse_int(lo_s), *parse_int(hi_s), int(lo_s.size())};
    if (r.hi < r.lo) hostlist_error(list, "range '" + std::string(item) + "' runs backwards");
    out.push_back(r);
    pos = comma + 1;
  }
  return out;
}

std::vector<HostPattern> parse_hostlist(const std::string& list) {
  std::vector<HostPattern> out;
  HostPattern cur;
  cur.literals.emplace_back();
  auto finish = [&](size_t at) {
    if (cur.brackets.empty() && cur.literals[0].empty())
      hostlist_error(list, "empty host name at offset " + std::to_string(at));
    out.push_back(std::move(cur));
    cur = HostPattern{};
    cur.literals.emplace_back();
  };
  for (size_t i = 0; i < list.size(); ++i) {
    char c = list[i];
    if (c == '[') {
      size_t close = list.find_first_of("[]", i + 1);
      if (close == std::string::npos || list[close] != ']')
        hostlist_error(list, "'[' at offset " + std::to_string(i) + " is not closed by ']'");
      cur.brackets.push_back(parse_ranges(list, std::string_view(list).substr(i + 1, close - i - 1)));
      cur.literals.emplace_back();
      i = close;
    } else if (c == ']') {
      hostlist_error(list, "']' at offset " + std::to_string(i) + " without '['");
    } else if (c == ',') {
      finish(i);
    } else if (c == ' ' || c == '\t' || c == '\n') {
      hostlist_error(list, "white space at offset " + std::to_string(i));
    } else {
      cur.literals.back() += c;
    }
  }
  finish(list.size());
  return out;
}

std::string format_number(int64_t v, int width) {
  std::string s = std::to_string(v);
  if (int(s.size()) < width) s.insert(0, size_t(width) - s.size(), '0');
  return s;
}

// Depth-first over the brackets, leftmost outermost, as Slurm orders them.
void expand_pattern(const HostPattern& p, size_t level, std::string& prefix, std::vector<std::string>& out,
                    const std::string& list) {
  prefix += p.literals[level];
  if (level == p.brackets.size()) {
    if (out.size() >= kMaxHosts) hostlist_error(list, "expands to more than " + std::to_string(kMaxHosts) + " hosts");
    out.push_back(prefix);
  } else {
    const size_t keep = prefix.size();
    for (const Range& r : p.brackets[level])
      for (int64_t v = r.lo; v <= r.hi; ++v) {
        prefix += format_number(v, r.width);
        expand_pattern(p, level + 1, prefix, out, list);
        prefix.resize(keep);
      }
  }
  prefix.resize(prefix.size() - p.literals[level].size());
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& hostlist) {
  std::vector<std::string> out;
  for (const HostPattern& p : parse_hostlist(hostlist)) {
    std::string prefix;
    expand_pattern(p, 0, prefix, out, hostlist);
  }
  return out;
}

std::string first_host(const std::string& hostlist) {
  const auto patterns = parse_hostlist(hostlist);
  const HostPattern& p = patterns.front();
  std::string host = p.literals[0];
  for (size_t i = 0; i < p.brackets.size(); ++i)
    host += format_number(p.brackets[i][0].lo, p.brackets[i][0].width) + p.literals[i + 1];
  return host;
}

std::vector<int> parse_tasks_per_node(const std::string& text) {
  auto bad = [&](const std::string& why) -> std::runtime_error {
    return std::runtime_error("tasks per node '" + text + "': " + why + " (expected a form like 4(x2),3)");
  };
  std::vector<int> out;
  if (text.empty()) throw bad("empty");
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string_view item = std::string_view(text).substr(pos, comma - pos);
    int64_t repeat = 1;
    size_t paren = item.find('(');
    if (paren != std::string_view::npos) {
      if (item.size() < paren + 4 || item.substr(paren, 2) != "(x" || item.back() != ')')
        throw bad("'" + std::string(item) + "' is not COUNT or COUNT(xNODES)");
      auto r = parse_int(item.substr(paren + 2, item.size() - paren - 3));
      if (!r || *r < 1 || *r > int64_t(kMaxHosts)) throw bad("bad node count in '" + std::string(item) + "'");
      repeat = *r;
      item = item.substr(0, paren);
    }
    auto n = parse_int(item);
    if (!n || *n < 1 || *n > kIntMax) throw bad("'" + std::string(item) + "' is not a positive task count");
    if (out.size() + size_t(repeat) > kMaxHosts) throw bad("too many nodes");
    out.insert(out.end(), size_t(repeat), int(*n));
    pos = comma + 1;
  }
  return out;
}

int port_from_job_id(const std::string& job_id) {
  if (auto v = parse_int(job_id); v && *v >= 0) return int(20000 + *v % 40000);
  return int(20000 + fnv1a(job_id) % 40000);
}

std::string LaunchInfo::describe() const {
  if (launcher == "single")
    return "launcher: single process (no torchrun, mpirun or srun environment), rank 0 of 1";
  const bool ipv6 = master_addr.find(':') != std::string::npos;
  const std::string host = ipv6 ? "[" + master_addr + "]" : master_addr;
  return "launcher: " + launcher + ", rank " + std::to_string(rank) + " of " + std::to_string(world_size) +
         " (local " + std::to_string(local_rank) + " of " + std::to_string(local_world_size) + "), master " +
         host + ":" + std::to_string(master_port) + ", restart " + std::to_string(restart_count);
}

LaunchInfo detect_launch(const GetEnv& getenv) {
  auto set = [&](const char* name) {
    const char* v = getenv(name);
    return v != nullptr && *v != '\0';
  };
  if (set("RANK") || set("WORLD_SIZE")) return detect_torchrun(getenv);
  if (set("OMPI_COMM_WORLD_RANK") || set("OMPI_COMM_WORLD_SIZE")) return detect_openmpi(getenv);
  if (set("SLURM_PROCID")) return detect_slurm(getenv);
  return LaunchInfo{};
}

}  // namespace trainer
