#include "meshcast/mesh.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <sstream>

#include "lib/support/text.h"
#include "meshcast/error.h"

namespace meshcast {
namespace {

// A mesh of more devices than this is refused (ids are not limited, only the count).
constexpr std::int64_t kMaxDevices = std::int64_t{1} << 20;
constexpr std::int64_t kMaxId = std::numeric_limits<int>::max();
// A spec names a mesh axis by one digit (S01, P2): an 11th axis would print as two.
constexpr std::size_t kMaxAxes = 10;

// "8-15" or "5": the number of ids it names. Appends them to `out` only while `out` holds at
// most `keep` ids, so that a list far longer than the mesh is counted, not materialised.
std::int64_t parse_id_range(std::string_view s, std::vector<int>& out, std::size_t keep,
                            const std::string& field) {
  const auto dash = s.find('-');
  std::int64_t lo = 0, hi = 0;
  if (dash == std::string_view::npos) {
    lo = hi = detail::parse_uint(s, kMaxId, field, "device id");
  } else {
    lo = detail::parse_uint(s.substr(0, dash), kMaxId, field, "device id");
    hi = detail::parse_uint(s.substr(dash + 1), kMaxId, field, "device id");
    if (hi < lo) throw ParseError(field, "device range " + detail::quote(s) + " runs backwards");
    if (hi - lo + 1 > kMaxDevices) throw ParseError(field, "device range too large");
  }
  for (auto d = lo; d <= hi && out.size() <= keep; ++d) out.push_back(static_cast<int>(d));
  return hi - lo + 1;
}

// Number of devices of a mesh of this shape; validates the extents.
std::int64_t mesh_size(const std::vector<std::int64_t>& shape, const std::string& field) {
  if (shape.empty()) throw ValidationError(field, "a mesh needs at least one axis");
  if (shape.size() > kMaxAxes)
    throw ValidationError(field, "a mesh has at most " + std::to_string(kMaxAxes) + " axes (" +
                                     std::to_string(shape.size()) + " given)");
  std::int64_t n = 1;
  for (auto e : shape) {
    if (e < 1) throw ValidationError(field, "mesh extents must be >= 1");
    if (n > kMaxDevices / e) throw ValidationError(field, "mesh has too many devices");
    n *= e;
  }
  return n;
}

}  // namespace

Mesh::Mesh(std::vector<std::int64_t> shape, std::vector<int> devices, const std::string& field)
    : shape_(std::move(shape)), devices_(std::move(devices)) {
  const std::int64_t n = mesh_size(shape_, field);
  if (static_cast<std::int64_t>(devices_.size()) != n)
    throw ValidationError(field, "mesh has " + std::to_string(n) + " devices but " +
                                     std::to_string(devices_.size()) + " device ids given");
  // Ids in increasing order (most meshes): devices_ serves index_of itself, no copy sorted.
  if (std::adjacent_find(devices_.begin(), devices_.end(), std::greater_equal<>()) ==
      devices_.end()) {
    if (!devices_.empty() && devices_.front() < 0)
      throw ValidationError(field, "device ids must be >= 0");
    return;
  }
  std::vector<std::int64_t> order(devices_.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return devices_[a] < devices_[b]; });
  sorted_.reserve(order.size());
  pos_ = std::move(order);
  for (auto i : pos_) {
    if (devices_[i] < 0) throw ValidationError(field, "device ids must be >= 0");
    if (!sorted_.empty() && sorted_.back() == devices_[i])
      throw ValidationError(field, "device " + std::to_string(devices_[i]) + " appears twice");
    sorted_.push_back(devices_[i]);
  }
}

