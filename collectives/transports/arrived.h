// What every transport says of a receive whose message had another length. Internal to
// collectives/transports/.
#pragma once

#include <cstdint>
#include <string>

#include "meshcast/error.h"

namespace meshcast::detail {

// A receive that completed with `got` bytes where `want` were posted fails, naming its sender
// (CommError field "length"):
// MPI and UCX both complete a receive of a shorter message without an error, and so does the
// local transport.
inline void check_arrived(int peer, std::int64_t got, std::int64_t want) {
  if (got != want)
    throw CommError(
        peer,
        "sent " + std::to_string(got) + " bytes where " + std::to_string(want) + " were expected",
        "length");
}

// A receive whose message was longer than the `want` bytes posted: MPI and UCX fail it as
// truncated, without the length sent; named as check_arrived names a shorter one.
[[noreturn]] inline void arrived_longer(int peer, std::int64_t want) {
  throw CommError(peer, "sent more than the " + std::to_string(want) + " bytes expected", "length");
}

}  // namespace meshcast::detail
