// LaunchEnv: rank, size, local rank and rendezvous from fake environments of every launcher
// (MESHCAST_* by hand, torchrun, Slurm, Open MPI), their precedence and partial overrides, Slurm's
// compressed host lists and derived port, and every refusal: one short line naming exactly the
// variable at fault. Then a real rendezvous from torchrun-style variables (threads on 127.0.0.1).
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "meshcast/bootstrap.h"
#include "meshcast/error.h"
#include "support/free_port.h"

namespace meshcast {
namespace {

using testing::free_port;
using Vars = std::map<std::string, std::string>;

LaunchEnv::Getenv fake(const Vars& v) {
  return [&v](const char* name) -> const char* {
    const auto it = v.find(name);
    return it == v.end() ? nullptr : it->second.c_str();
  };
}

std::optional<LaunchEnv> from(const Vars& v) { return LaunchEnv::from(fake(v)); }

LaunchEnv accepted(const Vars& v) {
  const auto e = from(v);
  EXPECT_TRUE(e.has_value());
  return e ? *e : LaunchEnv{};
}

// The field of the ValidationError that `v` gets; its message in *what. "accepted" when none.
std::string refused(const Vars& v, std::string* what = nullptr) {
  try {
    (void)from(v);
  } catch (const ValidationError& e) {
    const std::string w = e.what();
    EXPECT_LT(w.size(), 300u) << w.substr(0, 300);
    EXPECT_EQ(w.find('\n'), std::string::npos) << w;
    if (what) *what = w;
    return e.field();
  }
  return "accepted";
}

Vars with(Vars base, const Vars& more) {
  for (const auto& [k, v] : more) base[k] = v;
  return base;
}

Vars without(Vars base, const std::string& name) {
  base.erase(name);
  return base;
}

const Vars kTorchrun = {{"RANK", "1"},
                        {"WORLD_SIZE", "4"},
                        {"LOCAL_RANK", "1"},
                        {"MASTER_ADDR", "node0"},
                        {"MASTER_PORT", "29500"},
                        {"TORCHELASTIC_RUN_ID", "run-7"}};
const Vars kSlurm = {{"SLURM_PROCID", "5"},  {"SLURM_NTASKS", "8"},
                     {"SLURM_LOCALID", "1"}, {"SLURM_JOB_ID", "12345"},
                     {"SLURM_STEP_ID", "2"}, {"SLURM_JOB_NODELIST", "node[01-04,07],gpu3"}};
const Vars kOpenMpi = {{"OMPI_COMM_WORLD_RANK", "3"},
                       {"OMPI_COMM_WORLD_SIZE", "4"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}};
const Vars kByHand = {
    {"MESHCAST_RENDEZVOUS", "10.0.0.1:29500"}, {"MESHCAST_RANK", "2"}, {"MESHCAST_SIZE", "4"}};

TEST(LaunchEnv, NoJobNoEnvironment) {
  EXPECT_FALSE(from({}).has_value());
  // Not a job by themselves: a rendezvous without ranks, a job id, a local rank.
  EXPECT_FALSE(from({{"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}}).has_value());
  EXPECT_FALSE(from({{"SLURM_JOB_ID", "7"}, {"SLURM_JOB_NODELIST", "n1"}}).has_value());
  EXPECT_FALSE(from({{"MESHCAST_LOCAL_RANK", "0"}, {"LOCAL_RANK", "0"}}).has_value());
  // MESHCAST_LAUNCHER=meshcast ignores every launcher's variables.
  EXPECT_FALSE(from(with(kTorchrun, {{"MESHCAST_LAUNCHER", "meshcast"}})).has_value());
}

TEST(LaunchEnv, ByHand) {
  const LaunchEnv e = accepted(with(kByHand, {{"MESHCAST_LOCAL_RANK", "0"}}));
  EXPECT_EQ(e.launcher, "meshcast");
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.size, 4);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.host, "10.0.0.1");
  EXPECT_EQ(e.port, 29500);
  EXPECT_EQ(e.size_from, "MESHCAST_SIZE");
  EXPECT_EQ(e.host_from, "MESHCAST_RENDEZVOUS");
  EXPECT_EQ(e.timeout_seconds, 60);
  EXPECT_EQ(e.str(),
            "meshcast: rank 2 of 4 (local rank 0), rendezvous 10.0.0.1:29500 "
            "(MESHCAST_RENDEZVOUS)");
  EXPECT_EQ(accepted(without(kByHand, "MESHCAST_LOCAL_RANK")).local_rank, -1);
  const LaunchEnv v6 = accepted(with(
      kByHand, {{"MESHCAST_RENDEZVOUS", "[::1]:29500"}, {"MESHCAST_RENDEZVOUS_TIMEOUT", "2.5"}}));
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.rendezvous(), "[::1]:29500");
  EXPECT_EQ(v6.timeout_seconds, 2.5);
  // MASTER_ADDR/MASTER_PORT serve a job started by hand too.
  const LaunchEnv m = accepted(with(without(kByHand, "MESHCAST_RENDEZVOUS"),
                                    {{"MASTER_ADDR", "h"}, {"MASTER_PORT", "100"}}));
  EXPECT_EQ(m.rendezvous(), "h:101");
}

TEST(LaunchEnv, Torchrun) {
  const LaunchEnv e = accepted(kTorchrun);
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.size, 4);
  EXPECT_EQ(e.local_rank, 1);
  // MASTER_PORT itself is torchrun's own TCP store: meshcast listens on the next port.
  EXPECT_EQ(e.rendezvous(), "node0:29501");
  EXPECT_EQ(e.size_from, "WORLD_SIZE");
  EXPECT_EQ(e.host_from, "MASTER_ADDR");
  EXPECT_EQ(e.port_from, "MASTER_PORT");
  EXPECT_EQ(e.str(),
            "torchrun: rank 1 of 4 (local rank 1), rendezvous node0:29501 (MASTER_ADDR, "
            "MASTER_PORT)");
  EXPECT_NE(e.job_key.find("TORCHELASTIC_RUN_ID=run-7"), std::string::npos) << e.job_key;
  EXPECT_NE(e.job_key.find("rendezvous=node0:29501"), std::string::npos) << e.job_key;
  EXPECT_EQ(accepted(with(kTorchrun, {{"MASTER_ADDR", "[fe80::1]"}})).host, "fe80::1");
  EXPECT_EQ(accepted(without(kTorchrun, "LOCAL_RANK")).local_rank, -1);
}

TEST(LaunchEnv, Slurm) {
  const LaunchEnv e = accepted(kSlurm);
  EXPECT_EQ(e.launcher, "slurm");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.host, "node01");  // the first host of the compressed list
  EXPECT_EQ(e.port, 10000 + (16 * 12345 + 2) % 20000);
  EXPECT_EQ(e.size_from, "SLURM_NTASKS");
  EXPECT_EQ(e.host_from, "SLURM_JOB_NODELIST");
  EXPECT_EQ(e.port_from, "SLURM_JOB_ID");
  // The step's node list first; no step id is step 0; consecutive steps differ.
  EXPECT_EQ(accepted(with(kSlurm, {{"SLURM_STEP_NODELIST", "gpu[3-4]"}})).host, "gpu3");
  EXPECT_EQ(accepted(without(kSlurm, "SLURM_STEP_ID")).port, 10000 + (16 * 12345) % 20000);
  EXPECT_NE(accepted(with(kSlurm, {{"SLURM_STEP_ID", "3"}})).port, e.port);
  // Compressed host lists.
  for (const auto& [list, first] : std::vector<std::pair<std::string, std::string>>{
           {"a,b", "a"},
           {"node7", "node7"},
           {"n[009]", "n009"},
           {"rack[2-3]-n[05-06]", "rack2-n05"},
           {"gpu-node[10,2-4].cluster", "gpu-node10.cluster"},
           {"x_1,y[1-2]", "x_1"}})
    EXPECT_EQ(accepted(with(kSlurm, {{"SLURM_JOB_NODELIST", list}})).host, first) << list;
  // MASTER_ADDR/MASTER_PORT or MESHCAST_RENDEZVOUS take precedence over the node list.
  EXPECT_EQ(accepted(with(kSlurm, {{"MASTER_ADDR", "m"}, {"MASTER_PORT", "6000"}})).rendezvous(),
            "m:6001");
  const LaunchEnv r = accepted(with(kSlurm, {{"MESHCAST_RENDEZVOUS", "r:7000"}}));
  EXPECT_EQ(r.rendezvous(), "r:7000");
  EXPECT_EQ(r.rank, 5);  // Slurm's ranks with MESHCAST_RENDEZVOUS
  EXPECT_EQ(r.launcher, "slurm");
}

TEST(LaunchEnv, OpenMpi) {
  const LaunchEnv e = accepted(kOpenMpi);
  EXPECT_EQ(e.launcher, "openmpi");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_FALSE(e.has_rendezvous());  // mpirun's MPI starts the job
  EXPECT_EQ(TcpBootstrap::from_launch(e), nullptr);
  EXPECT_EQ(e.str(), "openmpi: rank 3 of 4 (local rank 1), no rendezvous (MPI starts the job)");
  EXPECT_EQ(accepted(with(kOpenMpi, {{"MESHCAST_RENDEZVOUS", "h:5"}})).rendezvous(), "h:5");
  EXPECT_EQ(accepted(with(kOpenMpi, {{"MASTER_ADDR", "h"}, {"MASTER_PORT", "5"}})).rendezvous(),
            "h:6");
}

TEST(LaunchEnv, PrecedenceAndOverrides) {
  // The innermost launcher: torchrun, then mpirun, then Slurm (whose variables both inherit).
  Vars all = with(with(kSlurm, kOpenMpi), kTorchrun);
  EXPECT_EQ(accepted(all).launcher, "torchrun");
  EXPECT_EQ(accepted(all).rank, 1);
  const LaunchEnv mpi = accepted(with(kSlurm, kOpenMpi));
  EXPECT_EQ(mpi.launcher, "openmpi");
  EXPECT_EQ(mpi.rank, 3);
  EXPECT_FALSE(mpi.has_rendezvous());  // not Slurm's node list: under mpirun, MPI starts
  // MESHCAST_LAUNCHER picks one.
  EXPECT_EQ(accepted(with(all, {{"MESHCAST_LAUNCHER", "slurm"}})).rank, 5);
  EXPECT_EQ(accepted(with(all, {{"MESHCAST_LAUNCHER", "openmpi"}})).rank, 3);
  EXPECT_EQ(accepted(with(all, {{"MESHCAST_LAUNCHER", "auto"}})).launcher, "torchrun");
  // MESHCAST_* override field by field.
  const LaunchEnv o = accepted(
      with(kTorchrun,
           {{"MESHCAST_RANK", "3"}, {"MESHCAST_LOCAL_RANK", "0"}, {"MESHCAST_RENDEZVOUS", "x:9"}}));
  EXPECT_EQ(o.launcher, "torchrun");
  EXPECT_EQ(o.rank, 3);
  EXPECT_EQ(o.size, 4);
  EXPECT_EQ(o.local_rank, 0);
  EXPECT_EQ(o.rendezvous(), "x:9");
  EXPECT_EQ(accepted(with(kTorchrun, {{"MESHCAST_SIZE", "8"}, {"RANK", "6"}})).size, 8);
  // Only the variables used are read: an overridden launcher variable may hold anything.
  EXPECT_EQ(refused(with(kTorchrun, {{"RANK", "x"},
                                     {"WORLD_SIZE", "y"},
                                     {"MASTER_PORT", "z"},
                                     {"MESHCAST_RANK", "0"},
                                     {"MESHCAST_SIZE", "2"},
                                     {"MESHCAST_RENDEZVOUS", "h:1"}})),
            "accepted");
  EXPECT_EQ(refused(with(kTorchrun, {{"SLURM_PROCID", "x"}, {"SLURM_JOB_NODELIST", "[["}})),
            "accepted");
  // MESHCAST_RANK and MESHCAST_SIZE together: a job by hand inside an allocation, whose
  // variables (a local id beyond this job's size, its node list) are not this job's.
  const Vars inside = with(kSlurm, {{"SLURM_LOCALID", "7"},
                                    {"MESHCAST_RANK", "0"},
                                    {"MESHCAST_SIZE", "2"},
                                    {"MESHCAST_RENDEZVOUS", "h:1"}});
  const LaunchEnv in = accepted(inside);
  EXPECT_EQ(in.launcher, "meshcast");
  EXPECT_EQ(in.local_rank, -1);
  EXPECT_EQ(refused(without(inside, "MESHCAST_RENDEZVOUS")), "MESHCAST_RENDEZVOUS");
}

TEST(LaunchEnv, EveryRefusalNamesItsVariable) {
  std::string what;
  // torchrun without its rendezvous: the example of the docs.
  EXPECT_EQ(refused(without(without(kTorchrun, "MASTER_ADDR"), "MASTER_PORT"), &what),
            "MASTER_ADDR");
  EXPECT_EQ(what,
            "MASTER_ADDR: not set; torchrun's RANK and WORLD_SIZE are set, the rendezvous needs "
            "MASTER_ADDR and MASTER_PORT (or MESHCAST_RENDEZVOUS)");
  EXPECT_EQ(refused(with(kTorchrun, {{"MASTER_PORT", "abc"}}), &what), "MASTER_PORT");
  EXPECT_EQ(what,
            "MASTER_PORT: expected a port in [1, 65534] (meshcast listens on MASTER_PORT + 1), "
            "got 'abc'");
  EXPECT_EQ(refused(with(kTorchrun, {{"RANK", "4"}}), &what), "RANK");
  EXPECT_EQ(what, "RANK: expected a rank in [0, 4) (WORLD_SIZE=4), got '4'");

  const std::string huge(1 << 20, '7');
  const std::vector<std::pair<Vars, std::string>> cases = {
      // torchrun
      {without(kTorchrun, "WORLD_SIZE"), "WORLD_SIZE"},
      {without(kTorchrun, "RANK"), "RANK"},
      {with(kTorchrun, {{"RANK", "-1"}}), "RANK"},
      {with(kTorchrun, {{"RANK", "1.0"}}), "RANK"},
      {with(kTorchrun, {{"RANK", huge}}), "RANK"},
      {with(kTorchrun, {{"WORLD_SIZE", "0"}}), "WORLD_SIZE"},
      {with(kTorchrun, {{"WORLD_SIZE", "4x"}}), "WORLD_SIZE"},
      {with(kTorchrun, {{"WORLD_SIZE", "100000000"}}), "WORLD_SIZE"},  // above limits().devices
      {with(kTorchrun, {{"WORLD_SIZE", huge}}), "WORLD_SIZE"},
      {with(kTorchrun, {{"LOCAL_RANK", "4"}}), "LOCAL_RANK"},
      {with(kTorchrun, {{"LOCAL_RANK", "one"}}), "LOCAL_RANK"},
      {without(kTorchrun, "MASTER_PORT"), "MASTER_PORT"},
      {without(kTorchrun, "MASTER_ADDR"), "MASTER_ADDR"},
      {with(kTorchrun, {{"MASTER_ADDR", ""}}), "MASTER_ADDR"},
      {with(kTorchrun, {{"MASTER_PORT", "0"}}), "MASTER_PORT"},
      {with(kTorchrun, {{"MASTER_PORT", "65535"}}), "MASTER_PORT"},
      {with(kTorchrun, {{"MASTER_PORT", huge}}), "MASTER_PORT"},
      // Slurm
      {without(kSlurm, "SLURM_NTASKS"), "SLURM_NTASKS"},
      {without(kSlurm, "SLURM_PROCID"), "SLURM_PROCID"},
      {with(kSlurm, {{"SLURM_PROCID", "8"}}), "SLURM_PROCID"},
      {with(kSlurm, {{"SLURM_LOCALID", "-2"}}), "SLURM_LOCALID"},
      {without(kSlurm, "SLURM_JOB_NODELIST"), "SLURM_JOB_NODELIST"},
      {without(kSlurm, "SLURM_JOB_ID"), "SLURM_JOB_ID"},
      {with(kSlurm, {{"SLURM_JOB_ID", "j7"}}), "SLURM_JOB_ID"},
      {with(kSlurm, {{"SLURM_STEP_ID", "batch"}}), "SLURM_STEP_ID"},
      {with(kSlurm, {{"SLURM_STEP_NODELIST", "a,,b"}}), "SLURM_STEP_NODELIST"},
      // Open MPI
      {with(kOpenMpi, {{"OMPI_COMM_WORLD_RANK", "4"}}), "OMPI_COMM_WORLD_RANK"},
      {without(kOpenMpi, "OMPI_COMM_WORLD_SIZE"), "OMPI_COMM_WORLD_SIZE"},
      {with(kOpenMpi, {{"MASTER_ADDR", "h"}}), "MASTER_PORT"},
      // by hand, and the overrides
      {without(kByHand, "MESHCAST_RENDEZVOUS"), "MESHCAST_RENDEZVOUS"},
      {without(kByHand, "MESHCAST_RANK"), "MESHCAST_RANK"},
      {without(kByHand, "MESHCAST_SIZE"), "MESHCAST_SIZE"},
      {with(kByHand, {{"MESHCAST_RENDEZVOUS", "h"}}), "MESHCAST_RENDEZVOUS"},
      {with(kByHand, {{"MESHCAST_RENDEZVOUS", "h:0"}}), "MESHCAST_RENDEZVOUS"},
      {with(kByHand, {{"MESHCAST_RENDEZVOUS", ":1"}}), "MESHCAST_RENDEZVOUS"},
      {with(kByHand, {{"MESHCAST_RENDEZVOUS", "[::1]"}}), "MESHCAST_RENDEZVOUS"},
      {with(kByHand, {{"MESHCAST_RENDEZVOUS_TIMEOUT", "soon"}}), "MESHCAST_RENDEZVOUS_TIMEOUT"},
      {with(kByHand, {{"MESHCAST_RENDEZVOUS_TIMEOUT", "0"}}), "MESHCAST_RENDEZVOUS_TIMEOUT"},
      {with(kTorchrun, {{"MESHCAST_SIZE", "0"}}), "MESHCAST_SIZE"},
      {with(kTorchrun, {{"MESHCAST_RANK", "9"}}), "MESHCAST_RANK"},
      {with(kSlurm, {{"MESHCAST_LOCAL_RANK", "x"}}), "MESHCAST_LOCAL_RANK"},
      {with(kSlurm, {{"MESHCAST_RENDEZVOUS", "nope"}}), "MESHCAST_RENDEZVOUS"},
      {with(kTorchrun, {{"MESHCAST_LAUNCHER", "pbs"}}), "MESHCAST_LAUNCHER"},
      {{{"MESHCAST_LAUNCHER", "torchrun"}}, "WORLD_SIZE"},  // picked, but none of its variables
  };
  for (const auto& [vars, field] : cases) {
    std::string line;
    EXPECT_EQ(refused(vars, &line), field) << line;
  }
  // Malformed Slurm host lists.
  for (const std::string list : {"node[01-", "node[4-2]", "node[]", ",a", "a,", "a b", "node[a-b]",
                                 "", "n[1]]", "n[[1]]", "n[1--2]"}) {
    std::string line;
    EXPECT_EQ(refused(with(kSlurm, {{"SLURM_JOB_NODELIST", list}}), &line), "SLURM_JOB_NODELIST")
        << list;
  }
  // A size over the limit says so, briefly.
  EXPECT_EQ(refused(with(kTorchrun, {{"WORLD_SIZE", "100000000"}}), &what), "WORLD_SIZE");
  EXPECT_NE(what.find("100000000 exceeds the limit of"), std::string::npos) << what;
}

TEST(LaunchEnv, TorchrunVariablesStartARendezvous) {
  // Three ranks as threads, each with only torchrun's variables; a host that is not an address
  // is named by the variable that gave it.
  const std::string master_port = std::to_string(free_port(true) - 1);
  constexpr int n = 3;
  std::vector<Vars> vars(n);
  std::vector<std::string> seen(n), errors(n);
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r) {
    vars[static_cast<std::size_t>(r)] = {{"RANK", std::to_string(r)},
                                         {"WORLD_SIZE", std::to_string(n)},
                                         {"MASTER_ADDR", "127.0.0.1"},
                                         {"MASTER_PORT", master_port},
                                         {"MESHCAST_RENDEZVOUS_TIMEOUT", "20"}};
    ranks.emplace_back([&, r] {
      const auto i = static_cast<std::size_t>(r);
      try {
        const auto e = LaunchEnv::from(fake(vars[i]));
        auto boot = TcpBootstrap::from_launch(*e);
        const auto all = boot->allgather({static_cast<unsigned char>('a' + r)});
        for (const auto& b : all) seen[i] += std::string(b.begin(), b.end());
      } catch (const std::exception& ex) {
        errors[i] = ex.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(errors[static_cast<std::size_t>(r)], "");
    EXPECT_EQ(seen[static_cast<std::size_t>(r)], "abc");
  }
  const Vars bad = {
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "no host!"}, {"MASTER_PORT", "29500"}};
  try {
    (void)TcpBootstrap::from_launch(*LaunchEnv::from(fake(bad)));
    ADD_FAILURE() << "accepted";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "MASTER_ADDR") << e.what();
  }
}

}  // namespace
}  // namespace meshcast
