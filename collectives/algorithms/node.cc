// Node-memory collectives. Each member owns one segment: a line with the stamp of its current
// publication, lines recording that publication for the owner (stamp, readers and their
// devices), one acknowledgement line per reader position, then the data area. A member
// publishes by waiting until every reader of its previous publication acknowledged it, writing
// the data and storing the new stamp (release); a reader waits for the stamp it expects
// (acquire), copies, and stores that stamp in its acknowledgement line. Stamps name
// (collective, step) in 64 bits, so a stale stamp or acknowledgement is not mistaken for a
// current one (short of a hash collision); a publication waits only on acknowledgements and a
// read only on publications, so members that run the same steps, each group's collectives in
// the same order, cannot wait on each other in a cycle.
#include "node.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

namespace meshcast::detail {
namespace {

constexpr std::size_t kLine = 64;  // one writer per cache line
constexpr std::size_t kMaxMembers = 64;
// Line 0: the stamp; line 1: the owner's record (stamp, readers, its position, its collective's
// signature, which a reader checks against its own before it uses the data); lines 2-5: the
// readers' devices (for errors); then one acknowledgement line per reader position.
constexpr std::size_t kRecord = kLine, kDevices = 2 * kLine, kAcks = 6 * kLine;
constexpr std::size_t kHeader = kAcks + kLine * kMaxMembers;
static_assert(kMaxMembers * sizeof(int) <= kAcks - kDevices);
static_assert(3 * sizeof(std::uint64_t) + Signature::kBytes <= kLine);
static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free,
              "node memory needs lock-free 64-bit atomics (other processes see them)");
// Up to this size an all-reduce reduces whole vectors (bench/mpi_collectives: below it the two
// waits of reduce-scatter + all-gather cost more than reading every member's vector).
constexpr std::size_t kWholeBytes = std::size_t{16} << 10;

std::atomic_ref<std::uint64_t> word(std::byte* p) {
  return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(p));
}

std::size_t capacity(Communicator& comm) {
  const std::size_t bytes = comm.node_segment_bytes();
  return bytes > kHeader ? (bytes - kHeader) / kLine * kLine : 0;
}

template <class Ready>
void spin_until(Communicator& comm, std::span<const int> peers, Ready&& ready) {
  if (ready()) return;
  const auto since = std::chrono::steady_clock::now();
  for (int polls = 1; !ready(); ++polls) comm.idle(peers, polls, since);
}

// One member's publications and reads within one collective.
class Exchange {
 public:
  Exchange(const Group& group, std::size_t me, const Signature& sig)
      : comm_(group.comm()),
        group_(group.devices()),
        me_(me),
        id_((group.next_id() >> 1) + 1),
        sig_(sig) {}

  std::size_t capacity() const { return detail::capacity(comm_); }
  // This member's data area (what it published last).
  const std::byte* own() const { return comm_.node_segment(group_[me_]) + kHeader; }

  template <class Write>
  void publish(std::uint64_t step, Write&& write) {
    std::byte* seg = comm_.node_segment(group_[me_]);
    // stamp, readers, position, signature
    auto* last = reinterpret_cast<std::uint64_t*>(seg + kRecord);
    auto* devices = reinterpret_cast<int*>(seg + kDevices);
    if (last[0] != 0)
      for (std::size_t i = 0; i < last[1]; ++i)
        if (i != last[2])
          spin_until(comm_, std::span<const int>(devices + i, 1),
                     [&] { return word(ack(seg, i)).load() == last[0]; });
    write(seg + kHeader);
    last[0] = stamp(step);
    last[1] = group_.size();
    last[2] = me_;
    sig_.write(reinterpret_cast<std::byte*>(last + 3));
    std::copy(group_.begin(), group_.end(), devices);
    word(seg).store(last[0], std::memory_order_release);
  }

