// A user's program on the core (meshcast::meshcast): plans a move between two layouts and prints
// the bytes it moves. Exits non-zero when the plan is empty (a 2x2 row split to a column split on
// the same devices must move data).
#include <cstdio>
#include <exception>

#include "meshcast/meshcast.h"

int main() {
  try {
    const meshcast::Shape shape{8, 8};
    const auto src = meshcast::Layout::parse(shape, meshcast::DType::f32, "2x2@0-3:S0R");
    const auto dst = meshcast::Layout::parse(shape, meshcast::DType::f32, "2x2@0-3:RS0");
    const meshcast::Plan p = meshcast::plan(src, dst);
    std::printf("bytes_moved %lld ops %zu\n", static_cast<long long>(p.stats().bytes_moved),
                p.ops().size());
    return p.ops().empty() ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
