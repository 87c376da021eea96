// Fuzzes the plan JSON reader: any input either loads or throws meshcast::Error. A loaded plan
// must round-trip through to_json() and print. Anything else (another exception, a crash, a
// sanitizer report, a hang) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "meshcast/error.h"
#include "meshcast/plan.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const meshcast::Plan plan = meshcast::Plan::from_json(text);
    if (!(meshcast::Plan::from_json(plan.to_json()) == plan)) std::abort();  // round trip
    (void)plan.str();
  } catch (const meshcast::Error&) {
  }
  return 0;
}