  template <class Read>
  void read(std::size_t j, std::uint64_t step, Read&& read) {
    std::byte* seg = comm_.node_segment(group_[j]);
    const std::uint64_t s = stamp(step);
    spin_until(comm_, group_.subspan(j, 1),
               [&] { return word(seg).load(std::memory_order_acquire) == s; });
    // The owner rewrites its record only once every reader acknowledged: still this one's.
    sig_.check(seg + kRecord + 3 * sizeof(std::uint64_t), group_[j]);
    read(static_cast<const std::byte*>(seg + kHeader));
    word(ack(seg, me_)).store(s, std::memory_order_release);
  }

 private:
  static std::byte* ack(std::byte* seg, std::size_t position) {
    return seg + kAcks + kLine * position;
  }
  // id_ is in [1, 2^63]: never 0 (a fresh segment's stamp) for any step a collective takes.
  std::uint64_t stamp(std::uint64_t step) const { return id_ + step; }

  Communicator& comm_;
  std::span<const int> group_;
  std::size_t me_;
  std::uint64_t id_;
  Signature sig_;
};

// The all-gather's sizes as the transports' path signs them (Signature::digest of the counts).
std::uint64_t digest(const std::vector<Span>& pieces) {
  std::vector<std::int64_t> counts;
  for (const Span& s : pieces) counts.push_back(s.size());
  return Signature::digest(counts);
}

std::size_t bytes_of(const Span& s, std::size_t elem) {
  return static_cast<std::size_t>(s.size()) * elem;
}

// Steps first, first + 1, ...: every member's piece in chunks of the data area. Returns the
// number of steps.
std::uint64_t gather(Exchange& ex, std::uint64_t first, std::size_t me, const std::byte* send,
                     std::byte* recv, const std::vector<Span>& pieces, std::size_t elem) {
  const std::size_t cap = ex.capacity(), n = pieces.size(), mine = bytes_of(pieces[me], elem);
  std::byte* own = recv + static_cast<std::size_t>(pieces[me].lo) * elem;
  if (own != send && mine) std::memmove(own, send, mine);
  std::size_t most = 0;
  for (const Span& s : pieces) most = std::max(most, bytes_of(s, elem));
  const std::uint64_t steps = (most + cap - 1) / cap;
  for (std::uint64_t s = 0; s < steps; ++s) {
    const std::size_t at = s * cap;
    if (at < mine)  // from the caller's place in recv: send may overlap it
      ex.publish(first + s,
                 [&](std::byte* d) { std::memcpy(d, own + at, std::min(cap, mine - at)); });
    for (std::size_t k = 1; k < n; ++k) {
      const std::size_t j = (me + k) % n, theirs = bytes_of(pieces[j], elem);
      if (at < theirs)
        ex.read(j, first + s, [&](const std::byte* d) {
          std::memcpy(recv + static_cast<std::size_t>(pieces[j].lo) * elem + at, d,
                      std::min(cap, theirs - at));
        });
    }
  }
  return steps;
}

// Steps first, first + 1, ...: each publishes the next chunk of every member's piece of its
// input, and each member reduces its own chunk from all. Returns the number of steps.
std::uint64_t reduce(Exchange& ex, std::uint64_t first, std::size_t me, const std::byte* send,
                     std::byte* out, const std::vector<Span>& pieces, DType dtype, ReduceOp op) {
  const std::size_t elem = dtype_size(dtype), n = pieces.size();
  const auto chunk = static_cast<std::int64_t>(ex.capacity() / (n * elem));  // per member
  std::int64_t most = 0;
  for (const Span& s : pieces) most = std::max(most, s.size());
  const auto steps = static_cast<std::uint64_t>((most + chunk - 1) / chunk);
  // Member j's elements of step s: [pieces[j].lo + s * chunk, + count_of(j, s)).
  auto count_of = [&](std::size_t j, std::uint64_t s) {
    return std::clamp<std::int64_t>(pieces[j].size() - static_cast<std::int64_t>(s) * chunk, 0,
                                    chunk);
  };
  auto at = [&](const std::byte* base, std::size_t j, std::uint64_t s) {
    return base +
           static_cast<std::size_t>(pieces[j].lo + static_cast<std::int64_t>(s) * chunk) * elem;
  };
  for (std::uint64_t s = 0; s < steps; ++s) {
    ex.publish(first + s, [&](std::byte* d) {
      for (std::size_t j = 0; j < n; ++j)  // the caller's own piece: nobody reads it
        if (j != me && count_of(j, s))
          std::memcpy(d + j * static_cast<std::size_t>(chunk) * elem, at(send, j, s),
                      static_cast<std::size_t>(count_of(j, s)) * elem);
    });
    const std::int64_t count = count_of(me, s);
    // Every member reads every publication (its owner waits for all acknowledgements), also
    // when none of the step is the caller's.
    std::byte* to =
        count ? out + static_cast<std::size_t>(static_cast<std::int64_t>(s) * chunk) * elem
              : nullptr;
    if (count && to != at(send, me, s))
      std::memmove(to, at(send, me, s), static_cast<std::size_t>(count) * elem);
    for (std::size_t k = 1; k < n; ++k)
      ex.read((me + k) % n, first + s, [&](const std::byte* d) {
        if (count)
          reduce_into(d + me * static_cast<std::size_t>(chunk) * elem, to, count, dtype, op);
      });
  }
  return steps;
}

}  // namespace

