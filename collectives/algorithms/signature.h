// What every member of a collective must agree on: which collective, the elements' dtype, the
// reduction, a broadcast's root and the sizes. Members pass their signatures to the peers they send
// data to, and check the ones they receive before they keep or combine anything, so that a member
// that passed i32 where the others passed f32 (the same bytes) fails by name instead of leaving
// bits of the wrong type. Internal to collectives/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
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
  // The elements the member was given: the count (all-reduce, reduce-scatter, broadcast), a
  // digest of every member's count (all-gather), 0 (all-to-all: each pair's lengths are the
  // transport's to check). Members given other counts would exchange pieces of other bounds, and
  // where a message of one is as long as another's, or empty on one side (not sent), take wrong
  // data without an error.
  std::uint64_t sizes = 0;

  // As it travels (the same on every host): word() then sizes, kBytes in all.
  static constexpr std::size_t kBytes = 2 * sizeof(std::uint64_t);
  std::uint64_t word() const;
  void write(std::byte* to) const;
  // The digest of every member's count for `sizes` (FNV-1a of the counts).
  static std::uint64_t digest(std::span<const std::int64_t> counts);
  // "all_reduce (sum) of f32"
  std::string str() const;
  // Throws ValidationError naming the first field that differs (collective, dtype, op, root,
  // count) when `theirs`, device `device`'s signature as written, is not this one.
  void check(const std::byte* theirs, int device) const;
};

}  // namespace meshcast::detail
