// A numpy array or a DLPack tensor (torch) seen as a pointer, shape and dtype: the memory the
// bindings hand to meshcast without a copy.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "meshcast/dtype.h"
#include "python/src/bound.h"

namespace meshcast::python {

namespace py = pybind11;

struct Array {
  void* data = nullptr;
  std::vector<std::int64_t> shape;
  DType dtype = DType::f32;
  std::int64_t elements() const;
  std::int64_t bytes() const { return elements() * static_cast<std::int64_t>(dtype_size(dtype)); }
  // Keeps the exporter's memory alive (the numpy array, or the DLPack capsule's owner) for as
  // long as the view is used, in particular by a transfer in flight.
  py::object owner;
};

// Views `obj` without copying: a numpy ndarray (buffer protocol), or any object with
// __dlpack__ / __dlpack_device__ (a torch tensor). Throws py::type_error naming `arg` for an
// object that is neither, or a dtype meshcast has no name for; py::value_error for memory that
// is not host memory, not C-contiguous, or (writable) a read-only numpy array. DLPack (0.x)
// carries no read-only flag: a torch tensor over read-only memory is taken as writable.
Array view_array(py::handle obj, const std::string& arg, bool writable);

// "f32" for the numpy dtype, torch dtype or string `obj`; throws py::type_error naming `arg`.
DType to_dtype(py::handle obj, const std::string& arg);

// The numpy dtype of a meshcast dtype (bf16, which numpy lacks, has none: py::none()).
py::object numpy_dtype(DType t);

}  // namespace meshcast::python
