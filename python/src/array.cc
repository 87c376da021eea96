#include "python/src/array.h"

#include <pybind11/numpy.h>

#include <array>
#include <utility>

#include "lib/support/text.h"
#include "meshcast/error.h"
#include "python/src/ints.h"

namespace meshcast::python {
namespace {

// The DLPack ABI (dlpack.h, v0.x as torch 1.13 and numpy 1.24 export it): a stable C layout,
// declared here rather than taken from a header no Debian package ships.
struct DLDevice {
  std::int32_t device_type;
  std::int32_t device_id;
};
struct DLDataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;
  std::uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
constexpr std::int32_t kDLCPU = 1;
constexpr const char* kDeviceNames[] = {
    "?",    "cpu",       "cuda", "cuda_host",    "opencl", "vulkan", "metal",  "vpi",
    "rocm", "rocm_host", "ext",  "cuda_managed", "oneapi", "webgpu", "hexagon"};

struct Code {
  char kind;  // numpy's kind letters; 'B' for bf16, which numpy lacks
  int bytes;
  DType dtype;
};
constexpr std::array<Code, 15> kCodes{{{'f', 2, DType::f16},
                                       {'B', 2, DType::bf16},
                                       {'f', 4, DType::f32},
                                       {'f', 8, DType::f64},
                                       {'i', 1, DType::i8},
                                       {'i', 2, DType::i16},
                                       {'i', 4, DType::i32},
                                       {'i', 8, DType::i64},
                                       {'u', 1, DType::u8},
                                       {'u', 2, DType::u16},
                                       {'u', 4, DType::u32},
                                       {'u', 8, DType::u64},
                                       {'b', 1, DType::b8},
                                       {'c', 8, DType::c64},
                                       {'c', 16, DType::c128}}};

const Code* find_code(char kind, int bytes) {
  for (const Code& c : kCodes)
    if (c.kind == kind && c.bytes == bytes) return &c;
  return nullptr;
}

std::string supported() {
  std::string s;
  for (DType t : kAllDTypes) s += (s.empty() ? "" : ", ") + to_string(t);
  return s;
}

std::string text(py::handle h) { return py::str(h).cast<std::string>(); }

[[noreturn]] void type_error(const std::string& arg, const std::string& what) {
  throw py::type_error(arg + ": " + what);
}
[[noreturn]] void value_error(const std::string& arg, const std::string& what) {
  throw py::value_error(arg + ": " + what);
}

DType numpy_code(const py::dtype& dt, const std::string& arg) {
  const char order = py::detail::array_descriptor_proxy(dt.ptr())->byteorder;
  if (order == '>')
    value_error(arg, "big-endian " + text(dt) + " is not supported; convert it with .astype('=" +
                         std::string(1, dt.kind()) + std::to_string(dt.itemsize()) + "')");
  if (const Code* c = find_code(dt.kind(), static_cast<int>(dt.itemsize()))) return c->dtype;
  type_error(arg, "numpy dtype " + text(dt) + " is not supported (supported: " + supported() + ")");
}

Array view_numpy(const py::array& a, const std::string& arg, bool writable) {
  if (!(a.flags() & py::array::c_style))
    value_error(arg, "array is not C-contiguous (strides " +
                         py::str(a.attr("strides")).cast<std::string>() +
                         "); pass numpy.ascontiguousarray(x)");
  if (writable && !a.writeable()) value_error(arg, "array is read-only; it must be writable");
  Array out;
  out.dtype = numpy_code(a.dtype(), arg);
  out.data = const_cast<void*>(a.data());
  out.shape.assign(a.shape(), a.shape() + a.ndim());
  out.owner = a;
  return out;
}

DType dlpack_code(const DLDataType& t, const std::string& arg) {
  const char kinds[] = {'i', 'u', 'f', '?', 'B', 'c', 'b'};
  const Code* c = t.lanes == 1 && t.code < sizeof kinds && t.bits % 8 == 0
                      ? find_code(kinds[t.code], t.bits / 8)
                      : nullptr;
  if (!c)
    type_error(arg, "DLPack dtype (code " + std::to_string(t.code) + ", " + std::to_string(t.bits) +
                        " bits, " + std::to_string(t.lanes) +
                        " lanes) is not supported (supported: " + supported() + ")");
  return c->dtype;
}

std::string device_name(std::int32_t type, std::int32_t id) {
  const char* name = type >= 0 && type < static_cast<std::int32_t>(std::size(kDeviceNames))
                         ? kDeviceNames[type]
                         : "?";
  return std::string(name) + ":" + std::to_string(id) + " (DLPack device type " +
         std::to_string(type) + ")";
}

// "cannot be exported by DLPack: <the exporter's first line>", with the tensor's device if it
// says one (torch's meta tensors fail this way).
[[noreturn]] void not_exported(py::handle obj, const std::string& arg,
                               const py::error_already_set& e) {
  const std::string what = e.what();
  const std::string device =
      py::hasattr(obj, "device") ? " (device " + text(obj.attr("device")) + ")" : "";
  value_error(arg,
              "cannot be exported by DLPack" + device + ": " + what.substr(0, what.find('\n')));
}

// "tensor on cuda:0 ..." when `obj` says it lives off the host (before that, its export failed).
void check_host(py::handle obj, const std::string& arg) {
  if (!py::hasattr(obj, "__dlpack_device__")) return;
  std::pair<int, int> dev;
  try {
    dev = obj.attr("__dlpack_device__")().cast<std::pair<int, int>>();
  } catch (py::error_already_set& e) {
    not_exported(obj, arg, e);
  } catch (const py::cast_error&) {
    type_error(arg, "__dlpack_device__() returned no (device type, device id) pair of ints");
  }
  if (dev.first != kDLCPU)
    value_error(arg, "tensor on " + device_name(dev.first, dev.second) +
                         "; meshcast's Python bindings move host (cpu) memory");
}

// Whether `dtype` is torch.bool: by identity, once torch is imported (a string compare cost a
// torch tensor 0.2 us a call). Held for the process: torch's dtypes live as long.
bool is_torch_bool(const py::object& dtype) {
  static py::handle torch_bool;
  if (!torch_bool) {
    const py::dict modules = py::module_::import("sys").attr("modules");
    if (!modules.contains("torch")) return false;
    // (sys.modules["torch"] = None blocks an import; a stub may lack bool.)
    py::object b = py::getattr(modules["torch"], "bool", py::none());
    if (b.is_none()) return false;
    torch_bool = b.release();
  }
  return dtype.ptr() == torch_bool.ptr();
}

Array view_dlpack(py::handle obj, const std::string& arg, bool writable) {
  // torch exports a lazily negated view (its negative bit) as its un-negated memory.
  if (py::hasattr(obj, "is_neg") && obj.attr("is_neg")().cast<bool>())
    value_error(arg, "tensor has its negative bit set (a lazy negation); pass x.resolve_neg()");
  // torch 1.13 exports no bool tensors by DLPack (and a refused export costs it 1 ms and leaks
  // the tensor it made): their .numpy() view shares their memory.
  if (is_torch_bool(py::getattr(obj, "dtype", py::none())) && py::hasattr(obj, "numpy")) {
    check_host(obj, arg);
    if (!obj.attr("is_contiguous")().cast<bool>())
      value_error(arg, "tensor is not C-contiguous; pass x.contiguous()");
    return view_numpy(obj.attr("numpy")(), arg, writable);
  }
  // Exported first, its device read from the DLTensor: __dlpack_device__ costs torch 1.13 more
  // than the export itself, and an export is metadata only, wherever the memory is.
  py::object capsule;
  try {
    capsule = obj.attr("__dlpack__")();
  } catch (py::error_already_set& e) {
    check_host(obj, arg);
    not_exported(obj, arg, e);
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (!managed) {
    PyErr_Clear();
    type_error(arg, "__dlpack__ returned no unused \"dltensor\" capsule");
  }
  // The consumer owns the tensor once it renames the capsule, and must call its deleter.
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");
  py::capsule owner(managed, [](void* p) {
    auto* m = static_cast<DLManagedTensor*>(p);
    if (m->deleter) m->deleter(m);
  });
  const DLTensor& t = managed->dl_tensor;
  Array out;
  out.owner = owner;
  if (t.device.device_type != kDLCPU)
    value_error(arg, "tensor on " + device_name(t.device.device_type, t.device.device_id) +
                         "; meshcast's Python bindings move host (cpu) memory");
  out.dtype = dlpack_code(t.dtype, arg);
  out.shape.assign(t.shape, t.shape + t.ndim);
  // An empty tensor's strides say nothing (torch gives them freely): it is contiguous.
  if (t.strides && out.elements() > 0) {
    std::int64_t expect = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      if (t.shape[d] != 1 && t.strides[d] != expect) {
        std::string strides;
        for (int k = 0; k < t.ndim; ++k) strides += (k ? ", " : "") + std::to_string(t.strides[k]);
        value_error(arg, "tensor is not C-contiguous (strides in elements (" + strides +
                             ")); pass x.contiguous()");
      }
      expect *= t.shape[d];
    }
  }
  out.data = static_cast<char*>(t.data) + t.byte_offset;
  return out;
}

}  // namespace

std::int64_t Array::elements() const {
  std::int64_t n = 1;
  for (std::int64_t e : shape) n *= e;
  return n;
}

Array view_array(py::handle obj, const std::string& arg, bool writable) {
  if (py::isinstance<py::array>(obj))
    return view_numpy(py::reinterpret_borrow<py::array>(obj), arg, writable);
  // A 0-d tile indexed out of a numpy array (full[()]) is a numpy scalar, not a 0-d array: read
  // as one (a copy, kept with the view); it cannot be written (before __dlpack__, which newer
  // numpy scalars export without a read-only flag).
  if (py::isinstance(obj, py::module_::import("numpy").attr("generic"))) {
    if (writable)
      type_error(arg, "a numpy scalar cannot be written; pass a 0-d array (numpy.empty(()))");
    if (py::array a = py::array::ensure(obj)) return view_numpy(a, arg, false);
  }
  if (py::hasattr(obj, "__dlpack__")) return view_dlpack(obj, arg, writable);
  type_error(arg,
             "expected a numpy array or a tensor with __dlpack__ (e.g. a torch CPU "
             "tensor), got " +
                 type_name(obj));
}

DType to_dtype(py::handle obj, const std::string& arg) {
  // (numpy reads None as its default, float64: a dtype left out by mistake would be taken.)
  if (obj.is_none()) type_error(arg, "None is not a dtype (supported: " + supported() + ")");
  if (py::isinstance<py::str>(obj)) {
    const auto text = str_arg(obj, arg);
    for (DType t : kAllDTypes)
      if (to_string(t) == text) return t;
    if (text == "bfloat16") return DType::bf16;
  }
  const std::string repr = py::str(obj).cast<std::string>();
  // A torch.dtype (not a string spelled like one): its numpy twin, bf16 aside.
  if (!py::isinstance<py::str>(obj) && repr.rfind("torch.", 0) == 0) {
    if (repr == "torch.bfloat16") return DType::bf16;
    try {
      return to_dtype(py::module_::import("torch")
                          .attr("empty")(0, py::arg("dtype") = obj)
                          .attr("numpy")()
                          .attr("dtype"),
                      arg);
    } catch (py::error_already_set&) {
      type_error(arg,
                 detail::printable(repr) + " is not supported (supported: " + supported() + ")");
    }
  }
  py::dtype dt;
  try {
    dt = py::dtype::from_args(py::reinterpret_borrow<py::object>(obj));
  } catch (py::error_already_set&) {
    type_error(arg, detail::quote(repr) + " is not a dtype (supported: " + supported() + ")");
  }
  return numpy_code(dt, arg);
}

py::object numpy_dtype(DType t) {
  for (const Code& c : kCodes)
    if (c.dtype == t && c.kind != 'B')
      return py::dtype(std::string(1, c.kind) + std::to_string(c.bytes));
  return py::none();
}

}  // namespace meshcast::python
