#include "meshcast/layout.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include "lib/support/text.h"
#include "meshcast/error.h"

namespace meshcast {
namespace {

// Text for a one-line message, cut at 64 characters: a mesh of 20,000 listed ids or a shape of
// many dimensions is not printed whole.
std::string brief(std::string s) { return s.size() > 64 ? s.substr(0, 61) + "..." : s; }
std::string brief(const Mesh& m) { return brief(m.str()); }

}  // namespace

Shape parse_shape(std::string_view text, const std::string& field) {
  Shape shape;
  std::size_t s = 0;
  while (true) {
    const auto comma = text.find(',', s);
    const auto tok = text.substr(s, comma - s);
    if (!tok.empty() && tok.front() == '-')
      throw ParseError(field, "negative extent " + detail::quote(tok));
    shape.push_back(
        detail::parse_uint(tok, std::numeric_limits<std::int64_t>::max(), field, "extent"));
    if (comma == std::string_view::npos) break;
    s = comma + 1;
  }
  return shape;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? "," : "") << shape[i];
  return os.str();
}

Layout::Layout(Shape shape, DType dtype, Mesh mesh, ShardingSpec spec, const std::string& field)
    : shape_(std::move(shape)), dtype_(dtype), mesh_(std::move(mesh)), spec_(std::move(spec)) {
  if (shape_.empty()) {
    // A 0-d tensor is planned as its one element: shape [1], whole. The algebra's boxes, tiles
    // and regions all have at least one dimension.
    if (spec_.ndim() > 1 || (spec_.ndim() == 1 && !spec_.axes(0).empty()))
      throw ValidationError(field + ".spec", "spec " + detail::quote(spec_.str()) +
                                                 " for a 0-d tensor: its spec is empty or R, "
                                                 "with +P<axes> for a pending sum");
    scalar_ = true;
    shape_ = {1};
    spec_ = ShardingSpec({{}}, spec_.partial());
  }
  for (auto n : shape_)
    if (n < 0) throw ValidationError(field + ".shape", "negative extent");
  // An empty tensor (some extent 0) has 0 bytes whatever its other extents.
  if (std::find(shape_.begin(), shape_.end(), 0) == shape_.end()) {
    std::int64_t bytes = static_cast<std::int64_t>(dtype_size(dtype_));
    for (auto n : shape_) {
      if (bytes > std::numeric_limits<std::int64_t>::max() / n)
        throw ValidationError(field + ".shape", "tensor of shape " + brief(shape_str(shape_)) +
                                                    " overflows 64-bit byte counts");
      bytes *= n;
    }
  }
  if (spec_.ndim() != shape_.size())
    throw ValidationError(field + ".spec", "spec " + detail::quote(spec_.str()) + " has " +
                                               std::to_string(spec_.ndim()) +
                                               " dimensions but the tensor has " +
                                               std::to_string(shape_.size()));
  std::vector<bool> used(mesh_.ndim(), false);
  auto use = [&](int a) {
    if (a < 0 || static_cast<std::size_t>(a) >= mesh_.ndim())
      throw ValidationError(field + ".spec",
                            "mesh axis " + std::to_string(a) + " is out of range for the " +
                                std::to_string(mesh_.ndim()) + "-D mesh " + brief(mesh_));
    if (used[static_cast<std::size_t>(a)])
      throw ValidationError(field + ".spec", "mesh axis " + std::to_string(a) + " used twice");
    used[static_cast<std::size_t>(a)] = true;
  };
  for (const auto& d : spec_.dims())
    for (int a : d) use(a);
  for (int a : spec_.partial()) use(a);
}

Layout Layout::parse(const Shape& shape, DType dtype, std::string_view text,
                     const std::string& field) {
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos)
    throw ParseError(field, "expected MESH:SPEC, got " + detail::quote(text));
  return Layout(shape, dtype, Mesh::parse(text.substr(0, colon), field + ".mesh"),
                ShardingSpec::parse(text.substr(colon + 1), field + ".spec"), field);
}

std::int64_t Layout::elements() const {
  for (auto e : shape_)
    if (e == 0) return 0;  // before multiplying: the other extents may overflow together
  std::int64_t n = 1;
  for (auto e : shape_) n *= e;
  return n;
}

std::int64_t Layout::splits(std::size_t dim) const {
  std::int64_t p = 1;
  for (int a : spec_.axes(dim)) p *= mesh_.extent(static_cast<std::size_t>(a));
  return p;
}

