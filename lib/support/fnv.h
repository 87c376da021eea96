// FNV-1a 64, fed in pieces: a digest that is the same in every process of a job (std::hash need
// not be). Internal to lib/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace meshcast::detail {

struct Fnv {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  Fnv& add(const void* data, std::size_t bytes) {
    for (const auto* p = static_cast<const unsigned char*>(data); bytes-- > 0; ++p)
      h = (h ^ *p) * 0x100000001b3ULL;
    return *this;
  }
  Fnv& add(std::int64_t v) { return add(&v, sizeof v); }  // (one build: one byte order)
  Fnv& add(std::string_view s) { return add(s.data(), s.size()); }
};

}  // namespace meshcast::detail
