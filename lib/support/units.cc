#include "meshcast/units.h"

#include <cstdio>

namespace meshcast {

std::string human_bytes(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  char buf[48];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

std::string human_rate(double bytes_per_second) {
  char buf[48];
  if (!(bytes_per_second > 0) || bytes_per_second > 1e30) return "n/a";
  if (bytes_per_second >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f GB/s", bytes_per_second / 1e9);
  else
    std::snprintf(buf, sizeof buf, "%.2f MB/s", bytes_per_second / 1e6);
  return buf;
}

std::string human_seconds(double seconds) {
  char buf[48];
  if (seconds >= 1e9)  // %.3f of a huge time would not fit: its unit was cut off
    std::snprintf(buf, sizeof buf, "%.3g s", seconds);
  else if (seconds >= 1)
    std::snprintf(buf, sizeof buf, "%.3f s", seconds);
  else if (seconds >= 1e-3)
    std::snprintf(buf, sizeof buf, "%.3f ms", seconds * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.1f us", seconds * 1e6);
  return buf;
}

}  // namespace meshcast
