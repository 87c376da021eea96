// What one device does in a collective: a program of rounds. A round copies locally, posts its
// sends and receives at once, and when they all completed combines what arrived. The
// algorithms (ring.cc, recursive_doubling.cc, hierarchical.cc, chain.cc, all_to_all.cc) append
// rounds; collective.cc runs them. Internal to collectives/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "meshcast/collectives.h"
#include "meshcast/topology.h"
#include "signature.h"

namespace meshcast::detail {

// One send or receive of a round: ptr[0, bytes) goes to, or arrives from, `peer`.
struct Message {
  int peer = -1;  // device id
  std::byte* ptr = nullptr;
  std::size_t bytes = 0;
  bool signed_ = false;  // its first Signature::kBytes are the sender's signature (signature.h)
};

// to = base op from (base may be to).
struct Combine {
  const std::byte* from = nullptr;
  const std::byte* base = nullptr;
  std::byte* to = nullptr;
  std::int64_t count = 0;  // elements
};

struct LocalCopy {
  const std::byte* from = nullptr;
  std::byte* to = nullptr;
  std::size_t bytes = 0;
};

struct Round {
  std::vector<LocalCopy> copies;  // before posting
  std::vector<Message> sends, recvs;
  std::vector<LocalCopy> arrivals;  // once every message completed (out of signed messages)
  std::vector<Combine> combines;    // then
};

// A contiguous piece of a buffer: elements [lo, hi).
struct Span {
  std::int64_t lo = 0, hi = 0;
  std::int64_t size() const { return hi - lo; }
};

class Program {
 public:
  explicit Program(Signature sig = {}) : sig_(sig), elem_(dtype_size(sig.dtype)) {}
  const Signature& signature() const { return sig_; }
  DType dtype() const { return sig_.dtype; }
  ReduceOp op() const { return sig_.op; }
  std::size_t elem() const { return elem_; }
  std::vector<Round>& rounds() { return rounds_; }
  const std::vector<Round>& rounds() const { return rounds_; }
  Round& add_round() { return rounds_.emplace_back(); }
  // Scratch memory that lives as long as the program.
  std::byte* scratch(std::size_t bytes);
  std::byte* at(void* base, std::int64_t element) const {
    return static_cast<std::byte*>(base) + static_cast<std::size_t>(element) * elem_;
  }

  // The signature exchange (signature.h): this member's signature goes to each peer it sends
  // data to, in front of its first message to it (copied in) when that is small, else alone
  // just before it, on the same tag; the receiver expects alike. check_signature checks one
  // that arrived.
  void exchange_signatures();
  void check_signature(const Message& received) const;

