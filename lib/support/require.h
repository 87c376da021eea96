// A one-line check of a configuration: a ValidationError naming `field` unless `ok`. Internal to
// lib/, the training engine and the tools.
#pragma once

#include <string>

#include "meshcast/error.h"

namespace meshcast::detail {

inline void require(bool ok, const std::string& field, const std::string& why) {
  if (!ok) throw ValidationError(field, why);
}

}  // namespace meshcast::detail
