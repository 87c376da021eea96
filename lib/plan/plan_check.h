// Plan::validate()'s checker. Internal to lib/.
#pragma once

#include <string>

#include "meshcast/plan.h"

namespace meshcast::detail {

// "plan.ops[3]": the field of an element, for messages.
inline std::string at_index(const std::string& field, std::size_t i) {
  return field + "[" + std::to_string(i) + "]";
}

// Throws ParseError/ValidationError naming the field ("plan.ops[3].box") unless every op is
// well formed and every target element is written exactly once (meshcast/plan.h says what).
void check_plan(const Plan& p);
// Each op on its own and the streams, not the coverage: what the cost model indexes by (phases,
// boxes, devices), for a plan priced that need not move a whole tensor (a scenario built by
// hand).
void check_plan_ops(const Plan& p);

}  // namespace meshcast::detail
