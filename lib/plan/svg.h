// plan_svg with the topology at hand, and the thresholds of its two views (lib/plan/svg.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "meshcast/plan.h"
#include "meshcast/topology.h"

namespace meshcast {

// The device view draws every device, grouped in host boxes, when each mesh has at most
// kSvgDeviceView devices and the plan makes at most kSvgDeviceLines device-to-device transfers
// (hops, aggregated per pair); otherwise the aggregated view draws at most kSvgMaxBoxes boxes
// per mesh (one per host, or runs of hosts, or runs of one host's devices) with the bytes
// between them written on the lines. A 64-device mesh is always aggregated.
inline constexpr std::int64_t kSvgDeviceView = 16;
inline constexpr std::size_t kSvgDeviceLines = 40;
inline constexpr std::int64_t kSvgMaxBoxes = 8;

}  // namespace meshcast
