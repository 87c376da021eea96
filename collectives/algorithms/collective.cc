// The collectives' front: checks the arguments, picks an algorithm, builds the device's program
// of rounds (program.h) and runs it round by round as test() and wait() are called.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <limits>

#include "lib/support/raised.h"
#include "meshcast/box.h"
#include "meshcast/cost.h"
#include "meshcast/error.h"
#include "node.h"
#include "program.h"

namespace meshcast {
namespace {

using detail::Program;
using detail::Signature;
using detail::Span;

constexpr std::size_t kBroadcastChunk = std::size_t{256} << 10;

// The caller's rank in the group (Communicator::group refuses empty lists and duplicates).
std::size_t position(const Group& group) {
  const int me = group.comm().rank();
  const int at = group.index_of(me);
  if (at < 0)
    throw ValidationError("group", "device " + std::to_string(me) + " is not in the group");
  return static_cast<std::size_t>(at);
}

void check_count(std::int64_t count, const char* field = "count") {
  if (count < 0) throw ValidationError(field, "must be >= 0 (got " + std::to_string(count) + ")");
}

// The element type is one of DType's, and `count` elements of it fit in 64-bit byte counts.
void check_size(std::int64_t count, DType dtype, const char* field = "count") {
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  if (elem == 0)
    throw ValidationError("dtype", "unknown dtype " + std::to_string(static_cast<int>(dtype)));
  if (count > std::numeric_limits<std::int64_t>::max() / elem)
    throw ValidationError(field, std::to_string(count) + " elements of " + to_string(dtype) +
                                     " overflow 64-bit byte counts");
}

// One of ReduceOp's, and defined on the dtype (complex numbers have no order for max).
void check_op(ReduceOp op, DType dtype) {
  if (op != ReduceOp::Sum && op != ReduceOp::Max)
    throw ValidationError("op", "unknown reduction " + std::to_string(static_cast<int>(op)));
  if (op == ReduceOp::Max && is_complex(dtype))
    throw ValidationError(
        "op", "max is not defined for " + to_string(dtype) + " (complex numbers have no order)");
}

// A buffer that must hold `count` elements: null only when there are none.
void check_buffer(const void* p, std::int64_t count, const char* field) {
  if (!p && count > 0)
    throw ValidationError(field, "is null but must hold " + std::to_string(count) + " elements");
}

// Sum of block counts, each >= 0, without overflowing.
std::int64_t total(std::span<const std::int64_t> counts, const char* field) {
  std::int64_t sum = 0;
  for (std::int64_t c : counts) {
    check_count(c, field);
    if (c > std::numeric_limits<std::int64_t>::max() - sum)
      throw ValidationError(field, "the counts add up past 64 bits");
    sum += c;
  }
  return sum;
}

// The arguments of an all-reduce / reduce-scatter (send: count elements; recv: `recv_count`).
void check_reduction(const void* send, void* recv, std::int64_t count, std::int64_t recv_count,
                     DType dtype, ReduceOp op) {
  check_count(count);
  check_size(count, dtype);
  check_op(op, dtype);
  check_buffer(send, count, "send");
  check_buffer(recv, recv_count, "recv");
}

// The hosts of the group's positions, when the topology puts the group on several hosts with
// the same number of devices each (else empty).
std::vector<std::vector<std::size_t>> host_groups(std::span<const int> group, const Topology* t) {
  if (!t) return {};
  std::vector<std::pair<int, std::size_t>> by_host;
  for (std::size_t i = 0; i < group.size(); ++i) by_host.emplace_back(t->host_of(group[i]), i);
  std::stable_sort(by_host.begin(), by_host.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::vector<std::size_t>> hosts;
  for (std::size_t i = 0; i < by_host.size(); ++i) {
    if (i == 0 || by_host[i].first != by_host[i - 1].first) hosts.emplace_back();
    hosts.back().push_back(by_host[i].second);
  }
  for (const auto& h : hosts)
    if (h.size() != hosts.front().size()) return {};
  if (hosts.size() < 2 || hosts.front().size() < 2) return {};
  return hosts;
}

Collective start(const Group& group, Program program);

// The node-memory algorithm blocks (collectives/node.h); the non-blocking forms refuse it.
void check_not_node(const CollectiveOptions& o) {
  if (o.algorithm == Algorithm::SharedMemory)
    throw ValidationError("algorithm",
                          "shared-memory runs only in the blocking forms (all_reduce, "
                          "reduce_scatter, all_gather, all_gatherv)");
}

// Broadcast and all-to-all(v) have one algorithm each (a chain; every block at once): another
// is refused rather than ignored.
void check_single_algorithm(const CollectiveOptions& o, const char* what) {
  if (o.algorithm != Algorithm::Auto)
    throw ValidationError("algorithm", std::string(what) + " has one algorithm; '" +
                                           to_string(o.algorithm) + "' does not apply (use auto)");
}

// Whether a blocking collective goes through node memory: asked for, or Auto with every member
// on this node (then each byte is copied once into node memory and once out, not twice per
// transfer as a shared-memory transport does; bench/mpi_collectives measures both).
bool through_node(const Group& group, const CollectiveOptions& o) {
  if (o.algorithm != Algorithm::Auto && o.algorithm != Algorithm::SharedMemory) return false;
  const bool capable = detail::node_capable(group);
  if (!capable && o.algorithm == Algorithm::SharedMemory)
    throw ValidationError("algorithm",
                          "shared-memory needs 2 to 64 members, all on this device's node, and a "
                          "backend that maps node memory (MPI; local when asked)");
  return capable;
}

constexpr const char* kHierarchicalNeeds =
    "hierarchical needs a topology that puts the group on several hosts with the same number "
    "of devices (at least 2) each";

// Member pieces of an all-gatherv, from their counts; checks the buffers (the caller's piece in
// send, all of them in recv).
std::vector<Span> gather_pieces(std::span<const int> group, std::span<const std::int64_t> counts,
                                const void* send, const void* recv, std::size_t me, DType dtype) {
  if (counts.size() != group.size())
    throw ValidationError("counts", "has " + std::to_string(counts.size()) +
                                        " entries for a group of " + std::to_string(group.size()));
  const std::int64_t sum = total(counts, "counts");
  check_size(sum, dtype, "counts");
  check_buffer(send, counts[me], "send");
  check_buffer(recv, sum, "recv");
  std::vector<Span> pieces;
  std::int64_t at = 0;
  for (std::int64_t c : counts) {
    pieces.push_back({at, at + c});
    at += c;
  }
  return pieces;
}

}  // namespace

// A device that fails while a collective is in flight tells the others, so that they end at
// once with its name rather than after their timeout. (Arguments are checked before anything
// is sent, the same on every member: a refused call tells no one and leaves the group usable.)
template <class F>
auto guarded(Communicator& comm, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    comm.abandon_for(e);
    throw;
  }
}

// A collective's rounds in flight; the engine sees it as an InFlight, so that a later operation
// on the group that needs its tag finishes it first.
struct Collective::State : InFlight {
  Communicator* comm = nullptr;
  int tag = 0;
  Program program;
  std::size_t next = 0;  // the next round to post
  bool posted = false;   // round next - 1 is in flight
  std::vector<Request> reqs;
  std::vector<const detail::Message*> heads;  // per request: the signed receive it is, or null
  std::int64_t sent = 0;

