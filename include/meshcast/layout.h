// A layout: global shape + dtype + mesh + sharding spec. Which box each device holds.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "meshcast/box.h"
#include "meshcast/dtype.h"
#include "meshcast/mesh.h"
#include "meshcast/spec.h"

namespace meshcast {

using Shape = std::vector<std::int64_t>;

// Parses "1024,1024,512"; throws ParseError naming `field` (negative, overflowing, empty).
Shape parse_shape(std::string_view text, const std::string& field = "shape");
std::string shape_str(const Shape& shape);

class Layout {
 public:
  // Validates: extents >= 0, total bytes fit in int64, spec ndim == shape ndim, spec axes <
  // mesh.ndim(), each axis used once. Throws ValidationError naming `field`. A 0-d tensor
  // (shape {}, spec "" or "R", maybe "+P<axes>") is planned as shape {1} with spec "R":
  // shape() and spec() give those, scalar() says it was 0-d.
  Layout(Shape shape, DType dtype, Mesh mesh, ShardingSpec spec,
         const std::string& field = "layout");
  // "MESH:SPEC", e.g. "2x4@8-15:S0R".
  static Layout parse(const Shape& shape, DType dtype, std::string_view text,
                      const std::string& field = "layout");

  const Shape& shape() const { return shape_; }
  bool scalar() const { return scalar_; }
  DType dtype() const { return dtype_; }
  const Mesh& mesh() const { return mesh_; }
  const ShardingSpec& spec() const { return spec_; }
  std::size_t ndim() const { return shape_.size(); }
  std::int64_t elements() const;
  std::int64_t bytes() const { return elements() * static_cast<std::int64_t>(dtype_size(dtype_)); }

  // Number of shards of tensor dim `dim` (product of the extents of its axes). Taking a dim,
  // these throw ValidationError("spec") for one the tensor has not.
  std::int64_t splits(std::size_t dim) const;
  // Shard index of dim `dim` held by the device at mesh linear index `index`.
  std::int64_t shard_index(std::size_t dim, std::int64_t index) const;
  // The box of the global tensor held by the device at mesh linear index `index`.
  Box tile_at(std::int64_t index) const;
  // The box held by a device id; throws ValidationError if the device is not in the mesh.
  Box tile_of(int device) const;
  // Elements in a device's local buffer (its tile's volume).
  std::int64_t local_elements(int device) const { return tile_of(device).volume(); }

  // Which addend a device holds: its row-major index over the partial axes (0 if complete).
  std::int64_t partial_group(std::int64_t index) const;
  std::int64_t partial_groups() const;

  // Devices (mesh linear indices) whose shard indices equal `shard` (one per dim): the holders
  // of that tile, in mesh order. Holders of different addends are included. ValidationError
  // ("shard") unless there is one index per dim, each in [0, splits(dim)).
  std::vector<std::int64_t> holders(const std::vector<std::int64_t>& shard) const;
  // Replica groups: for each distinct tile (and addend), the devices holding it.
  std::vector<std::vector<int>> replica_groups() const;

  // "2x4@0-7:S0R"
  std::string str() const;
  friend bool operator==(const Layout& a, const Layout& b) {
    return a.shape_ == b.shape_ && a.scalar_ == b.scalar_ && a.dtype_ == b.dtype_ &&
           a.mesh_ == b.mesh_ && a.spec_ == b.spec_;
  }

 private:
  Shape shape_;
  DType dtype_;
  Mesh mesh_;
  ShardingSpec spec_;
  bool scalar_ = false;
};

std::ostream& operator<<(std::ostream& os, const Layout& l);

}  // namespace meshcast
