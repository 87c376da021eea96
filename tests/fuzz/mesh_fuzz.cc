// Fuzzes the mesh text parser: any input either parses or throws meshcast::Error. A parsed mesh
// must print canonically and parse back to itself. Anything else (another exception, a crash, a
// sanitizer report, a hang) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "meshcast/error.h"
#include "meshcast/mesh.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const meshcast::Mesh mesh = meshcast::Mesh::parse(text);
    if (!(meshcast::Mesh::parse(mesh.str()) == mesh)) std::abort();  // round trip
  } catch (const meshcast::Error&) {
  }
  return 0;
}