  bool running = false;        // drive() is on the stack: poll() leaves it alone
  std::exception_ptr failure;  // what it threw, thrown again by every later call

  bool done() const override { return failure || (!posted && next == program.rounds().size()); }
  void finish() override { drive(true); }
  void poll() override {
    if (!running) drive(false);
  }
  bool drive(bool block) {
    if (failure) std::rethrow_exception(failure);
    const detail::Raised raised(running);
    try {
      return run(block);
    } catch (const std::exception& e) {
      failure = std::current_exception();
      comm->abandon_for(e);
      cancel_posted();
      throw;
    }
  }
  // After a failure in a wait (a peer's, an interrupt): the round's requests are cancelled, so
  // that none still writes into the scratch or the caller's buffers once the unwinding frees
  // them.
  void cancel_posted() noexcept {
    comm->cancel_and_settle(reqs);
    reqs.clear();
    heads.clear();
  }

  void post() {
    detail::Round& r = program.rounds()[next++];
    for (const auto& c : r.copies)
      if (c.bytes && c.from != c.to) std::memmove(c.to, c.from, c.bytes);
    reqs.clear();
    heads.clear();
    // Zero-byte messages are skipped on both sides (both know the sizes), but for a first one,
    // which carries the signature (exchange_signatures). A round is one batch: a batching
    // transport (NCCL) must issue both sides of an exchange together.
    comm->begin_batch();
    for (const auto& m : r.recvs)
      if (m.bytes) {
        reqs.push_back(comm->irecv(Region::contiguous(m.ptr, m.bytes), m.peer, tag));
        heads.push_back(m.signed_ ? &m : nullptr);
      }
    for (const auto& m : r.sends)
      if (m.bytes) {
        reqs.push_back(comm->isend(Region::contiguous(m.ptr, m.bytes), m.peer, tag));
        heads.push_back(nullptr);
        sent += static_cast<std::int64_t>(m.bytes - (m.signed_ ? Signature::kBytes : 0));
      }
    comm->end_batch();
    posted = true;
  }
  void finish_round() {
    const detail::Round& r = program.rounds()[next - 1];
    for (const auto& c : r.arrivals) std::memcpy(c.to, c.from, c.bytes);
    for (const auto& c : r.combines)
      reduce_into(c.from, c.base, c.to, c.count, program.dtype(), program.op());
    posted = false;
  }
  // Runs rounds until one would block (test) or all are done (wait).
  bool run(bool block) {
    for (;;) {
      if (posted) {
        // A head's signature is checked as soon as it arrived, before the rest is waited for:
        // a member given another count may never send the rest. What a check throws cancels
        // what is still in flight (drive, cancel_posted) before the unwinding frees its memory.
        bool all = true;
        for (std::size_t i = 0; i < reqs.size(); ++i) {
          if (block)
            comm->wait(reqs[i]);
          else if (!comm->test(reqs[i])) {
            all = false;
            continue;
          }
          if (heads[i]) program.check_signature(*heads[i]);
        }
        if (!all) return false;
        comm->wait_all(reqs);  // all complete: releases them
        finish_round();
      }
      if (next == program.rounds().size()) return true;
      post();
    }
  }
};

Collective::Collective() = default;
Collective::Collective(std::shared_ptr<State> s) : s_(std::move(s)) {}
Collective::~Collective() = default;
Collective::Collective(Collective&&) noexcept = default;
Collective& Collective::operator=(Collective&&) noexcept = default;
bool Collective::test() {
  if (!s_ || s_->drive(false)) return true;
  s_->comm->progress();
  return false;
}
void Collective::wait() {
  if (s_) s_->finish();
}
bool Collective::done() const { return !s_ || s_->done(); }
std::int64_t Collective::bytes_sent() const { return s_ ? s_->sent : 0; }

namespace {

// Every message of the collective carries the one tag the group reserves for it.
Collective start(const Group& group, Program program) {
  auto s = std::make_shared<Collective::State>();
  s->comm = &group.comm();
  s->program = std::move(program);
  const TagBlock tags = group.reserve(1, s);
  s->tag = tags.tag(0);
  // Device memory (NCCL) is not the host's: the algorithms here run on host buffers only.
  if (!s->comm->caps().device_memory) s->program.exchange_signatures();
  Collective c(std::move(s));
  c.test();  // post the first round now
  return c;
}

// The topology the costs are priced on: the caller's, or one host (links like memcpy here).
const Topology& priced_on(const Topology* t) {
  static const Topology one = Topology::single_host();
  return t ? *t : one;
}

// The cheapest of `costs` (the first on a tie).
Algorithm cheapest(std::initializer_list<std::pair<Algorithm, double>> costs) {
  auto best = *costs.begin();
  for (const auto& c : costs)
    if (c.second < best.second) best = c;
  return best.first;
}

// An all-reduce's (or, `scatter`, a reduce-scatter's) algorithm: the one asked for, or the
// cheapest by the cost model of recursive doubling (a reduce-scatter all-reduces the whole
// vector), the ring in the group's order and, where the group spans hosts evenly, the
// hierarchical algorithm.
Algorithm choose(Algorithm a, const detail::CostOf& c,
                 const std::vector<std::vector<std::size_t>>& hosts, bool scatter) {
  if (a != Algorithm::Auto) return a;
  const double doubling = detail::recursive_doubling_all_reduce_cost(c);
  const double ring =
      scatter ? detail::ring_reduce_scatter_cost(c) : detail::ring_all_reduce_cost(c);
  if (hosts.empty())
    return cheapest({{Algorithm::RecursiveDoubling, doubling}, {Algorithm::Ring, ring}});
  return cheapest(
      {{Algorithm::RecursiveDoubling, doubling},
       {Algorithm::Ring, ring},
       {Algorithm::Hierarchical, scatter ? detail::hierarchical_reduce_scatter_cost(c, hosts)
                                         : detail::hierarchical_all_reduce_cost(c, hosts)}});
}

}  // namespace

Collective iall_reduce(const Group& group, const void* send, void* recv, std::int64_t count,
                       DType dtype, ReduceOp op, const CollectiveOptions& o) {
  const std::size_t me = position(group);
  const std::span<const int> members = group.devices();
  check_reduction(send, recv, count, count, dtype, op);
  check_not_node(o);
  Program p({Signature::Kind::AllReduce, dtype, op, 0, static_cast<std::uint64_t>(count)});
  const std::size_t bytes = static_cast<std::size_t>(count) * p.elem();
  const auto hosts = host_groups(members, o.topology);
  const Algorithm algorithm = choose(
      o.algorithm, {members, priced_on(o.topology), static_cast<double>(bytes)}, hosts, false);
  // The ring and halving-doubling read send themselves; the others work in recv.
  if (send != recv && algorithm != Algorithm::Ring && algorithm != Algorithm::HalvingDoubling)
    p.add_round().copies.push_back(
        {static_cast<const std::byte*>(send), static_cast<std::byte*>(recv), bytes});
  switch (algorithm) {
    case Algorithm::RecursiveDoubling:
      detail::recursive_doubling_all_reduce(p, members, me, recv, {0, count});
      break;
    case Algorithm::HalvingDoubling:
      detail::halving_doubling_all_reduce(p, members, me, send, recv, count);
      break;
    case Algorithm::Hierarchical:
      if (hosts.empty()) throw ValidationError("algorithm", kHierarchicalNeeds);
      detail::hierarchical_all_reduce(p, members, me, recv, count, hosts);
      break;
    default: {
      const auto pieces = detail::split(count, members.size());
      detail::ring_reduce_scatter(p, members, me, send, recv, p.at(recv, pieces[me].lo), pieces);
      detail::ring_all_gather(p, members, me, recv, pieces);
    }
  }
  return start(group, std::move(p));
}

Collective ireduce_scatter(const Group& group, const void* send, void* recv, std::int64_t count,
                           DType dtype, ReduceOp op, const CollectiveOptions& o) {
  const std::size_t me = position(group);
  const std::span<const int> members = group.devices();
  check_count(count);
  const auto pieces = detail::split(count, members.size());
  check_reduction(send, recv, count, pieces[me].size(), dtype, op);
  check_not_node(o);
  Program p({Signature::Kind::ReduceScatter, dtype, op, 0, static_cast<std::uint64_t>(count)});
  const std::size_t bytes = static_cast<std::size_t>(count) * p.elem();
  const auto hosts = host_groups(members, o.topology);
  const Algorithm a = choose(
      o.algorithm, {members, priced_on(o.topology), static_cast<double>(bytes)}, hosts, true);
  if (a == Algorithm::Hierarchical && hosts.empty())
    throw ValidationError("algorithm", kHierarchicalNeeds);
  if (a == Algorithm::RecursiveDoubling) {
    // The whole vector all-reduced in log2(n) rounds, the caller keeps its piece (the ring takes
    // n - 1 rounds, each a latency where bytes are few).
    std::byte* whole = p.scratch(bytes);
    p.add_round().copies.push_back({static_cast<const std::byte*>(send), whole, bytes});
    detail::recursive_doubling_all_reduce(p, members, me, whole, {0, count});
    p.add_round().copies.push_back({p.at(whole, pieces[me].lo), static_cast<std::byte*>(recv),
                                    static_cast<std::size_t>(pieces[me].size()) * p.elem()});
  } else if (a == Algorithm::Hierarchical) {
    // The host-order ring's bytes over each host link in H rounds.
    detail::hierarchical_reduce_scatter(p, members, me, send, recv, pieces, hosts);
  } else {
    detail::ring_reduce_scatter(p, members, me, send, nullptr, recv, pieces);
  }
  return start(group, std::move(p));
}

Collective iall_gather(const Group& group, const void* send, void* recv, std::int64_t count,
                       DType dtype, const CollectiveOptions& o) {
  check_count(count);
  std::vector<std::int64_t> counts;
  for (const Span& s : detail::split(count, group.devices().size())) counts.push_back(s.size());
  return iall_gatherv(group, send, recv, counts, dtype, o);
}

Collective iall_gatherv(const Group& group, const void* send, void* recv,
                        std::span<const std::int64_t> counts, DType dtype,
                        const CollectiveOptions& o) {
  const std::size_t me = position(group);
  const std::span<const int> members = group.devices();
  const std::vector<Span> pieces = gather_pieces(members, counts, send, recv, me, dtype);
  check_not_node(o);
  Program p({Signature::Kind::AllGather, dtype, ReduceOp::Sum, 0, Signature::digest(counts)});
  p.add_round().copies.push_back({static_cast<const std::byte*>(send), p.at(recv, pieces[me].lo),
                                  static_cast<std::size_t>(pieces[me].size()) * p.elem()});
  // log2(n) rounds instead of the ring's n - 1 (recursive doubling for a power of two, Bruck's
  // algorithm otherwise), hierarchical on several hosts (a host's link carries what a ring in
  // host order puts on it, in H rounds), or the ring: as asked, or with auto the cheapest by the
  // cost model (halving-doubling asks for doubling where the group is a power of two without
  // hosts).
  const bool pow2 = (members.size() & (members.size() - 1)) == 0;
  const std::size_t bytes = static_cast<std::size_t>(pieces.back().hi) * p.elem();
  const auto hosts = host_groups(members, o.topology);
  if (o.algorithm == Algorithm::Hierarchical && hosts.empty())
    throw ValidationError("algorithm", kHierarchicalNeeds);
  Algorithm a = o.algorithm;
  if (a == Algorithm::HalvingDoubling)  // no such all-gather: the nearest
    a = pow2 && hosts.empty() ? Algorithm::RecursiveDoubling
        : hosts.empty()       ? Algorithm::Ring
                              : Algorithm::Hierarchical;
  if (a == Algorithm::Auto) {
    const detail::CostOf c{members, priced_on(o.topology), static_cast<double>(bytes)};
    const double log_cost =
        pow2 ? detail::doubling_all_gather_cost(c) : detail::bruck_all_gather_cost(c);
    a = cheapest(
        {{Algorithm::RecursiveDoubling, log_cost},
         {Algorithm::Hierarchical, hosts.empty() ? std::numeric_limits<double>::infinity()
                                                 : detail::hierarchical_all_gather_cost(c, hosts)},
         {Algorithm::Ring, detail::ring_all_gather_cost(c)}});
  }
  const bool logarithmic = a == Algorithm::RecursiveDoubling;
  if (logarithmic && pow2)
    detail::doubling_all_gather(p, members, me, recv, pieces);
  else if (logarithmic)
    detail::bruck_all_gather(p, members, me, recv, pieces);
  else if (a == Algorithm::Hierarchical)
    detail::hierarchical_all_gather(p, members, me, recv, pieces, hosts);
  else
    detail::ring_all_gather(p, members, me, recv, pieces);
  return start(group, std::move(p));
}

Collective ibroadcast(const Group& group, int root, void* buf, std::int64_t count, DType dtype,
                      const CollectiveOptions& o) {
  const std::size_t me = position(group);
  const std::span<const int> members = group.devices();
  check_count(count);
  check_size(count, dtype);
  check_buffer(buf, count, "buf");
  check_single_algorithm(o, "broadcast");
  const auto it = std::find(members.begin(), members.end(), root);
  if (it == members.end())
    throw ValidationError("root", "device " + std::to_string(root) + " is not in the group");
  // The chain starts at the root and follows the group's order from there.
  std::vector<int> chain(it, members.end());
  chain.insert(chain.end(), members.begin(), it);
  const std::size_t pos =
      (me + members.size() - static_cast<std::size_t>(it - members.begin())) % members.size();
  Program p(
      {Signature::Kind::Broadcast, dtype, ReduceOp::Sum, root, static_cast<std::uint64_t>(count)});
  detail::chain_broadcast(p, chain, pos, buf, static_cast<std::size_t>(count) * p.elem(),
                          kBroadcastChunk);
  return start(group, std::move(p));
}

Collective iall_to_allv(const Group& group, const void* send,
                        std::span<const std::int64_t> send_counts, void* recv,
                        std::span<const std::int64_t> recv_counts, DType dtype,
                        const CollectiveOptions& o) {
  const std::size_t me = position(group);
  const std::span<const int> members = group.devices();
  for (const auto* c : {&send_counts, &recv_counts}) {
    const char* field = c == &send_counts ? "send_counts" : "recv_counts";
    if (c->size() != members.size())
      throw ValidationError(field, "has " + std::to_string(c->size()) + " entries for a group of " +
                                       std::to_string(members.size()));
    check_size(total(*c, field), dtype, field);
  }
  check_buffer(send, total(send_counts, "send_counts"), "send");
  check_buffer(recv, total(recv_counts, "recv_counts"), "recv");
  if (send_counts[me] != recv_counts[me])
    throw ValidationError("recv_counts", "the caller's own block differs from send_counts");
  check_single_algorithm(o, "all-to-all(v)");
  Program p({Signature::Kind::AllToAll, dtype});
  detail::all_to_allv(p, members, me, send, send_counts, recv, recv_counts);
  return start(group, std::move(p));
}

void all_reduce(const Group& group, const void* send, void* recv, std::int64_t count, DType dtype,
                ReduceOp op, const CollectiveOptions& o) {
  const std::size_t me = position(group);
  check_reduction(send, recv, count, count, dtype, op);
  if (!through_node(group, o)) return iall_reduce(group, send, recv, count, dtype, op, o).wait();
  guarded(group.comm(), [&] { detail::node_all_reduce(group, me, send, recv, count, dtype, op); });
}
void reduce_scatter(const Group& group, const void* send, void* recv, std::int64_t count,
                    DType dtype, ReduceOp op, const CollectiveOptions& o) {
  const std::size_t me = position(group);
  const std::span<const int> members = group.devices();
  check_count(count);
  check_reduction(send, recv, count, detail::split(count, members.size())[me].size(), dtype, op);
  if (!through_node(group, o))
    return ireduce_scatter(group, send, recv, count, dtype, op, o).wait();
  guarded(group.comm(), [&] {
    detail::node_reduce_scatter(group, me, send, recv, detail::split(count, members.size()), dtype,
                                op);
  });
}
void all_gather(const Group& group, const void* send, void* recv, std::int64_t count, DType dtype,
                const CollectiveOptions& o) {
  check_count(count);
  std::vector<std::int64_t> counts;
  for (const Span& s : detail::split(count, group.devices().size())) counts.push_back(s.size());
  all_gatherv(group, send, recv, counts, dtype, o);
}
void all_gatherv(const Group& group, const void* send, void* recv,
                 std::span<const std::int64_t> counts, DType dtype, const CollectiveOptions& o) {
  const std::size_t me = position(group);
  const std::span<const int> members = group.devices();
  const std::vector<Span> pieces = gather_pieces(members, counts, send, recv, me, dtype);
  if (!through_node(group, o)) return iall_gatherv(group, send, recv, counts, dtype, o).wait();
  guarded(group.comm(), [&] { detail::node_all_gatherv(group, me, send, recv, pieces, dtype); });
}
void broadcast(const Group& group, int root, void* buf, std::int64_t count, DType dtype,
               const CollectiveOptions& o) {
  ibroadcast(group, root, buf, count, dtype, o).wait();
}
void all_to_allv(const Group& group, const void* send, std::span<const std::int64_t> send_counts,
                 void* recv, std::span<const std::int64_t> recv_counts, DType dtype,
                 const CollectiveOptions& o) {
  iall_to_allv(group, send, send_counts, recv, recv_counts, dtype, o).wait();
}

namespace detail {

void Program::exchange_signatures() {
  constexpr std::size_t kSig = Signature::kBytes;
  // Up to this many elements a first message carries the signature in front of its data: two
  // copies of it cost less than a message of its own (0.9 us per all-reduce of 8 bytes under
  // Open MPI's shared memory). Beyond it the signature goes alone just before it, on the same
  // tag. Either way a peer given another count differs in that first message's length or in
  // the signature, checked as soon as it arrived: one of them fails at once. (On a tag of its
  // own, with the first round, a member of a small count waited for a lone signature never
  // sent, and its peer on it, both for the timeout.) Elements, not bytes: both sides choose
  // alike when they disagree on the dtype's width. An empty first message carries it too
  // (sent, where empty messages are not): a member given other sizes would otherwise take no
  // signature from a peer it sends nothing to, and a later message for another's; or wait for
  // the timeout.
  constexpr std::size_t kCarried = 2048;  // 8 KiB of f32
  const auto first = [](std::vector<int>& seen, int peer) {
    if (std::find(seen.begin(), seen.end(), peer) != seen.end()) return false;
    seen.push_back(peer);
    return true;
  };
  const auto carries = [&](const Message& m) { return m.bytes / elem_ <= kCarried; };
  std::size_t bytes = kSig;
  std::byte *mine = nullptr, *at = nullptr;
  std::vector<int> to, from;
  std::vector<Message> laid;
  // Twice over the first message to and from each peer: to size one block, then to lay the
  // signatures out in it.
  for (const bool lay : {false, true}) {
    if (lay) {
      mine = scratch(bytes);
      sig_.write(mine);
      at = mine + kSig;
    }
    to.clear();
    from.clear();
    for (Round& r : rounds_) {
      for (const bool sends : {true, false}) {
        std::vector<Message>& messages = sends ? r.sends : r.recvs;
        laid.clear();
        for (const Message& m : messages) {
          if (!first(sends ? to : from, m.peer)) {
            laid.push_back(m);
          } else if (!carries(m)) {  // the signature alone, then the data
            if (!lay) bytes += sends ? 0 : kSig;
            laid.push_back({m.peer, sends ? mine : at, kSig, true});
            laid.push_back(m);
            if (!sends) at += kSig;
          } else if (!lay) {
            bytes += kSig + m.bytes;
          } else {  // the signature in front of the data
            if (sends) {
              std::memcpy(at, mine, kSig);
              if (m.bytes) r.copies.push_back({m.ptr, at + kSig, m.bytes});  // after its own
            } else if (m.bytes) {
              r.arrivals.push_back({at + kSig, m.ptr, m.bytes});  // (ptr may be null)
            }
            laid.push_back({m.peer, at, kSig + m.bytes, true});
            at += kSig + m.bytes;
          }
        }
        if (lay) messages.swap(laid);
      }
    }
  }
}

void Program::check_signature(const Message& received) const {
  if (received.signed_) sig_.check(received.ptr, received.peer);
}

std::byte* Program::scratch(std::size_t bytes) {
  scratch_.push_back(std::make_unique<std::byte[]>(std::max<std::size_t>(bytes, 1)));
  return scratch_.back().get();
}

std::vector<Span> split(std::int64_t count, std::size_t n) {
  std::vector<Span> out;
  for (std::size_t k = 0; k < n; ++k) {
    const Range r = shard_range(count, static_cast<std::int64_t>(n), static_cast<std::int64_t>(k));
    out.push_back({r.lo, r.hi});
  }
  return out;
}

double round_cost(std::span<const int> members, const Topology& t, double bytes,
                  std::size_t messages, const std::function<std::size_t(std::size_t)>& to) {
  // Messages to other hosts per NIC (host x NICs + the sender's NIC), counted by sorting.
  std::vector<std::int64_t> nics;
  bool inside = false;
  const auto per_host = static_cast<std::int64_t>(t.nics_per_host());
  for (std::size_t i = 0; i < members.size(); ++i) {
    const std::size_t j = to(i);
    if (j == i) continue;
    const int h = t.host_of(members[i]);
    if (h == t.host_of(members[j]))
      inside = true;
    else
      nics.push_back(h * per_host + t.nic_of(members[i]));
  }
  std::sort(nics.begin(), nics.end());
  std::int64_t busiest = 0;
  for (std::size_t i = 0, k = 0; i < nics.size(); i = k) {
    while (k < nics.size() && nics[k] == nics[i]) ++k;
    busiest = std::max(busiest, static_cast<std::int64_t>(k - i));
  }
  const auto m = static_cast<std::int64_t>(messages);
  const double network = busiest ? round_seconds(bytes, m, busiest * m, t) : 0;
  return std::max(network, inside ? round_seconds(bytes, m, 0, t) : 0.0);
}

std::vector<Span> shifted(std::vector<Span> spans, std::int64_t base) {
  for (Span& s : spans) {
    s.lo += base;
    s.hi += base;
  }
  return spans;
}

}  // namespace detail
}  // namespace meshcast
