// meshcast's plan variants that the benchmark suites compare, by the names their tables use.
#pragma once

#include "meshcast/plan.h"

namespace mcbench {

struct PlanMethod {
  const char* label;
  meshcast::Strategy strategy;
  meshcast::Balance balance;
};

// sendrecv and allgather with the default balance; broadcast with each balance.
inline constexpr PlanMethod kPlanMethods[] = {
    {"sendrecv", meshcast::Strategy::SendRecv, meshcast::Balance::Search},
    {"allgather", meshcast::Strategy::AllGather, meshcast::Balance::Search},
    {"broadcast", meshcast::Strategy::Broadcast, meshcast::Balance::None},
    {"broadcast+greedy", meshcast::Strategy::Broadcast, meshcast::Balance::Greedy},
    {"broadcast+search", meshcast::Strategy::Broadcast, meshcast::Balance::Search}};

}  // namespace mcbench
