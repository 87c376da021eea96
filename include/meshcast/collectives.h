// Collectives over the Communicator interface (any backend: local, mpi, ucx, nccl): all-reduce,
// reduce-scatter, all-gather, broadcast and all-to-all(v) among a group of devices, started
// without blocking and finished later, so that compute runs while they progress.
//
// Every member of `group` (its devices, in the order that defines ranks within it; see
// Communicator::group) calls the same collective with the same arguments, in the same order as
// its other operations on that group (collectives and reshards). Buffers are contiguous, hold
// `dtype` elements, and stay valid until the handle completes. A count that the group size does not
// divide is fine: rank k of n owns the range [floor(k*count/n), floor((k+1)*count/n)) (meshcast's
// uneven split).
//
// Every entry point checks its arguments before it sends anything (a refused call takes nothing
// from the group's sequence), and throws ValidationError naming the argument: "group" (a
// default-constructed one, or the caller not in it), "count" / "counts" / "send_counts" /
// "recv_counts" (negative, sizes whose bytes overflow 64 bits, a count list of the wrong length),
// "dtype" / "op" (not one of the enumerators; "op" also for max over c64 / c128, which have no
// order), and "send", "recv" or "buf" when null while it must hold elements (null is fine for
// zero elements).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meshcast/communicator.h"
#include "meshcast/dtype.h"
#include "meshcast/topology.h"

namespace meshcast {

// Sum: integers wrap modulo 2^bits (as numpy's add), bool is logical or, complex numbers add
// componentwise. Max: bool is logical or; c64 / c128 are refused (ValidationError "op").
// Max over floats: a NaN wins (numpy's maximum), +0 over -0; every member gets the same bits.
// A float sum that is NaN is the one quiet NaN (of two NaNs the hardware keeps either's bits).
enum class ReduceOp { Sum, Max };
std::string to_string(ReduceOp op);
ReduceOp parse_reduce_op(std::string_view text, const std::string& field = "op");

// to[i] = to[i] op from[i] for i < count; half types are combined in float and rounded once.
// Throws ValidationError("op") for max over a complex dtype.
void reduce_into(const void* from, void* to, std::int64_t count, DType dtype, ReduceOp op);
// to[i] = base[i] op from[i]; `to` may be `base` (then it is reduce_into).
void reduce_into(const void* from, const void* base, void* to, std::int64_t count, DType dtype,
                 ReduceOp op);

enum class Algorithm {
  Auto,               // the cheapest for this size on options.topology (one host if null)
                      // by the cost model of meshcast/cost.h: each algorithm states its rounds'
                      // latencies, per-message overheads and bytes per link (round_seconds);
                      // no size thresholds
  Ring,               // bandwidth-optimal: 2(n-1)/n of the data over each link (all-reduce)
  RecursiveDoubling,  // log2(n) rounds, for small sizes: whole-vector exchanges (all-reduce;
                      // the reduce-scatter all-reduces and keeps its piece); the all-gather's
                      // doubling blocks, or Bruck's algorithm when n is not a power of two
  HalvingDoubling,    // recursive halving, then doubling: the ring's bytes in 2 log2(n) rounds
  Hierarchical,       // all-reduce: reduce-scatter inside hosts, all-reduce across hosts,
                      // all-gather inside; all-gather: across hosts, then inside; reduce-scatter:
                      // inside hosts, then across
  SharedMemory,       // blocking forms only: each member copies its data into node memory once
                      // and the others copy it out (Communicator::node_segment); Auto takes it
                      // in the blocking forms when every member maps its segment here
};
std::string to_string(Algorithm a);
Algorithm parse_algorithm(std::string_view text, const std::string& field = "algorithm");

struct CollectiveOptions {
  Algorithm algorithm = Algorithm::Auto;
  // Where the group's devices live (Hierarchical and Auto use it); null: one host.
  const Topology* topology = nullptr;
};

// A collective in flight. test() moves it on as far as it can without blocking and says
// whether it finished; wait() finishes it. Progress happens inside these calls (no thread of
// its own), inside a later operation on the same group that needs its tags (Group::reserve),
// and while the device waits on another operation (InFlight::poll; not where the transport
// matches in issue order, TransportCaps::ordered_matching): a compute loop that calls test()
// now and then overlaps it. Every message of a collective
// carries the one tag its group reserved for it, so any number may be in flight on a group. A
// failed peer makes them throw CommError naming it.
class Collective {
 public:
  struct State;
  Collective();
  explicit Collective(std::shared_ptr<State> s);
  ~Collective();
  Collective(Collective&&) noexcept;
  Collective& operator=(Collective&&) noexcept;
  bool test();
  void wait();
  bool done() const;
  // Bytes this device sent and received (what the benchmarks count as traffic).
  std::int64_t bytes_sent() const;