 private:
  Signature sig_;
  std::size_t elem_;
  std::vector<Round> rounds_;
  std::vector<std::unique_ptr<std::byte[]>> scratch_;
};

// The uneven split of [0, count) into n pieces (piece k: [floor(k*count/n), floor((k+1)*count/n))).
std::vector<Span> split(std::int64_t count, std::size_t n);
// Offsets every span by `base`.
std::vector<Span> shifted(std::vector<Span> spans, std::int64_t base);

// Ring algorithms over `members` (device ids in ring order; `me` is the caller's position);
// pieces[k] is member k's piece of the buffers. Reduce-scatter reads the caller's input `src`
// and leaves its piece reduced over the ring at `mine` (piece-sized); the partial sums it
// forwards go to `work` (a whole buffer, e.g. the output of an all-reduce; src itself when in
// place), or, when `work` is null, to two piece-sized scratch slots. All-gather spreads every
// member's piece of `buf` to all.
void ring_reduce_scatter(Program& p, std::span<const int> members, std::size_t me, const void* src,
                         void* work, void* mine, const std::vector<Span>& pieces);
void ring_all_gather(Program& p, std::span<const int> members, std::size_t me, void* buf,
                     const std::vector<Span>& pieces);
// All-reduce of buf[piece] by recursive doubling (members beyond the largest power of two fold
// into it first and get the result back at the end).
void recursive_doubling_all_reduce(Program& p, std::span<const int> members, std::size_t me,
                                   void* buf, Span piece);
// All-gather by recursive doubling among a power-of-two number of members: log2(n) rounds,
// each exchanging everything gathered so far with the partner.
void doubling_all_gather(Program& p, std::span<const int> members, std::size_t me, void* buf,
                         const std::vector<Span>& pieces);
// All-gather in ceil(log2(n)) rounds for any n (Bruck's algorithm, in place): round k passes
// up to 2^k pieces to the member 2^k before, so a piece travels as many hops as its distance
// has bits set. More bytes over each link than the ring, far fewer rounds: for small messages.
void bruck_all_gather(Program& p, std::span<const int> members, std::size_t me, void* buf,
                      const std::vector<Span>& pieces);
// All-reduce of src (count elements) into buf by recursive halving (a reduce-scatter in
// log2(n) rounds, each exchanging half of what is left) and recursive doubling (the all-gather
// back): the ring's bytes in 2 log2(n) rounds instead of 2(n - 1).
void halving_doubling_all_reduce(Program& p, std::span<const int> members, std::size_t me,
                                 const void* src, void* buf, std::int64_t count);
// All-reduce in three levels: ring reduce-scatter inside each host, all-reduce of each local
// piece across hosts (ring), ring all-gather inside each host. `hosts[h]` lists the group
// positions on host h, every host with the same number, in the same local order.
void hierarchical_all_reduce(Program& p, std::span<const int> members, std::size_t me, void* buf,
                             std::int64_t count,
                             const std::vector<std::vector<std::size_t>>& hosts);
// All-gather across hosts, then inside them: a ring among the devices of each local index
// (H - 1 rounds; a host's link carries what a ring in host order puts on it), then one round in
// which the devices of a host exchange what their rings gathered. `hosts` as above.
void hierarchical_all_gather(Program& p, std::span<const int> members, std::size_t me, void* buf,
                             const std::vector<Span>& pieces,
                             const std::vector<std::vector<std::size_t>>& hosts);
// Reduce-scatter inside hosts, then across them: one round in which each device sends every
// other device of its host that device's rail's pieces of src and sums what it receives for its
// own rail, then a ring among the devices of each local index (H - 1 rounds). The caller's
// piece (pieces[me] of src's layout) ends in `mine`. `hosts` as above.
void hierarchical_reduce_scatter(Program& p, std::span<const int> members, std::size_t me,
                                 const void* src, void* mine, const std::vector<Span>& pieces,
                                 const std::vector<std::vector<std::size_t>>& hosts);
// Broadcast of buf[0, bytes) from members[0] along the chain members[0] -> members[1] -> ...,
// in chunks, each member forwarding chunk k while it receives chunk k + 1.
void chain_broadcast(Program& p, std::span<const int> members, std::size_t me, void* buf,
                     std::size_t bytes, std::size_t chunk);
// What the algorithms cost, for `bytes` in all (the whole vector) over `members` on `t`: each
// states its rounds (how many messages each member posts, of how many bytes, to whom) and
// round_cost prices a round with the one cost model (meshcast/cost.h, round_seconds). `auto`
// runs the cheapest. `hosts` as for the hierarchical algorithms.
struct CostOf {
  std::span<const int> members;
  const Topology& t;
  double bytes;
};
// A round in which member i posts `messages` messages of `bytes` each to members[to(i)] (to(i)
// == i: none): the messages to other hosts share the NICs they leave through.
double round_cost(std::span<const int> members, const Topology& t, double bytes,
                  std::size_t messages, const std::function<std::size_t(std::size_t)>& to);
double ring_all_reduce_cost(const CostOf& c);
double ring_reduce_scatter_cost(const CostOf& c);
double ring_all_gather_cost(const CostOf& c);
double recursive_doubling_all_reduce_cost(const CostOf& c);
double doubling_all_gather_cost(const CostOf& c);
double bruck_all_gather_cost(const CostOf& c);
double hierarchical_all_reduce_cost(const CostOf& c,
                                    const std::vector<std::vector<std::size_t>>& hosts);
double hierarchical_all_gather_cost(const CostOf& c,
                                    const std::vector<std::vector<std::size_t>>& hosts);
double hierarchical_reduce_scatter_cost(const CostOf& c,
                                        const std::vector<std::vector<std::size_t>>& hosts);

// All-to-all(v): every send block posted at once, the caller's own block copied.
void all_to_allv(Program& p, std::span<const int> members, std::size_t me, const void* send,
                 std::span<const std::int64_t> send_counts, void* recv,
                 std::span<const std::int64_t> recv_counts);

}  // namespace meshcast::detail
