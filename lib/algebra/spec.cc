#include "meshcast/spec.h"

#include <sstream>

#include "lib/support/text.h"
#include "meshcast/error.h"

namespace meshcast {
namespace {

// Digits after 'S' or 'P' starting at i; each digit is one mesh axis.
std::vector<int> parse_axes(std::string_view text, std::size_t& i, const std::string& field) {
  std::vector<int> axes;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') axes.push_back(text[i++] - '0');
  if (axes.empty())
    throw ParseError(field, "expected mesh axes after " + detail::quote(text.substr(i - 1, 1)) +
                                " in " + detail::quote(text));
  return axes;
}

}  // namespace

ShardingSpec ShardingSpec::parse(std::string_view text, const std::string& field) {
  std::vector<std::vector<int>> dims;
  std::vector<int> partial;
  std::size_t i = 0;
  while (i < text.size() && text[i] != '+') {
    const char c = text[i++];
    if (c == 'R')
      dims.emplace_back();
    else if (c == 'S')
      dims.push_back(parse_axes(text, i, field));
    else
      throw ParseError(field, "unexpected " + detail::quote(std::string_view(&c, 1)) + " in spec " +
                                  detail::quote(text) + " (expected R, S<axes> or +P<axes>)");
  }
  if (i < text.size()) {  // "+P<axes>"
    ++i;
    if (i >= text.size() || text[i] != 'P')
      throw ParseError(field, "expected 'P' after '+' in " + detail::quote(text));
    ++i;
    partial = parse_axes(text, i, field);
    if (i != text.size())
      throw ParseError(field, "trailing text after partial axes in " + detail::quote(text));
  }
  bool used[10] = {};
  auto use = [&](int a) {
    if (used[a])
      throw ParseError(field,
                       "mesh axis " + std::to_string(a) + " used twice in " + detail::quote(text));
    used[a] = true;
  };
  for (const auto& d : dims)
    for (int a : d) use(a);
  for (int a : partial) use(a);
  return ShardingSpec(std::move(dims), std::move(partial));
}

void ShardingSpec::bad_dim(std::size_t dim) const {
  throw ValidationError("spec", "dim " + std::to_string(dim) + " is out of range for a spec of " +
                                    std::to_string(dims_.size()) + " dims");
}

std::string ShardingSpec::str() const {
  std::ostringstream os;
  for (const auto& d : dims_) {
    if (d.empty()) {
      os << 'R';
      continue;
    }
    os << 'S';
    for (int a : d) os << a;
  }
  if (!partial_.empty()) {
    os << "+P";
    for (int a : partial_) os << a;
  }
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const ShardingSpec& s) { return os << s.str(); }

}  // namespace meshcast
