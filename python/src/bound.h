// The bound classes' arguments, refused when their instance was made by __new__ alone: its
// __init__ (or a pickle's __setstate__) never ran. pybind11 would hand the method memory it
// allocated there and then, never constructed (Plan.__new__(Plan).json() crashed; Layout's
// read zeros). Every python/src header includes this first, so that each translation unit sees
// these casters before it uses one; the classes of python/src specialise theirs beside their
// definitions (MESHCAST_PY_INITIALIZED).
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <typeinfo>

#include "meshcast/local.h"
#include "meshcast/plan.h"
#include "meshcast/sync.h"
#include "meshcast/topology.h"

namespace pybind11::detail {

template <class T>
class initialized_caster : public type_caster_base<T> {
 public:
  bool load(handle src, bool convert) {
    // Before the base's load, which gives a missing value memory (for __init__ to construct
    // in): no value is then one that was never constructed. (Not holder_constructed(): an
    // instance wrapping a reference, Layout.mesh, has a value and no holder.)
    if (src && isinstance<T>(src)) {
      // (Looked up once: the class is registered by then, as src is one.)
      static const type_info* const info = get_type_info(typeid(T));
      const auto vh = reinterpret_cast<instance*>(src.ptr())->get_value_and_holder(info, false);
      if (vh.inst != nullptr && vh.value_ptr() == nullptr)  // (its bool is the value's)
        throw type_error(std::string(Py_TYPE(src.ptr())->tp_name) +
                         ": an instance whose __init__ never ran (made by __new__ alone)");
    }
    return type_caster_base<T>::load(src, convert);
  }
};

}  // namespace pybind11::detail

#define MESHCAST_PY_INITIALIZED(T) \
  template <>                      \
  class pybind11::detail::type_caster<T> : public initialized_caster<T> {}

MESHCAST_PY_INITIALIZED(meshcast::Mesh);
MESHCAST_PY_INITIALIZED(meshcast::Layout);
MESHCAST_PY_INITIALIZED(meshcast::Topology);
MESHCAST_PY_INITIALIZED(meshcast::RankPlan);
MESHCAST_PY_INITIALIZED(meshcast::SyncPlan);
MESHCAST_PY_INITIALIZED(meshcast::LocalWorld);
