// Throwing an error that every member of a group throws alike, having reached it from the same
// exchange (Error::agreed(): the communicator stays usable). Internal to lib/ and collectives/.
#pragma once

#include "meshcast/error.h"

namespace meshcast::detail {

template <class E>
[[noreturn]] void throw_agreed(E e) {
  e.mark_agreed();
  throw e;
}

}  // namespace meshcast::detail
