// What the process-backend consumers do once they have a communicator: plan src -> dst, run it
// with test data on every rank, and sum the wrong elements over the ranks through the bootstrap
// (every rank's exit status then says whether the job moved the data right).
#pragma once

#include <cstdint>
#include <cstdio>
#include <vector>

#include "meshcast/bootstrap.h"
#include "meshcast/meshcast.h"
#include "meshcast/testing.h"

// Returns the process exit status: 0 when every rank's destination elements are all right.
inline int reshard_and_check(meshcast::Bootstrap& boot, meshcast::Communicator& comm,
                             const meshcast::Layout& src, const meshcast::Layout& dst) {
  const meshcast::Plan p = meshcast::plan(src, dst);
  const int me = comm.rank();
  const std::size_t bytes = meshcast::dtype_size(src.dtype());
  std::vector<unsigned char> in(src.mesh().contains(me) ? src.local_elements(me) * bytes : 0);
  std::vector<unsigned char> out(dst.mesh().contains(me) ? dst.local_elements(me) * bytes : 0);
  if (!in.empty()) meshcast::fill_source(src, me, in.data());
  meshcast::reshard(p, comm, in.empty() ? nullptr : in.data(), out.empty() ? nullptr : out.data());
  const std::int64_t wrong = out.empty() ? 0 : meshcast::count_mismatches(dst, me, out.data());
  const long long all = boot.sum(wrong);
  std::printf("rank %d: %lld wrong here, %lld in all\n", me, static_cast<long long>(wrong), all);
  return all == 0 ? 0 : 1;
}
