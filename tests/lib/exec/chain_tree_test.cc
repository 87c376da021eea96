// Communicator::ibcast as a tree of chains (meshcast/multicast_tree.h) over the engine's chains
// (tests/lib/exec/chain_world.h): every member of every group size, forked or not, gets the box,
// contiguous or strided (staged through a ring of a few chunks, so that a slot reused before
// both of a leader's or forking root's sends completed would corrupt what it forwards).
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "lib/exec/chain_world.h"
#include "meshcast/communicator.h"

namespace meshcast {
namespace {

TEST(ChainTree, EveryMemberOfEveryTreeGetsTheBox) {
  constexpr int kWorld = 11;
  // Root 4, then the other ten in a scrambled forwarding order.
  const std::vector<int> members{4, 9, 0, 7, 2, 10, 5, 1, 8, 3, 6};
  const Box whole({{0, 13}, {0, 9}});
  for (bool strided : {false, true})
    for (std::size_t chunk : {std::size_t{7}, std::size_t{64}, std::size_t{4096}})
      for (std::int64_t group : {0, 2, 3, 4, 6, 9})
        for (std::int64_t fork : {0, 1, 4, 9}) {
          SCOPED_TRACE(::testing::Message() << "strided " << strided << " chunk " << chunk
                                            << " group " << group << " fork " << fork);
          const Box box = strided ? Box({{1, 12}, {2, 7}}) : whole;
          std::vector<std::vector<std::int32_t>> tile(kWorld, std::vector<std::int32_t>(117, -1));
          std::iota(tile[4].begin(), tile[4].end(), 1000);
          testing::ChainWorld world(kWorld, chunk, 3 * chunk);
          world.run(
              [&](Communicator& comm) {
                const auto me = static_cast<std::size_t>(comm.rank());
                const Region r = Region::of(tile[me].data(), sizeof(std::int32_t), whole, box);
                Request req = comm.ibcast(r, members.front(), members, 7, group, fork);
                comm.wait(req);
              },
              members);
          for (int d : members)
            for (std::int64_t i = 0; i < 13; ++i)
              for (std::int64_t j = 0; j < 9; ++j) {
                const auto at = static_cast<std::size_t>(i * 9 + j);
                const bool in = box.contains(Box({{i, i + 1}, {j, j + 1}}));
                ASSERT_EQ(tile[static_cast<std::size_t>(d)][at],
                          in || d == 4 ? 1000 + static_cast<std::int32_t>(at) : -1)
                    << "device " << d << " element " << i << "," << j;
              }
        }
}

}  // namespace
}  // namespace meshcast
