// Human-readable quantities for reports: "16.00 MiB", "12.34 GB/s", "1.234 ms".
#pragma once

#include <cstdint>
#include <string>

namespace meshcast {

// Binary units: human_bytes(16777216) == "16.00 MiB"; below 1 KiB: "512 B".
std::string human_bytes(std::int64_t bytes);
// Decimal units (1 GB = 1e9 bytes): "12.34 GB/s", "n/a" when not positive and finite.
std::string human_rate(double bytes_per_second);
// "1.234 s", "12.345 ms", "12.3 us".
std::string human_seconds(double seconds);

}  // namespace meshcast
