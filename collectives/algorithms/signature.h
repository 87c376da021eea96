// What every member of a collective must agree on: which collective, the elements' dtype, the
// reduction and a broadcast's root. Members pass their signatures to the peers they send data to,
// and check the ones they receive before they keep or combine anything, so that a member that
// passed i32 where the others passed f32 (the same bytes) fails by name instead of leaving bits of
// the wrong type. Internal to collectives/.
#pragma once

#include <cstdint>
#include <string>

#include "meshcast/collectives.h"

namespace meshcast::detail {

struct Signature {
  enum class Kind : std::uint8_t { AllReduce, ReduceScatter, AllGather, Broadcast, AllToAll };
  Kind kind = Kind::AllReduce;
  DType dtype = DType::i8;
  ReduceOp op = ReduceOp::Sum;  // Sum where the collective does not reduce
  // A broadcast's root device (0 for the others): members that name different roots in a chain
  // through the same neighbours would each receive their predecessor's bytes and return. Its
  // low 24 bits travel (a group of 2^24 members would be needed for two roots to look alike).
  int root = 0;

  // As it travels (8 bytes, the same on every host).
  std::uint64_t word() const;
  // "all_reduce (sum) of f32"
  std::string str() const;
  // Throws ValidationError naming the first field that differs (collective, dtype, op, root) when
  // `theirs`, device `device`'s word, is not this signature's.
  void check(std::uint64_t theirs, int device) const;
};

}  // namespace meshcast::detail