std::int64_t Layout::shard_index(std::size_t dim, std::int64_t index) const {
  const auto c = mesh_.coord(index);
  std::int64_t k = 0;
  for (int a : spec_.axes(dim))
    k = k * mesh_.extent(static_cast<std::size_t>(a)) + c[static_cast<std::size_t>(a)];
  return k;
}

Box Layout::tile_at(std::int64_t index) const {
  const auto c = mesh_.coord(index);
  std::vector<Range> r(shape_.size());
  for (std::size_t d = 0; d < shape_.size(); ++d) {
    std::int64_t k = 0, p = 1;
    for (int a : spec_.axes(d)) {
      const auto ax = static_cast<std::size_t>(a);
      k = k * mesh_.extent(ax) + c[ax];
      p *= mesh_.extent(ax);
    }
    r[d] = shard_range(shape_[d], p, k);
  }
  return Box(std::move(r));
}

Box Layout::tile_of(int device) const {
  const auto i = mesh_.index_of(device);
  if (!i)
    throw ValidationError("device",
                          "device " + std::to_string(device) + " is not in mesh " + brief(mesh_));
  return tile_at(*i);
}

std::int64_t Layout::partial_group(std::int64_t index) const {
  const auto c = mesh_.coord(index);
  std::int64_t g = 0;
  for (int a : spec_.partial())
    g = g * mesh_.extent(static_cast<std::size_t>(a)) + c[static_cast<std::size_t>(a)];
  return g;
}

std::int64_t Layout::partial_groups() const {
  std::int64_t g = 1;
  for (int a : spec_.partial()) g *= mesh_.extent(static_cast<std::size_t>(a));
  return g;
}

std::vector<std::int64_t> Layout::holders(const std::vector<std::int64_t>& shard) const {
  // Fix the coordinates of every splitting axis from the shard indices (mixed radix, major
  // first), then enumerate the free axes in mesh order.
  if (shard.size() != shape_.size())
    throw ValidationError("shard", "has " + std::to_string(shard.size()) + " indices for a " +
                                       std::to_string(shape_.size()) + "-D tensor");
  for (std::size_t d = 0; d < shard.size(); ++d)
    if (shard[d] < 0 || shard[d] >= splits(d))
      throw ValidationError("shard", "index " + std::to_string(shard[d]) + " of dim " +
                                         std::to_string(d) + " is outside its " +
                                         std::to_string(splits(d)) + " shards");
  const std::size_t nd = mesh_.ndim();
  std::vector<std::int64_t> fixed(nd, -1);
  for (std::size_t d = 0; d < shape_.size(); ++d) {
    std::int64_t k = shard[d];
    const auto& axes = spec_.axes(d);
    for (std::size_t j = axes.size(); j-- > 0;) {
      const auto ax = static_cast<std::size_t>(axes[j]);
      fixed[ax] = k % mesh_.extent(ax);
      k /= mesh_.extent(ax);
    }
  }
  std::vector<std::int64_t> out;
  std::vector<std::int64_t> c(nd, 0);
  for (std::size_t a = 0; a < nd; ++a)
    if (fixed[a] >= 0) c[a] = fixed[a];
  while (true) {
    out.push_back(mesh_.index(c));
    std::size_t a = nd;
    while (a-- > 0) {  // odometer over the free axes
      if (fixed[a] >= 0) continue;
      if (++c[a] < mesh_.extent(a)) break;
      c[a] = 0;
    }
    if (a == static_cast<std::size_t>(-1)) break;
  }
  return out;
}

std::vector<std::vector<int>> Layout::replica_groups() const {
  // Key of a device: its shard indices and addend; devices with equal keys hold equal data.
  std::vector<std::pair<std::vector<std::int64_t>, int>> keyed;
  keyed.reserve(static_cast<std::size_t>(mesh_.size()));
  for (std::int64_t i = 0; i < mesh_.size(); ++i) {
    std::vector<std::int64_t> key;
    for (std::size_t d = 0; d < shape_.size(); ++d) key.push_back(shard_index(d, i));
    key.push_back(partial_group(i));
    keyed.emplace_back(std::move(key), mesh_.device(i));
  }
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::vector<int>> groups;
  for (std::size_t i = 0; i < keyed.size(); ++i) {
    if (i == 0 || keyed[i].first != keyed[i - 1].first) groups.emplace_back();
    groups.back().push_back(keyed[i].second);
  }
  return groups;
}

std::string Layout::str() const { return mesh_.str() + ":" + spec_.str(); }

std::ostream& operator<<(std::ostream& os, const Layout& l) { return os << l.str(); }

}  // namespace meshcast
