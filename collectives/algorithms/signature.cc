#include "signature.h"

#include <cstring>

#include "lib/support/fnv.h"
#include "meshcast/error.h"

namespace meshcast::detail {
namespace {

constexpr std::uint64_t kMark = 0x4D43;  // "MC": a word that is not a signature is told apart
constexpr std::uint64_t kRootBits = 0xFFFFFF;

const char* name(Signature::Kind k) {
  switch (k) {
    case Signature::Kind::AllReduce:
      return "all_reduce";
    case Signature::Kind::ReduceScatter:
      return "reduce_scatter";
    case Signature::Kind::AllGather:
      return "all_gather";
    case Signature::Kind::Broadcast:
      return "broadcast";
    case Signature::Kind::AllToAll:
      return "all_to_all";
  }
  return "?";
}

bool reduces(Signature::Kind k) {
  return k == Signature::Kind::AllReduce || k == Signature::Kind::ReduceScatter;
}

}  // namespace

std::uint64_t Signature::word() const {
  return kMark << 48 | (static_cast<std::uint64_t>(root) & kRootBits) << 24 |
         std::uint64_t{static_cast<std::uint8_t>(kind)} << 16 |
         std::uint64_t{static_cast<std::uint8_t>(dtype)} << 8 | static_cast<std::uint8_t>(op);
}

std::string Signature::str() const {
  return std::string(name(kind)) + (reduces(kind) ? " (" + to_string(op) + ")" : "") + " of " +
         to_string(dtype);
}

void Signature::write(std::byte* to) const {
  const std::uint64_t w[2] = {word(), sizes};
  std::memcpy(to, w, kBytes);
}

std::uint64_t Signature::digest(std::span<const std::int64_t> counts) {
  Fnv f;
  for (std::int64_t c : counts) f.add(c);
  return f.h;
}

void Signature::check(const std::byte* written, int device) const {
  std::uint64_t w[2];
  std::memcpy(w, written, kBytes);
  const std::uint64_t theirs = w[0];
  const std::string who = "device " + std::to_string(device);
  if (theirs == word()) {
    if (w[1] == sizes) return;
    if (kind == Kind::AllGather)
      throw ValidationError("counts", who + " passes other counts than this device's to " + str() +
                                          ": every member passes the same counts");
    throw ValidationError("count", who + " passes " + std::to_string(w[1]) + " elements to " +
                                       str() + " where this device passes " +
                                       std::to_string(sizes) +
                                       ": every member passes the same count");
  }
  const auto byte = [&](int shift) { return static_cast<std::uint8_t>(theirs >> shift); };
  if (theirs >> 48 != kMark || byte(16) != static_cast<std::uint8_t>(kind))
    throw ValidationError("collective", who + " runs another collective than this device's " +
                                            str() +
                                            " (members call the same collectives in "
                                            "the same order)");
  Signature other = *this;
  other.dtype = static_cast<DType>(byte(8));
  other.op = static_cast<ReduceOp>(byte(0));
  const bool dtype_differs = other.dtype != dtype;
  if (!dtype_differs && other.op == op)  // then the root
    throw ValidationError("root", who + " calls " + str() + " from root " +
                                      std::to_string(theirs >> 24 & kRootBits) +
                                      " where this device's root is " + std::to_string(root) +
                                      ": every member passes the same root");
  const bool known = byte(8) <= static_cast<std::uint8_t>(DType::c128) &&
                     byte(0) <= static_cast<std::uint8_t>(ReduceOp::Max);
  const std::string theirs_text = known ? other.str() : "an unknown dtype or op";
  throw ValidationError(dtype_differs ? "dtype" : "op",
                        who + " calls " + theirs_text + " where this device calls " + str() +
                            ": every member passes the same " + (dtype_differs ? "dtype" : "op"));
}

}  // namespace meshcast::detail
