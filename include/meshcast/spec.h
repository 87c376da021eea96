// A sharding spec in Alpa's notation: one token per tensor dimension, R or S<axes>, and an
// optional pending sum "+P<axes>". "S0R", "RS1", "S01R", "S0R+P1"; "" and "+P0" (a 0-d tensor's).
#pragma once

#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace meshcast {

class ShardingSpec {
 public:
  ShardingSpec() = default;
  // dims[i] lists the mesh axes splitting tensor dim i, major first (empty: R).
  ShardingSpec(std::vector<std::vector<int>> dims, std::vector<int> partial = {})
      : dims_(std::move(dims)), partial_(std::move(partial)) {}

  // Throws ParseError naming `field`. Does not know the mesh: axis ranges are checked by
  // Layout. An axis appearing twice is refused here.
  static ShardingSpec parse(std::string_view text, const std::string& field = "spec");

  std::size_t ndim() const { return dims_.size(); }
  // ValidationError("spec") for a dim of no token.
  const std::vector<int>& axes(std::size_t dim) const {
    if (dim >= dims_.size()) bad_dim(dim);
    return dims_[dim];
  }
  const std::vector<std::vector<int>>& dims() const { return dims_; }
  // Mesh axes holding addends of a pending sum (empty: the value is complete).
  const std::vector<int>& partial() const { return partial_; }
  bool is_partial() const { return !partial_.empty(); }
  // "S0R+P1"; parse(str()) == *this.
  std::string str() const;
  friend bool operator==(const ShardingSpec&, const ShardingSpec&) = default;

 private:
  [[noreturn]] void bad_dim(std::size_t dim) const;

  std::vector<std::vector<int>> dims_;
  std::vector<int> partial_;
};

std::ostream& operator<<(std::ostream& os, const ShardingSpec& s);

}  // namespace meshcast
