// Strict JSON reading for every input document (topology, plan, configuration, manifest):
// malformed text is a ParseError naming the field, and so is a key repeated in one object
// (nlohmann keeps the last silently, so an edited file could mean two things). Internal.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>
#include <vector>

#include "lib/text.h"
#include "meshcast/error.h"

namespace meshcast::detail {

inline nlohmann::json parse_json(const std::string& text, const std::string& field) {
  std::vector<std::unordered_set<std::string>> keys;  // one set per open object
  std::string duplicate;
  auto check = [&](int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& value) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) keys.emplace_back();
    if (event == E::object_end && !keys.empty()) keys.pop_back();
    if (event == E::key && !keys.empty() && !keys.back().insert(value.get<std::string>()).second &&
        duplicate.empty())
      duplicate = value.get<std::string>();
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text, check);
  } catch (const nlohmann::json::exception& e) {
    throw ParseError(field, std::string("not valid JSON: ") + e.what());
  }
  if (!duplicate.empty())
    throw ParseError(field, "key " + quote(duplicate) + " appears twice in one object");
  return j;
}

}  // namespace meshcast::detail