 private:
  std::shared_ptr<State> s_;
};

// recv = op over the group of send; recv may equal send (in place).
Collective iall_reduce(const Group& group, const void* send, void* recv, std::int64_t count,
                       DType dtype, ReduceOp op, const CollectiveOptions& options = {});
// recv (the caller's shard of count elements: its range of the uneven split) = op over the
// group of send (count elements).
Collective ireduce_scatter(const Group& group, const void* send, void* recv, std::int64_t count,
                           DType dtype, ReduceOp op, const CollectiveOptions& options = {});
// recv (count elements) = every member's shard, in group order; the caller sends its own shard
// (its range of the uneven split of count). send may point at that range of recv (in place).
Collective iall_gather(const Group& group, const void* send, void* recv, std::int64_t count,
                       DType dtype, const CollectiveOptions& options = {});
// recv = every member's block, in group order, member j's block holding counts[j] elements;
// the caller sends its own block of counts[me] elements (send may point at it in recv).
Collective iall_gatherv(const Group& group, const void* send, void* recv,
                        std::span<const std::int64_t> counts, DType dtype,
                        const CollectiveOptions& options = {});
// buf (count elements) of the group member `root` (a device id) to every member, as a
// pipelined chain of chunks (its one algorithm: options.algorithm other than Auto is refused).
// A member that names another root than its predecessor in the chain fails with ValidationError
// "root" (members pass their signatures on: docs/design.md, "Members that disagree"); one that
// names itself the root receives nothing and cannot tell.
Collective ibroadcast(const Group& group, int root, void* buf, std::int64_t count, DType dtype,
                      const CollectiveOptions& options = {});
// Member j's block send_counts[k] goes to member k, which receives recv_counts[j] elements from
// member j; blocks are packed in group order in both buffers. Every block is posted at once (its
// one algorithm: options.algorithm other than Auto is refused); an empty one too, as a message
// of the 16-byte signature alone (docs/design.md, "Members that disagree").
Collective iall_to_allv(const Group& group, const void* send,
                        std::span<const std::int64_t> send_counts, void* recv,
                        std::span<const std::int64_t> recv_counts, DType dtype,
                        const CollectiveOptions& options = {});

// Blocking forms.
void all_reduce(const Group& group, const void* send, void* recv, std::int64_t count, DType dtype,
                ReduceOp op, const CollectiveOptions& o = {});
void reduce_scatter(const Group& group, const void* send, void* recv, std::int64_t count,
                    DType dtype, ReduceOp op, const CollectiveOptions& o = {});
void all_gather(const Group& group, const void* send, void* recv, std::int64_t count, DType dtype,
                const CollectiveOptions& o = {});
void all_gatherv(const Group& group, const void* send, void* recv,
                 std::span<const std::int64_t> counts, DType dtype,
                 const CollectiveOptions& o = {});
void broadcast(const Group& group, int root, void* buf, std::int64_t count, DType dtype,
               const CollectiveOptions& o = {});
void all_to_allv(const Group& group, const void* send, std::span<const std::int64_t> send_counts,
                 void* recv, std::span<const std::int64_t> recv_counts, DType dtype,
                 const CollectiveOptions& o = {});

}  // namespace meshcast
