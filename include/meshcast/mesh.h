// A device mesh: an N-D grid over an ordered list of distinct global device ids, row-major.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace meshcast {

class Mesh {
 public:
  // Validates: every extent >= 1, devices.size() == product of extents, ids >= 0 and distinct.
  // Throws ValidationError naming `field` otherwise.
  Mesh(std::vector<std::int64_t> shape, std::vector<int> devices,
       const std::string& field = "mesh");

  // Text form: "2x4" (devices 0-7), "2x4@8-15", "2x2@[0,2,4,6]", "2x2@[0-1,6-7]", "4@0-3",
  // "1x1@5". Throws ParseError / ValidationError naming `field`.
  static Mesh parse(std::string_view text, const std::string& field = "mesh");

  std::size_t ndim() const { return shape_.size(); }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  // Accessors taking an axis, an index or a coordinate throw ValidationError("mesh") when it is
  // out of range.
  std::int64_t extent(std::size_t axis) const {
    if (axis >= shape_.size()) bad_axis(axis);
    return shape_[axis];
  }
  std::int64_t size() const { return static_cast<std::int64_t>(devices_.size()); }
  const std::vector<int>& devices() const { return devices_; }

  // Device at a row-major linear index, and the coordinate of a linear index.
  int device(std::int64_t index) const {
    check_index(index);
    return devices_[static_cast<std::size_t>(index)];
  }
  std::vector<std::int64_t> coord(std::int64_t index) const;
  std::int64_t index(const std::vector<std::int64_t>& coord) const;
  // Linear index of a device id, if it is in the mesh.
  std::optional<std::int64_t> index_of(int device) const;
  bool contains(int device) const { return index_of(device).has_value(); }

  // Canonical text: "2x4@0-7", "2x2@[0,2,4,6]", "1x1@5". parse(str()) == *this.
  std::string str() const;
  friend bool operator==(const Mesh& a, const Mesh& b) {
    return a.shape_ == b.shape_ && a.devices_ == b.devices_;
  }

 private:
  void check_index(std::int64_t index) const {
    if (index < 0 || index >= size()) bad_index(index);
  }
  [[noreturn]] void bad_index(std::int64_t index) const;
  [[noreturn]] void bad_axis(std::size_t axis) const;

  std::vector<std::int64_t> shape_;
  std::vector<int> devices_;
  // For index_of where devices_ is not in increasing order (else both empty): the ids sorted,
  // and pos_[i] the linear index of sorted_[i].
  std::vector<int> sorted_;
  std::vector<std::int64_t> pos_;
};

std::ostream& operator<<(std::ostream& os, const Mesh& m);

}  // namespace meshcast
