// Fuzzes the topology JSON reader: any input either loads or throws meshcast::Error. A loaded
// topology must survive a round trip through to_json(). Anything else (another exception, a
// crash, a sanitizer report, a hang) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "meshcast/error.h"
#include "meshcast/topology.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const meshcast::Topology topology = meshcast::Topology::from_json(text);
    const meshcast::Topology again = meshcast::Topology::from_json(topology.to_json());
    if (again.hosts() != topology.hosts() || again.device_count() != topology.device_count()) {
      std::abort();
    }
  } catch (const meshcast::Error&) {
  }
  return 0;
}
