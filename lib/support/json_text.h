// Strict JSON reading for every input document (topology, plan, configuration, manifest):
// malformed text is a ParseError naming the field, and so is a key repeated in one object
// (nlohmann keeps the last silently, so an edited file could mean two things). Internal.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>
#include <vector>

#include "meshcast/error.h"

namespace meshcast::detail {

// nlohmann's DOM builder, watching each object's keys. (Its callback parser would do the same
// in time quadratic in an array's objects: it rescans the parent after every object.)
class StrictJsonBuilder : public nlohmann::detail::json_sax_dom_parser<nlohmann::json> {
 public:
  using Base = nlohmann::detail::json_sax_dom_parser<nlohmann::json>;
  explicit StrictJsonBuilder(nlohmann::json& j) : Base(j, true) {}
  bool start_object(std::size_t n) {
    keys_.emplace_back();
    return Base::start_object(n);
  }
  bool end_object() {
    keys_.pop_back();
    return Base::end_object();
  }
  bool key(std::string& k) {
    if (!keys_.back().insert(k).second && duplicate_.empty()) duplicate_ = k;
    return Base::key(k);
  }
  const std::string& duplicate() const { return duplicate_; }

 private:
  std::vector<std::unordered_set<std::string>> keys_;  // one set per open object
  std::string duplicate_;
};

inline nlohmann::json parse_json(const std::string& text, const std::string& field) {
  const auto brief = [](std::string s) {
    for (char& c : s)
      if (c < 32 || c >= 127) c = '?';
    return s.size() > 120 ? s.substr(0, 117) + "..." : s;
  };
  nlohmann::json j;
  StrictJsonBuilder builder(j);
  try {
    nlohmann::json::sax_parse(text, &builder);
  } catch (const nlohmann::json::exception& e) {
    throw ParseError(field, "not valid JSON: " + brief(e.what()));
  }
  if (!builder.duplicate().empty())
    throw ParseError(field, "key '" + brief(builder.duplicate()) + "' appears twice in one object");
  return j;
}

}  // namespace meshcast::detail
