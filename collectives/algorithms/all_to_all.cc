// All-to-all(v): one round that posts every block at once; the transport overlaps them.
#include <cstring>

#include "program.h"

namespace meshcast::detail {

void all_to_allv(Program& p, std::span<const int> members, std::size_t me, const void* send,
                 std::span<const std::int64_t> send_counts, void* recv,
                 std::span<const std::int64_t> recv_counts) {
  Round& r = p.add_round();
  std::int64_t so = 0, ro = 0;
  std::byte* const out = static_cast<std::byte*>(const_cast<void*>(send));
  for (std::size_t k = 0; k < members.size(); ++k) {
    const auto sb = static_cast<std::size_t>(send_counts[k]) * p.elem();
    const auto rb = static_cast<std::size_t>(recv_counts[k]) * p.elem();
    if (k == me)
      r.copies.push_back({p.at(out, so), p.at(recv, ro), sb});
    else {
      r.sends.push_back({members[k], p.at(out, so), sb});
      r.recvs.push_back({members[k], p.at(recv, ro), rb});
    }
    so += send_counts[k];
    ro += recv_counts[k];
  }
}

}  // namespace meshcast::detail
