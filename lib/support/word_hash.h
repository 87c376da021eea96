// A hash of machine words for the keys of unordered containers: a multiply and a rotation per
// word, then splitmix64's finalizer, so that every bit of every word reaches the low bits a
// table's buckets take. Fnv's bytes are slow for keys of thousands of words; a multiply alone
// leaves a word's high half out of the low bits, and carries a difference in its top bit to no
// other bit (the next word's could cancel it); words xored together before a multiply collide
// (a sync's (root, receiver) keys over 8,192 devices fell into 14,489 hashes for 858,265 keys).
// splitmix64 per word costs the planner 10% on keys of 128 words. Internal to lib/; not a digest.
#pragma once

#include <bit>
#include <cstdint>

namespace meshcast::detail {

struct WordHash {
  std::uint64_t h = 0x9E3779B97F4A7C15ULL;
  template <typename Word>
  constexpr WordHash& add(Word v) {
    h = std::rotl((h ^ static_cast<std::uint64_t>(v)) * 0xBF58476D1CE4E5B9ULL, 31);
    return *this;
  }
  constexpr std::uint64_t value() const {
    std::uint64_t z = (h ^ h >> 30) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ z >> 27) * 0x94D049BB133111EBULL;
    return z ^ z >> 31;
  }
};

}  // namespace meshcast::detail
