// A one-line check of a configuration: a ValidationError naming `field` unless `ok`. Internal
// (the training engine's checks).
#pragma once

#include <string>

#include "meshcast/error.h"

namespace meshcast::detail {

inline void require(bool ok, const std::string& field, const std::string& why) {
  if (!ok) throw ValidationError(field, why);
}

}  // namespace meshcast::detail