bool node_capable(const Group& group) {
  const std::vector<int>& members = group.devices();
  if (members.size() < 2 || members.size() > kMaxMembers) return false;
  // A chunk of at least a line per member (an element of every dtype).
  Communicator& comm = group.comm();
  if (capacity(comm) < members.size() * kLine) return false;
  return std::all_of(members.begin(), members.end(),
                     [&](int d) { return comm.node_segment(d) != nullptr; });
}

void node_all_gatherv(const Group& group, std::size_t me, const void* send, void* recv,
                      const std::vector<Span>& pieces, DType dtype) {
  Exchange ex(group, me, {Signature::Kind::AllGather, dtype, ReduceOp::Sum, 0, digest(pieces)});
  gather(ex, 0, me, static_cast<const std::byte*>(send), static_cast<std::byte*>(recv), pieces,
         dtype_size(dtype));
}

void node_reduce_scatter(const Group& group, std::size_t me, const void* send, void* recv,
                         const std::vector<Span>& pieces, DType dtype, ReduceOp op) {
  Exchange ex(group, me,
              {Signature::Kind::ReduceScatter, dtype, op, 0,
               static_cast<std::uint64_t>(pieces.empty() ? 0 : pieces.back().hi)});
  reduce(ex, 0, me, static_cast<const std::byte*>(send), static_cast<std::byte*>(recv), pieces,
         dtype, op);
}

void node_all_reduce(const Group& group, std::size_t me, const void* send, void* recv,
                     std::int64_t count, DType dtype, ReduceOp op) {
  Exchange ex(group, me,
              {Signature::Kind::AllReduce, dtype, op, 0, static_cast<std::uint64_t>(count)});
  auto* out = static_cast<std::byte*>(recv);
  const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(dtype);
  if (bytes <= std::min(kWholeBytes, ex.capacity())) {
    // Every member publishes the whole vector and reduces all of them, in group order so that
    // every member ends with the same bits: one wait for the others instead of two.
    // Also an empty vector, whose signature says so to members given more.
    ex.publish(0, [&](std::byte* d) {
      if (bytes) std::memcpy(d, send, bytes);
    });
    for (std::size_t j = 0; j < group.devices().size(); ++j) {
      auto combine = [&](const std::byte* d) {
        if (!bytes) return;
        if (j == 0)
          std::memcpy(out, d, bytes);  // in place, the caller's input is in its segment
        else
          reduce_into(d, out, count, dtype, op);
      };
      if (j == me)
        combine(ex.own());
      else
        ex.read(j, 0, combine);
    }
    return;
  }
  const std::vector<Span> pieces = split(count, group.devices().size());
  std::byte* mine = out + static_cast<std::size_t>(pieces[me].lo) * dtype_size(dtype);
  const std::uint64_t steps =
      reduce(ex, 0, me, static_cast<const std::byte*>(send), mine, pieces, dtype, op);
  gather(ex, steps, me, mine, out, pieces, dtype_size(dtype));
}

}  // namespace meshcast::detail
