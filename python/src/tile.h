// Checking that an array is a device's tile of a layout, and handles that keep arrays alive
// while a transfer or collective is in flight.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "meshcast/layout.h"
#include "python/src/array.h"
#include "python/src/bound.h"
#include "python/src/comm.h"

namespace meshcast::python {

// The arrays of an operation: kept alive while it is in flight (`objects`), and the memory it
// uses (Life::check_free, Life::track).
struct Kept {
  std::vector<py::object> objects;
  std::vector<MemorySpan> spans;
  void add(const Array& a, const std::string& arg, bool writes);
};

// `obj` viewed as `device`'s tile of `layout`: data nullptr when the device is not in the
// layout's mesh (obj must then be None). Throws ValueError / TypeError naming `arg` for a
// missing array, or one of the wrong shape, dtype, contiguity, device or writability. `tile`:
// the device's tile shape where the caller has it at hand (else it is computed).
Array tile_array(py::handle obj, const Layout& layout, int device, const std::string& arg,
                 bool writable, Kept& keep, const std::vector<std::int64_t>* tile = nullptr);

// An array an operation reads or writes, for check_disjoint.
struct Use {
  const Array* array;
  std::string arg;
  bool writes;
};

// Throws ValueError("<arg>: shares memory with <other arg>") when an array the operation writes
// overlaps another it reads or writes: a reshard from a buffer into itself would read data it
// already overwrote.
void check_disjoint(std::vector<Use> uses);
// The same for one array read and one written, without the sweep's allocations (a reshard's or
// a collective's pair, checked on every call).
void check_disjoint(const Array& read, const char* read_arg, const Array& write,
                    const char* write_arg);

// The same for a flat buffer of a collective: `obj` viewed as `dtype` elements (any shape).
Array collective_array(py::handle obj, const std::string& arg, bool writable, Kept& keep);

std::string shape_text(const std::vector<std::int64_t>& shape);

// The shape of `device`'s tile of `layout` as Python sees it: () for a 0-d tensor's (planned as
// shape (1,)). The device must be in the mesh.
std::vector<std::int64_t> tile_shape(const Layout& layout, int device);

}  // namespace meshcast::python
