// Fuzzes the sharding-spec parser, and the layout parser on a 2x2 mesh with the same text:
// any input either parses or throws meshcast::Error. A parsed spec must print canonically and
// parse back to itself; a parsed layout must give every device a tile inside the tensor.
// Anything else (another exception, a crash, a sanitizer report, a hang) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "meshcast/error.h"
#include "meshcast/layout.h"
#include "meshcast/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const meshcast::ShardingSpec spec = meshcast::ShardingSpec::parse(text);
    if (!(meshcast::ShardingSpec::parse(spec.str()) == spec)) std::abort();  // round trip
  } catch (const meshcast::Error&) {
    return 0;
  }
  try {
    const meshcast::Shape shape{8, 8};
    const meshcast::Layout layout =
        meshcast::Layout::parse(shape, meshcast::DType::f32, "2x2:" + std::string(text));
    const meshcast::Box whole = meshcast::Box::whole(shape);
    for (std::int64_t i = 0; i < layout.mesh().size(); ++i) {
      if (!whole.contains(layout.tile_at(i))) std::abort();
    }
  } catch (const meshcast::Error&) {
  }
  return 0;
}
