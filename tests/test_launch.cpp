// Launcher detection against fake environments: what torchrun, OpenMPI and
// Slurm really set, the precedence when launchers nest, Slurm's compressed
// host and task lists, and an error naming the variable for every bad value.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "comm/launch.h"

using namespace trainer;

namespace {

using Vars = std::map<std::string, std::string>;

LaunchInfo detect(const Vars& vars) {
  return detect_launch([&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::string error_of(const Vars& vars) {
  try {
    detect(vars);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "<no error>";
}

std::string hostlist_error(const std::string& list) {
  try {
    expand_hostlist(list);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "<no error>";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

Vars merged(Vars a, const Vars& b) {
  for (const auto& [k, v] : b) a[k] = v;
  return a;
}

const Vars kTorchrun = {{"RANK", "3"},
                        {"WORLD_SIZE", "8"},
                        {"LOCAL_RANK", "3"},
                        {"LOCAL_WORLD_SIZE", "4"},
                        {"MASTER_ADDR", "node01"},
                        {"MASTER_PORT", "29500"},
                        {"TORCHELASTIC_RESTART_COUNT", "0"},
                        {"TORCHELASTIC_RUN_ID", "job-17"},
                        {"GROUP_RANK", "0"}};

const Vars kOpenMpi = {{"OMPI_COMM_WORLD_RANK", "2"},
                       {"OMPI_COMM_WORLD_SIZE", "4"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                       {"OMPI_MCA_ess_base_jobid", "3197698049"}};

const Vars kSlurm = {{"SLURM_PROCID", "5"},
                     {"SLURM_NTASKS", "8"},
                     {"SLURM_LOCALID", "1"},
                     {"SLURM_NODEID", "1"},
                     {"SLURM_TASKS_PER_NODE", "4(x2)"},
                     {"SLURM_JOB_NODELIST", "gpu[07-08]"},
                     {"SLURM_JOB_ID", "123456"}};

}  // namespace

TEST_CASE("no launcher variables: a single process", "[launch]") {
  const LaunchInfo li = detect({{"HOME", "/root"}, {"RANK", ""}});  // empty counts as unset
  CHECK(li.launcher == "single");
  CHECK(li.rank == 0);
  CHECK(li.world_size == 1);
  CHECK(li.local_rank == 0);
  CHECK(li.local_world_size == 1);
  CHECK(li.master_addr == "127.0.0.1");
  CHECK(li.master_port == 0);
  CHECK(li.restart_count == 0);
  CHECK(contains(li.describe(), "single"));
}

TEST_CASE("torchrun variables", "[launch]") {
  const LaunchInfo li = detect(kTorchrun);
  CHECK(li.launcher == "torchrun");
  CHECK(li.rank == 3);
  CHECK(li.world_size == 8);
  CHECK(li.local_rank == 3);
  CHECK(li.local_world_size == 4);
  CHECK(li.master_addr == "node01");
  CHECK(li.master_port == 29500);
  CHECK(li.run_id == "job-17");
  CHECK(li.describe() == "launcher: torchrun, rank 3 of 8 (local 3 of 4), master node01:29500, restart 0");

  const LaunchInfo restarted = detect(merged(kTorchrun, {{"TORCHELASTIC_RESTART_COUNT", "2"}}));
  CHECK(restarted.restart_count == 2);
  CHECK(contains(restarted.describe(), "restart 2"));

  const LaunchInfo v6 = detect(merged(kTorchrun, {{"MASTER_ADDR", "fe80::1"}}));
  CHECK(contains(v6.describe(), "master [fe80::1]:29500"));
}

TEST_CASE("the store's port under torchrun follows who holds MASTER_PORT", "[launch]") {
  // Static rendezvous: the agent's own store is at MASTER_PORT.
  CHECK(detect(merged(kTorchrun, {{"TORCHELASTIC_USE_AGENT_STORE", "True"}})).store_port() == 29501);
  // Variables set by hand say nothing about an agent: keep clear of MASTER_PORT.
  CHECK(detect(kTorchrun).store_port() == 29501);
  // c10d/etcd: the agent found MASTER_PORT free for the workers; its neighbour
  // may be anyone's, so the store takes MASTER_PORT itself.
  CHECK(detect(merged(kTorchrun, {{"TORCHELASTIC_USE_AGENT_STORE", "False"}})).store_port() == 29500);
  CHECK(detect(merged(kTorchrun, {{"MASTER_PORT", "65535"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}})).store_port() ==
        65535);
  // Other launchers never run a store of their own there.
  CHECK(detect(merged(kOpenMpi, {{"MASTER_PORT", "4242"}})).store_port() == 4242);
  CHECK(detect(kSlurm).store_port() == detect(kSlurm).master_port);
}

TEST_CASE("torchrun wins over the Slurm and OpenMPI variables it inherits", "[launch]") {
  // torchrun started by srun inside an sbatch job: SLURM_PROCID is the
  // torchrun agent's, RANK is this worker's.
  CHECK(detect(merged(kSlurm, kTorchrun)).launcher == "torchrun");
  CHECK(detect(merged(kSlurm, kTorchrun)).rank == 3);
  CHECK(detect(merged(kOpenMpi, kTorchrun)).launcher == "torchrun");
  // mpirun inside an sbatch allocation: the OMPI ranks are the real ones.
  const LaunchInfo mpi = detect(merged(kSlurm, kOpenMpi));
  CHECK(mpi.launcher == "mpirun");
  CHECK(mpi.rank == 2);
  CHECK(mpi.world_size == 4);
}

TEST_CASE("hand-made env:// launch without LOCAL_* (one process per container)", "[launch]") {
  const LaunchInfo li =
      detect({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.5"}, {"MASTER_PORT", "1234"}});
  CHECK(li.launcher == "torchrun");
  CHECK(li.local_rank == 0);
  CHECK(li.local_world_size == 1);
  CHECK(li.master_addr == "10.0.0.5");
  CHECK(li.master_port == 1234);

  // One process needs no store: no address or port required.
  const LaunchInfo one = detect({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  CHECK(one.master_addr == "127.0.0.1");
  CHECK(one.master_port == 0);
}

TEST_CASE("torchrun errors name the variable and its value", "[launch]") {
  struct Case {
    Vars vars;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {merged(kTorchrun, {{"RANK", "8"}}), {"RANK=8", "WORLD_SIZE=8", "less than"}},
      {merged(kTorchrun, {{"RANK", "abc"}}), {"RANK='abc' is not an integer"}},
      {merged(kTorchrun, {{"RANK", "3x"}}), {"RANK='3x'"}},
      {merged(kTorchrun, {{"RANK", "-1"}}), {"RANK=-1", "out of range"}},
      {merged(kTorchrun, {{"WORLD_SIZE", "0"}}), {"WORLD_SIZE=0", "out of range"}},
      {merged(kTorchrun, {{"WORLD_SIZE", "eight"}}), {"WORLD_SIZE='eight'"}},
      {merged(kTorchrun, {{"LOCAL_RANK", "4"}}), {"LOCAL_RANK=4", "LOCAL_WORLD_SIZE=4"}},
      {merged(kTorchrun, {{"LOCAL_WORLD_SIZE", "16"}}), {"LOCAL_WORLD_SIZE=16", "WORLD_SIZE=8"}},
      {merged(kTorchrun, {{"MASTER_PORT", "70000"}}), {"MASTER_PORT=70000", "out of range"}},
      {merged(kTorchrun, {{"MASTER_PORT", "0"}}), {"MASTER_PORT=0"}},
      {merged(kTorchrun, {{"TORCHELASTIC_RESTART_COUNT", "x"}}), {"TORCHELASTIC_RESTART_COUNT='x'"}},
      {{{"RANK", "0"}}, {"WORLD_SIZE is not set"}},
      {{{"WORLD_SIZE", "2"}}, {"RANK is not set"}},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}, {"MASTER_ADDR is not set"}},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}, {"MASTER_PORT is not set"}},
      {{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"}}, {"LOCAL_WORLD_SIZE is not"}},
  };
  for (const Case& c : cases) {
    const std::string msg = error_of(c.vars);
    INFO(msg);
    CHECK(contains(msg, "torchrun"));
    for (const auto& part : c.parts) CHECK(contains(msg, part));
  }
}

TEST_CASE("OpenMPI on one node", "[launch]") {
  const LaunchInfo li = detect(kOpenMpi);
  CHECK(li.launcher == "mpirun");
  CHECK(li.rank == 2);
  CHECK(li.world_size == 4);
  CHECK(li.local_rank == 2);
  CHECK(li.local_world_size == 4);
  CHECK(li.master_addr == "127.0.0.1");
  CHECK(li.master_port >= 20000);
  CHECK(li.master_port < 60000);
  CHECK(li.master_port == port_from_job_id("3197698049"));
  CHECK(li.run_id == "3197698049");
  // Every rank of the job derives the same port without talking.
  const LaunchInfo rank0 =
      detect(merged(kOpenMpi, {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}}));
  CHECK(rank0.master_port == li.master_port);

  CHECK(detect(merged(kOpenMpi, {{"MASTER_PORT", "4242"}})).master_port == 4242);
  CHECK(detect(merged(kOpenMpi, {{"MASTER_ADDR", "head"}})).master_addr == "head");

  // OpenMPI 5 names the job only in PMIX_NAMESPACE.
  Vars ompi5 = kOpenMpi;
  ompi5.erase("OMPI_MCA_ess_base_jobid");
  ompi5["PMIX_NAMESPACE"] = "prterun-login1-81234@1";
  const LaunchInfo li5 = detect(ompi5);
  CHECK(li5.master_port == port_from_job_id("prterun-login1-81234@1"));
  CHECK(li5.master_port >= 20000);
  CHECK(li5.master_port < 60000);
  Vars old = kOpenMpi;
  old.erase("OMPI_MCA_ess_base_jobid");
  old["OMPI_MCA_orte_ess_jobid"] = "12345";
  CHECK(detect(old).master_port == 20000 + 12345);
  old.erase("OMPI_MCA_orte_ess_jobid");
  CHECK(detect(old).master_port == 29500);
}

TEST_CASE("OpenMPI across nodes needs MASTER_ADDR", "[launch]") {
  const Vars two_nodes = merged(kOpenMpi, {{"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_RANK", "6"}});
  const std::string msg = error_of(two_nodes);
  INFO(msg);
  CHECK(contains(msg, "MASTER_ADDR is not set"));
  CHECK(contains(msg, "mpirun -x MASTER_ADDR="));
  CHECK(contains(msg, "OMPI_COMM_WORLD_LOCAL_SIZE=4"));
  CHECK(contains(msg, "OMPI_COMM_WORLD_SIZE=8"));

  const LaunchInfo li = detect(merged(two_nodes, {{"MASTER_ADDR", "node01"}}));
  CHECK(li.master_addr == "node01");
  CHECK(li.rank == 6);

  CHECK(contains(error_of(merged(kOpenMpi, {{"OMPI_COMM_WORLD_RANK", "4"}})), "OMPI_COMM_WORLD_RANK=4"));
  CHECK(contains(error_of(merged(kOpenMpi, {{"OMPI_COMM_WORLD_LOCAL_SIZE", "two"}})),
                 "OMPI_COMM_WORLD_LOCAL_SIZE='two'"));
  Vars no_local = kOpenMpi;
  no_local.erase("OMPI_COMM_WORLD_LOCAL_RANK");
  CHECK(contains(error_of(no_local), "OMPI_COMM_WORLD_LOCAL_RANK is not set"));
}

TEST_CASE("Slurm srun variables", "[launch]") {
  const LaunchInfo li = detect(kSlurm);
  CHECK(li.launcher == "srun");
  CHECK(li.rank == 5);
  CHECK(li.world_size == 8);
  CHECK(li.local_rank == 1);
  CHECK(li.local_world_size == 4);
  CHECK(li.master_addr == "gpu07");
  CHECK(li.master_port == 20000 + 123456 % 40000);
  CHECK(li.run_id == "123456");
  CHECK(li.describe() == "launcher: srun, rank 5 of 8 (local 1 of 4), master gpu07:23456, restart 0");

  // The step's own values win over the allocation's (srun -n4 -N1 inside a
  // two-node allocation).
  const LaunchInfo step = detect(merged(kSlurm, {{"SLURM_PROCID", "2"},
                                                 {"SLURM_STEP_NUM_TASKS", "4"},
                                                 {"SLURM_NODEID", "0"},
                                                 {"SLURM_LOCALID", "2"},
                                                 {"SLURM_STEP_TASKS_PER_NODE", "4"},
                                                 {"SLURM_STEP_NODELIST", "gpu08"},
                                                 {"SLURM_STEP_ID", "3"}}));
  CHECK(step.world_size == 4);
  CHECK(step.local_world_size == 4);
  CHECK(step.master_addr == "gpu08");
  CHECK(step.run_id == "123456.3");

  // Uneven nodes: this node's share from its SLURM_NODEID.
  const LaunchInfo uneven = detect(merged(kSlurm, {{"SLURM_NTASKS", "11"},
                                                   {"SLURM_PROCID", "9"},
                                                   {"SLURM_NODEID", "2"},
                                                   {"SLURM_TASKS_PER_NODE", "4(x2),3"},
                                                   {"SLURM_JOB_NODELIST", "node[01-02,07]"}}));
  CHECK(uneven.local_world_size == 3);
  CHECK(uneven.master_addr == "node01");

  Vars per_node = kSlurm;
  per_node.erase("SLURM_TASKS_PER_NODE");
  per_node.emplace("SLURM_NTASKS_PER_NODE", "4");
  CHECK(detect(per_node).local_world_size == 4);

  const LaunchInfo overridden =
      detect(merged(kSlurm, {{"MASTER_ADDR", "gpu07-ib"}, {"MASTER_PORT", "29400"}, {"SLURM_RESTART_COUNT", "1"}}));
  CHECK(overridden.master_addr == "gpu07-ib");
  CHECK(overridden.master_port == 29400);
  CHECK(overridden.restart_count == 1);

  Vars no_job = kSlurm;
  no_job.erase("SLURM_JOB_ID");
  CHECK(detect(no_job).master_port == 29500);
}

TEST_CASE("Slurm errors name the variable and its value", "[launch]") {
  struct Case {
    Vars vars;
    std::vector<std::string> parts;
  };
  Vars no_ntasks = kSlurm;
  no_ntasks.erase("SLURM_NTASKS");
  Vars no_layout = kSlurm;
  no_layout.erase("SLURM_TASKS_PER_NODE");
  Vars no_nodeid = merged(kSlurm, {{"SLURM_TASKS_PER_NODE", "4,3"}, {"SLURM_NTASKS", "7"}});
  no_nodeid.erase("SLURM_NODEID");
  const std::vector<Case> cases = {
      {merged(kSlurm, {{"SLURM_PROCID", "8"}}), {"SLURM_PROCID=8", "SLURM_NTASKS=8"}},
      {merged(kSlurm, {{"SLURM_PROCID", "five"}}), {"SLURM_PROCID='five'"}},
      {merged(kSlurm, {{"SLURM_LOCALID", "4"}}), {"SLURM_LOCALID=4", "SLURM_TASKS_PER_NODE"}},
      {merged(kSlurm, {{"SLURM_NODEID", "2"}}), {"SLURM_NODEID=2", "4(x2)"}},
      {merged(kSlurm, {{"SLURM_TASKS_PER_NODE", "4(2)"}}), {"SLURM_TASKS_PER_NODE", "4(2)"}},
      {merged(kSlurm, {{"SLURM_JOB_NODELIST", "gpu[07-"}}), {"SLURM_JOB_NODELIST", "gpu[07-"}},
      {merged(kSlurm, {{"SLURM_STEP_NUM_TASKS", "4"}}), {"SLURM_PROCID=5", "SLURM_STEP_NUM_TASKS=4"}},
      {no_ntasks, {"SLURM_NTASKS"}},
      {no_layout, {"SLURM_TASKS_PER_NODE"}},
      {no_nodeid, {"SLURM_NODEID is not set", "4,3"}},
  };
  for (const Case& c : cases) {
    const std::string msg = error_of(c.vars);
    INFO(msg);
    CHECK(contains(msg, "srun"));
    for (const auto& part : c.parts) CHECK(contains(msg, part));
  }
}

TEST_CASE("Slurm compressed host lists", "[launch]") {
  struct Case {
    std::string list;
    std::vector<std::string> hosts;
  };
  const std::vector<Case> cases = {
      {"node01", {"node01"}},
      {"a,b", {"a", "b"}},
      {"node[01-04,07],gpu-a[1-2]", {"node01", "node02", "node03", "node04", "node07", "gpu-a1", "gpu-a2"}},
      {"n[1-3]-ib", {"n1-ib", "n2-ib", "n3-ib"}},
      {"n[8-11]", {"n8", "n9", "n10", "n11"}},
      {"n[08-11]", {"n08", "n09", "n10", "n11"}},
      {"n[098-101]", {"n098", "n099", "n100", "n101"}},
      {"n[0001-0002,0010]", {"n0001", "n0002", "n0010"}},
      {"rack[1-2]-n[01-02]", {"rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"}},
      {"x[0-1]y[00-01]z", {"x0y00z", "x0y01z", "x1y00z", "x1y01z"}},
      {"c1-[2-3]", {"c1-2", "c1-3"}},
      {"node[1,3,5]", {"node1", "node3", "node5"}},
      {"host.example.com,10.0.0.[1-2]", {"host.example.com", "10.0.0.1", "10.0.0.2"}},
      {"a[3],b[0009-0010]", {"a3", "b0009", "b0010"}},
      {"[1-2]", {"1", "2"}},
      {"gpu-a[5]-ib0,gpu-b", {"gpu-a5-ib0", "gpu-b"}},
  };
  for (const Case& c : cases) {
    INFO(c.list);
    CHECK(expand_hostlist(c.list) == c.hosts);
    CHECK(first_host(c.list) == c.hosts.front());
  }
  CHECK(expand_hostlist("n[0000-9999]").size() == 10000);
  CHECK(first_host("n[000000-999999999]") == "n000000");  // never expanded

  for (const std::string bad : {"", "node[", "node]", "node[1-]", "node[3-1]", "node[a-b]", "a,,b", "a,", ",a",
                                "node[]", "n[1-[2]]", "n 1", "n[1,]", "n[1-2-3]"}) {
    const std::string msg = hostlist_error(bad);
    INFO(bad << " -> " << msg);
    CHECK(contains(msg, "host list '" + bad + "'"));
    CHECK_THROWS_AS(first_host(bad), std::runtime_error);
  }
  CHECK(contains(hostlist_error("n[0-9999999]"), "more than"));
}

TEST_CASE("Slurm tasks per node", "[launch]") {
  CHECK(parse_tasks_per_node("4") == std::vector<int>{4});
  CHECK(parse_tasks_per_node("4(x2),3") == std::vector<int>{4, 4, 3});
  CHECK(parse_tasks_per_node("2(x3)") == std::vector<int>{2, 2, 2});
  CHECK(parse_tasks_per_node("1,2,3") == std::vector<int>{1, 2, 3});
  CHECK(parse_tasks_per_node("8(x1),1(x2)") == std::vector<int>{8, 1, 1});
  for (const std::string bad : {"", "4(x)", "4(2)", "x", "4(x2", "0", "4,", "4(x0)", "-1", "4(x2)3"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_tasks_per_node(bad), std::runtime_error);
  }
}

TEST_CASE("ports derived from job ids", "[launch]") {
  CHECK(port_from_job_id("123456") == 23456);
  CHECK(port_from_job_id("0") == 20000);
  CHECK(port_from_job_id("39999") == 59999);
  CHECK(port_from_job_id("40000") == 20000);
  for (const std::string id : {"abc", "prterun-x-1@1", "", "-5", "99999999999999999999999"}) {
    const int p = port_from_job_id(id);
    CHECK(p >= 20000);
    CHECK(p < 60000);
    CHECK(p == port_from_job_id(id));
  }
  CHECK(port_from_job_id("job-a") != port_from_job_id("job-b"));
}
