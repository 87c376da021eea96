// BoxWalk, the GPU kernels' index math, on the host: for random boxes of random ranks (0 to 5),
// counts (0 too), extents, offsets, element sizes (3 and 12 too) and base alignments, the words a
// walk visits (with 32- and 64-bit indices) cover exactly the bytes an element-by-element copy
// reads and writes, in the same order; every word is aligned to its width; and the width is the
// widest the addresses allow.
#include "collectives/transports/box_walk.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <random>
#include <utility>
#include <vector>

namespace meshcast::detail {
namespace {

using Bytes = std::vector<std::pair<std::uint64_t, std::uint64_t>>;  // (read, written) addresses

std::uint64_t address(const Region& r) { return reinterpret_cast<std::uintptr_t>(r.base); }

// Byte addresses an element-wise copy reads and writes, element by element in row-major order.
Bytes element_bytes(const Region& from, const Region& to) {
  Bytes out;
  const int rank = static_cast<int>(from.count.size());
  std::vector<std::int64_t> c(rank, 0);
  for (std::int64_t n = from.elements(); n > 0; --n) {
    std::int64_t a = 0, b = 0;
    for (int d = 0; d < rank; ++d) {
      a = a * from.extent[d] + from.offset[d] + c[d];
      b = b * to.extent[d] + to.offset[d] + c[d];
    }
    for (std::size_t j = 0; j < from.elem_size; ++j)
      out.emplace_back(address(from) + a * from.elem_size + j, address(to) + b * to.elem_size + j);
    for (int d = rank - 1; d >= 0 && ++c[d] == from.count[d]; --d) c[d] = 0;
  }
  return out;
}

template <class Index>
Bytes walk_bytes(const BoxWalk& w, const Region& from, const Region& to) {
  Bytes out;
  for (long long i = 0; i < w.words(); ++i) {
    long long a, b;
    w.locate(static_cast<Index>(i), a, b);
    const std::uint64_t fa = address(from) + w.first_a + a * w.word;
    const std::uint64_t tb = address(to) + w.first_b + b * w.word;
    EXPECT_EQ(fa % w.word, 0u);
    EXPECT_EQ(tb % w.word, 0u);
    for (int j = 0; j < w.word; ++j) out.emplace_back(fa + j, tb + j);
  }
  return out;
}

// A random box in a random buffer: its extents, and an origin and counts that fit inside them.
Region random_region(std::mt19937_64& rng, const std::vector<std::int64_t>& count,
                     std::size_t elem_size, std::uint64_t base) {
  Region r;
  r.base = reinterpret_cast<void*>(static_cast<std::uintptr_t>(base));
  r.elem_size = elem_size;
  r.count = count;
  for (std::int64_t c : count) {
    const std::int64_t extra = std::uniform_int_distribution<std::int64_t>(0, 3)(rng) == 0
                                   ? std::uniform_int_distribution<std::int64_t>(1, 5)(rng)
                                   : 0;  // mostly whole dimensions, which merge
    r.extent.push_back(c + extra);
    r.offset.push_back(std::uniform_int_distribution<std::int64_t>(0, extra)(rng));
  }
  return r;
}

TEST(BoxWalk, CoversTheElementwiseCopyInWordsAsWideAsTheAddressesAllow) {
  std::mt19937_64 rng(20261128);
  int wide = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int rank = std::uniform_int_distribution<int>(0, 5)(rng);
    std::vector<std::int64_t> count;
    for (int d = 0; d < rank; ++d)  // a few empty boxes
      count.push_back(std::uniform_int_distribution<std::int64_t>(trial % 50 == 0 ? 0 : 1, 7)(rng));
    constexpr std::size_t kSizes[] = {1, 2, 4, 8, 16, 16, 3, 12};
    const std::size_t es = kSizes[std::uniform_int_distribution<int>(0, 7)(rng)];
    const int lane = static_cast<int>(es & (~es + 1));  // the largest power of two dividing it
    auto base = [&] {  // element-aligned, sometimes more; now and then not even that
      return 4096 + es * std::uniform_int_distribution<std::uint64_t>(0, 64)(rng) +
             (trial % 7 == 0 ? 1 : 0);
    };
    const Region from = random_region(rng, count, es, base());
    const Region to = random_region(rng, count, es, base());
    const Bytes want = element_bytes(from, to);
    const bool aligned = address(from) % lane == 0 && address(to) % lane == 0;
    for (const auto& [max_word, min_word] :
         {std::pair<int, int>{16, 1}, {16, lane}, {lane, lane}}) {
      if (min_word > 1 && !aligned) continue;  // the caller vouches for min_word's alignment
      const BoxWalk w = box_walk(from, to, max_word, min_word);
      SCOPED_TRACE(::testing::Message() << "trial " << trial << " es " << es << " word " << w.word);
      ASSERT_GE(w.word, min_word);
      ASSERT_LE(w.word, max_word);
      EXPECT_EQ(walk_bytes<unsigned>(w, from, to), want);
      EXPECT_EQ(walk_bytes<unsigned long long>(w, from, to), want);
      // Widest: a word twice as wide would split somewhere (every word's bytes are consecutive
      // in both buffers and it starts aligned), checked on the element-wise bytes.
      if (w.word < max_word && !want.empty()) {
        const std::uint64_t next = 2 * w.word;
        bool fits = want.size() % next == 0;
        for (std::size_t i = 0; fits && i < want.size(); i += next) {
          fits = want[i].first % next == 0 && want[i].second % next == 0;
          for (std::size_t j = 1; fits && j < next; ++j)
            fits =
                want[i + j].first == want[i].first + j && want[i + j].second == want[i].second + j;
        }
        EXPECT_FALSE(fits) << "a word of " << next << " bytes fits";
      }
      wide += w.word == 16;
    }
  }
  EXPECT_GT(wide, 300);  // the generator reaches 16-byte words, not only narrow ones
}

TEST(BoxWalk, MergesWholeDimensionsIntoOneRow) {
  // A whole f32 tile of 8 x 1024 copied into columns [1024, 2048) of an 8 x 2048 one: rows of
  // 4 KiB, 256 words of 16 bytes, one outer dimension.
  Region from{reinterpret_cast<void*>(std::uintptr_t{1} << 20), 4, {8, 1024}, {0, 0}, {8, 1024}};
  Region to{reinterpret_cast<void*>(std::uintptr_t{1} << 21), 4, {8, 2048}, {0, 1024}, {8, 1024}};
  BoxWalk w = box_walk(from, to, 16, 1);
  EXPECT_EQ(w.word, 16);
  EXPECT_EQ(w.row, 256);
  ASSERT_EQ(w.outer, 1);
  EXPECT_EQ(w.count[0], 8);
  EXPECT_EQ(w.step_a[0], 256);
  EXPECT_EQ(w.step_b[0], 512);
  EXPECT_EQ(w.first_b, 4096);
  // Whole in both: one row of 32 KiB.
  to = from;
  to.base = reinterpret_cast<void*>(std::uintptr_t{3} << 20);
  w = box_walk(from, to, 16, 1);
  EXPECT_EQ(w.outer, 0);
  EXPECT_EQ(w.row, 8 * 1024 * 4 / 16);
}

// Past 2^32 words (the kernels' 64-bit path): words around 2^32 and the last one land where
// row-major arithmetic says, in a box of 2 x 2.15e9 bytes whose rows start at odd offsets.
TEST(BoxWalk, LocatesWordsPastFourBillion) {
  const std::int64_t cols = 2'150'000'000;
  const Region from{
      reinterpret_cast<void*>(std::uintptr_t{1} << 40), 1, {3, cols + 3}, {1, 1}, {2, cols}};
  const Region to{
      reinterpret_cast<void*>(std::uintptr_t{1} << 41), 1, {2, cols + 1}, {0, 0}, {2, cols}};
  const BoxWalk w = box_walk(from, to, 16, 1);
  ASSERT_EQ(w.word, 1);
  ASSERT_EQ(w.words(), 2 * cols);
  const std::int64_t four_billion = std::int64_t{1} << 32;
  for (const std::int64_t i : {std::int64_t{0}, cols - 1, cols, four_billion - 1, four_billion,
                               four_billion + 1, 2 * cols - 1}) {
    long long a, b;
    w.locate<unsigned long long>(static_cast<unsigned long long>(i), a, b);
    const std::int64_t row = i / cols, col = i % cols;
    EXPECT_EQ(w.first_a + a, (1 + row) * (cols + 3) + 1 + col) << i;
    EXPECT_EQ(w.first_b + b, row * (cols + 1) + col) << i;
  }
}

}  // namespace
}  // namespace meshcast::detail
