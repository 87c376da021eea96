// Communicator::agree over a binomial tree of the group's members (log2(n) deep, n-1 messages a
// pass, a member waits on at most log2(n) others): the least group rank that failed goes up to
// the first member and back down to every member, then, when one failed, its error goes from it
// to every member as one record of bounded size. Members hold O(log n) state. Its messages live on
// the stack: a failed wait cancels them (wait_all_or_cancel) before the stack unwinds.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "lib/support/agreed.h"
#include "meshcast/communicator.h"

namespace meshcast {
namespace {

constexpr std::size_t kFieldBytes = 96, kCauseBytes = 900;

// Which named constructor made the error, so that every member throws the same type (a caller
// catching ValidationError or IoError still catches it).
enum class Type : std::uint8_t { Plain, Parse, Validation, Io, Comm, Internal };

// An error as it travels (raw bytes between processes of one build).
struct Record {
  std::int32_t device = -1;
  std::uint16_t field_bytes = 0, cause_bytes = 0;
  std::uint8_t type = 0, kind = 0;
  char text[kFieldBytes + kCauseBytes] = {};  // field, then cause
};

// At most `max` bytes of `s`, cut at a UTF-8 character boundary and marked as cut.
std::string cut(const std::string& s, std::size_t max) {
  if (s.size() <= max) return s;
  std::size_t n = max - 3;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n) + "...";
}

Type type_of(const Error& e) {
  if (dynamic_cast<const ParseError*>(&e)) return Type::Parse;
  if (dynamic_cast<const ValidationError*>(&e)) return Type::Validation;
  if (dynamic_cast<const IoError*>(&e)) return Type::Io;
  if (dynamic_cast<const CommError*>(&e)) return Type::Comm;
  if (dynamic_cast<const InternalError*>(&e)) return Type::Internal;
  return Type::Plain;
}

Record encode(const Error& e) {
  Record r;
  const std::string field = cut(e.field(), kFieldBytes), cause = cut(e.cause(), kCauseBytes);
  r.device = e.device();
  r.field_bytes = static_cast<std::uint16_t>(field.size());
  r.cause_bytes = static_cast<std::uint16_t>(cause.size());
  r.type = static_cast<std::uint8_t>(type_of(e));
  r.kind = static_cast<std::uint8_t>(e.kind());
  std::memcpy(r.text, field.data(), field.size());
  std::memcpy(r.text + field.size(), cause.data(), cause.size());
  return r;
}

[[noreturn]] void raise(const Record& r) {
  if (r.field_bytes > kFieldBytes || r.cause_bytes > kCauseBytes ||
      r.type > static_cast<std::uint8_t>(Type::Internal) ||
      r.kind > static_cast<std::uint8_t>(ErrorKind::Internal))
    throw InternalError("agree", "received a malformed error record");
  std::string field(r.text, r.field_bytes), cause(r.text + r.field_bytes, r.cause_bytes);
  switch (static_cast<Type>(r.type)) {
    case Type::Parse:
      detail::throw_agreed(ParseError(std::move(field), std::move(cause)));
    case Type::Validation:
      detail::throw_agreed(ValidationError(std::move(field), std::move(cause)));
    case Type::Io:
      detail::throw_agreed(IoError(std::move(field), std::move(cause)));
    case Type::Comm:
      if (r.device >= 0) detail::throw_agreed(CommError(r.device, std::move(cause)));
      detail::throw_agreed(CommError(std::move(field), std::move(cause)));
    case Type::Internal:
      detail::throw_agreed(InternalError(std::move(field), std::move(cause)));
    case Type::Plain:
      break;
  }
  detail::throw_agreed(
      Error(static_cast<ErrorKind>(r.kind), std::move(field), std::move(cause), r.device));
}

// A binomial tree over the n members of a group rooted at group rank `root`: a member's parent
// (-1 at the root) and children, as group ranks.
struct Tree {
  Tree(int me, int root, int n) {
    const int r = (me - root + n) % n;  // relative to the root
    int bit = 1;
    for (; bit < n && (r & bit) == 0; bit <<= 1)
      if (r + bit < n) children.push_back((r + bit + root) % n);
    parent = r == 0 ? -1 : (r - bit + root) % n;
  }
  int parent;
  std::vector<int> children;
};

// The least `value` of the members of this member's subtree (of every member, at the root); sent
// on to the parent.
std::int64_t least(Communicator& comm, const Tree& t, const std::vector<int>& devices,
                   std::int64_t value, int tag) {
  std::vector<std::int64_t> below(t.children.size());
  std::vector<Request> reqs;
  for (std::size_t i = 0; i < below.size(); ++i)
    reqs.push_back(comm.irecv(Region::contiguous(&below[i], sizeof value),
                              devices[static_cast<std::size_t>(t.children[i])], tag));
  comm.wait_all_or_cancel(reqs);
  for (auto b : below) value = std::min(value, b);
  if (t.parent >= 0) {
    Request r = comm.isend(Region::contiguous(&value, sizeof value),
                           devices[static_cast<std::size_t>(t.parent)], tag);
    comm.wait_all_or_cancel({&r, 1});
  }
  return value;
}

// The root's `bytes` at `data` to every member's `data`.
void broadcast(Communicator& comm, const Tree& t, const std::vector<int>& devices, void* data,
               std::size_t bytes, int tag) {
  const Region region = Region::contiguous(data, bytes);
  if (t.parent >= 0) {
    Request r = comm.irecv(region, devices[static_cast<std::size_t>(t.parent)], tag);
    comm.wait_all_or_cancel({&r, 1});
  }
  std::vector<Request> reqs;
  for (int c : t.children)
    reqs.push_back(comm.isend(region, devices[static_cast<std::size_t>(c)], tag));
  comm.wait_all_or_cancel(reqs);
}

}  // namespace

void Communicator::agree(const Group& group, const Error* mine) {
  const int me = group.index_of(rank_);
  if (me < 0)
    throw ValidationError("group", "device " + std::to_string(rank_) + " is not a member");
  const std::vector<int>& devices = group.devices();
  const int n = group.size();
  if (n == 1) {
    if (mine) raise(encode(*mine));
    return;
  }
  const TagBlock tags = group.reserve(3);
  Record verdict;
  try {
    const Tree tree(me, 0, n);
    // The group rank of the first member that failed; n: none did.
    std::int64_t first = least(*this, tree, devices, mine ? me : n, tags.tag(0));
    broadcast(*this, tree, devices, &first, sizeof first, tags.tag(1));
    if (first == n) return;
    if (first < 0 || first > n)
      throw InternalError("agree", "received the rank " + std::to_string(first) +
                                       " in a group of " + std::to_string(n));
    if (first == me) verdict = encode(*mine);
    broadcast(*this, Tree(me, static_cast<int>(first), n), devices, &verdict, sizeof verdict,
              tags.tag(2));
  } catch (const std::exception& e) {
    abandon_for(e);  // a member that died: every survivor reports it
    throw;
  }
  raise(verdict);
}

}  // namespace meshcast
