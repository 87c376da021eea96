#include "python/src/tile.h"

#include <algorithm>

namespace meshcast::python {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

std::vector<std::int64_t> tile_shape(const Layout& layout, int device) {
  const Box tile = layout.tile_of(device);  // throws for a device outside the mesh
  return layout.scalar() ? std::vector<std::int64_t>{} : tile.extents();
}

namespace {

// A one-element tile may come as a 0-d array or as shape (1,): the same element either way.
bool same_tile(const std::vector<std::int64_t>& got, const std::vector<std::int64_t>& want) {
  const auto one = [](const std::vector<std::int64_t>& s) {
    return s.empty() || (s.size() == 1 && s[0] == 1);
  };
  return got == want || (one(got) && one(want));
}

}  // namespace

void Kept::add(const Array& a, const std::string& arg, bool writes) {
  objects.push_back(a.owner);
  const auto* p = static_cast<const char*>(a.data);
  if (p && a.bytes() > 0) spans.push_back({p, p + a.bytes(), writes, arg});
}

Array tile_array(py::handle obj, const Layout& layout, int device, const std::string& arg,
                 bool writable, Kept& keep, const std::vector<std::int64_t>* tile) {
  if (!layout.mesh().contains(device)) {
    if (!obj.is_none())
      throw py::value_error(arg + ": device " + std::to_string(device) + " holds no tile of " +
                            layout.str() + "; pass None");
    return Array{};
  }
  if (obj.is_none())
    throw py::value_error(arg + ": device " + std::to_string(device) + " holds a tile of " +
                          layout.str() + " (shape " + shape_text(tile_shape(layout, device)) +
                          "); got None");
  Array a = view_array(obj, arg, writable);
  if (a.dtype != layout.dtype())
    throw py::type_error(arg + ": expected " + to_string(layout.dtype()) +
                         " elements (the layout's dtype), got " + to_string(a.dtype));
  std::vector<std::int64_t> computed;
  const auto& want = tile ? *tile : (computed = tile_shape(layout, device));
  if (!same_tile(a.shape, want))
    throw py::value_error(arg + ": expected shape " + shape_text(want) + " (device " +
                          std::to_string(device) + "'s tile of " + layout.str() + "), got " +
                          shape_text(a.shape));
  keep.add(a, arg, writable);
  return a;
}

void check_disjoint(std::vector<Use> uses) {
  const auto begin = [](const Use& u) { return static_cast<const char*>(u.array->data); };
  const auto end = [&](const Use& u) { return begin(u) + u.array->bytes(); };
  std::erase_if(uses, [](const Use& u) { return !u.array->data || u.array->bytes() == 0; });
  std::sort(uses.begin(), uses.end(),
            [&](const Use& a, const Use& b) { return begin(a) < begin(b); });
  // Sweep by start address. An earlier range overlaps this one iff it ends past its start: of
  // them it is enough to know the one that reaches furthest, and the furthest writer (a read
  // meets only writers). Keeping every open range was quadratic where many reads share one
  // array.
  const Use* reach = nullptr;         // the earlier range that ends last
  const Use* writer_reach = nullptr;  // the earlier written range that ends last
  for (const Use& u : uses) {
    const Use* o = u.writes ? reach : writer_reach;
    if (o && end(*o) > begin(u))
      throw py::value_error((u.writes ? u.arg : o->arg) + ": shares memory with " +
                            (u.writes ? o->arg : u.arg) + "; pass separate arrays (a copy)");
    if (!reach || end(u) > end(*reach)) reach = &u;
    if (u.writes && (!writer_reach || end(u) > end(*writer_reach))) writer_reach = &u;
  }
}

void check_disjoint(const Array& read, const char* read_arg, const Array& write,
                    const char* write_arg) {
  const auto* r = static_cast<const char*>(read.data);
  const auto* w = static_cast<const char*>(write.data);
  if (!r || !w || read.bytes() == 0 || write.bytes() == 0) return;
  if (r < w + write.bytes() && w < r + read.bytes())
    throw py::value_error(std::string(write_arg) + ": shares memory with " + read_arg +
                          "; pass separate arrays (a copy)");
}

Array collective_array(py::handle obj, const std::string& arg, bool writable, Kept& keep) {
  if (obj.is_none()) throw py::type_error(arg + ": expected an array, got None");
  Array a = view_array(obj, arg, writable);
  keep.add(a, arg, writable);
  return a;
}

}  // namespace meshcast::python