Mesh Mesh::parse(std::string_view text, const std::string& field) {
  const auto at = text.find('@');
  const std::string_view dims = text.substr(0, at);
  std::vector<std::int64_t> shape;
  std::size_t start = 0;
  while (true) {
    const auto x = dims.find('x', start);
    shape.push_back(
        detail::parse_uint(dims.substr(start, x - start), kMaxDevices, field, "mesh extent"));
    if (x == std::string_view::npos) break;
    start = x + 1;
  }
  const std::int64_t n = mesh_size(shape, field);
  std::vector<int> devices;
  if (at == std::string_view::npos) {
    devices.resize(static_cast<std::size_t>(n));
    std::iota(devices.begin(), devices.end(), 0);
  } else {
    std::string_view ids = text.substr(at + 1);
    if (ids.empty()) throw ParseError(field, "missing device ids after '@'");
    const auto keep = static_cast<std::size_t>(n);
    std::int64_t given = 0;  // ids named, counted past the mesh's size without storing them
    if (ids.front() == '[') {
      if (ids.size() < 2 || ids.back() != ']')
        throw ParseError(field, "device list " + detail::quote(ids) + " lacks a closing ']'");
      ids = ids.substr(1, ids.size() - 2);
      std::size_t s = 0;
      while (true) {
        const auto comma = ids.find(',', s);
        given += parse_id_range(ids.substr(s, comma - s), devices, keep, field);
        if (comma == std::string_view::npos) break;
        s = comma + 1;
      }
    } else {
      given = parse_id_range(ids, devices, keep, field);
    }
    if (given != n)
      throw ValidationError(field, "mesh has " + std::to_string(n) + " devices but " +
                                       std::to_string(given) + " device ids given");
  }
  return Mesh(std::move(shape), std::move(devices), field);
}

void Mesh::bad_index(std::int64_t index) const {
  throw ValidationError("mesh", "device index " + std::to_string(index) +
                                    " is out of range for a mesh of " +
                                    std::to_string(devices_.size()) + " devices");
}

void Mesh::bad_axis(std::size_t axis) const {
  throw ValidationError("mesh", "axis " + std::to_string(axis) + " is out of range for a " +
                                    std::to_string(shape_.size()) + "-D mesh");
}

std::vector<std::int64_t> Mesh::coord(std::int64_t index) const {
  check_index(index);
  std::vector<std::int64_t> c(shape_.size());
  for (std::size_t a = shape_.size(); a-- > 0;) {
    c[a] = index % shape_[a];
    index /= shape_[a];
  }
  return c;
}

std::int64_t Mesh::index(const std::vector<std::int64_t>& coord) const {
  if (coord.size() != shape_.size())
    throw ValidationError("mesh", "a coordinate of " + std::to_string(coord.size()) +
                                      " axes for a " + std::to_string(shape_.size()) + "-D mesh");
  std::int64_t i = 0;
  for (std::size_t a = 0; a < shape_.size(); ++a) {
    if (coord[a] < 0 || coord[a] >= shape_[a])
      throw ValidationError("mesh", "coordinate " + std::to_string(coord[a]) + " of axis " +
                                        std::to_string(a) + " is out of range for extent " +
                                        std::to_string(shape_[a]));
    i = i * shape_[a] + coord[a];
  }
  return i;
}

std::optional<std::int64_t> Mesh::index_of(int device) const {
  const std::vector<int>& ids = pos_.empty() ? devices_ : sorted_;  // empty: devices_ is sorted
  const auto it = std::lower_bound(ids.begin(), ids.end(), device);
  if (it == ids.end() || *it != device) return std::nullopt;
  const auto k = it - ids.begin();
  return pos_.empty() ? k : pos_[static_cast<std::size_t>(k)];
}

std::string Mesh::str() const {
  std::ostringstream os;
  for (std::size_t a = 0; a < shape_.size(); ++a) os << (a ? "x" : "") << shape_[a];
  os << '@';
  bool consecutive = true;
  for (std::size_t i = 1; i < devices_.size(); ++i)
    consecutive = consecutive && devices_[i] - 1 == devices_[i - 1];
  if (devices_.size() == 1) {
    os << devices_[0];
  } else if (consecutive) {
    os << devices_.front() << '-' << devices_.back();
  } else {
    // Consecutive runs of three or more print as ranges.
    os << '[';
    for (std::size_t i = 0; i < devices_.size();) {
      std::size_t j = i;
      while (j + 1 < devices_.size() && devices_[j + 1] - 1 == devices_[j]) ++j;
      os << (i ? "," : "");
      if (j >= i + 2) {
        os << devices_[i] << '-' << devices_[j];
        i = j + 1;
      } else {
        os << devices_[i];
        ++i;
      }
    }
    os << ']';
  }
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Mesh& m) { return os << m.str(); }

}  // namespace meshcast
