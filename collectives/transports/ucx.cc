// The UCX transport over the UCP tag API. A message's tag carries (source device, tag), and UCX
// matches messages of one endpoint and tag in order, as the engine needs. Strided regions
// travel as a UCX generic datatype whose pack and unpack callbacks copy the byte ranges UCX asks
// for straight from and into the region (pack_range / unpack_range): no staging buffer.
// Endpoints use peer error handling, so a failed peer turns into a CommError, not a hang.
#include "meshcast/ucx.h"

#include <sched.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <exception>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "arrived.h"
#include "meshcast/error.h"
#include "watchdog.h"

namespace meshcast {
namespace {

// A failed UCX call of this process.
void check(ucs_status_t st, const char* what) {
  if (st != UCS_OK) throw InternalError("ucx", std::string(what) + ": " + ucs_status_string(st));
}

// A message's UCX tag: the source device in the high 32 bits, the tag in the low 32. Tags are
// non-negative ints; the highest are reserved: the barrier's, the control channel's, then the
// closing barrier's (its own, so that a process that ends is never taken for one in a barrier).
constexpr int kBarrierTag = INT_MAX;
constexpr int kClosingTag = INT_MAX - 4;  // below the 3 control tags
constexpr int kMaxDataTag = INT_MAX - 5;

ucp_tag_t make_tag(int src, int tag) {
  return (static_cast<ucp_tag_t>(static_cast<std::uint32_t>(src)) << 32) |
         static_cast<std::uint32_t>(tag);
}

struct UcxRequest : Request::Impl {
  void* handle = nullptr;  // UCX request, null once complete
  ucs_status_t status = UCS_OK;
  // A strided region: what the generic datatype's callbacks read or write, at an address that
  // stays put while a cancelled request may still call them (settle_cancelled).
  std::unique_ptr<Region> region;
  int peer = -1;
  std::int64_t expect = -1;  // a receive's bytes: UCX takes a shorter message silently
  std::size_t arrived = 0;   // a receive's length, as its callback (on_recv) found it
  bool counted = false;      // its completion told the watchdog (once: test() may ask again)
};

// A receive's arrived length goes to the UCX request's own memory (ucp_params_t::request_size),
// which, unlike the UcxRequest, outlives a cancelled request whose callback UCX calls later.
void on_recv(void* request, ucs_status_t st, const ucp_tag_recv_info_t* info, void*) {
  if (st == UCS_OK) *static_cast<std::size_t*>(request) = info->length;
}

// The generic datatype's callbacks: the buffer UCX is given is the request's Region (count 1),
// and the packed stream is the region's bytes in row-major order.
void* start_region(void*, const void* buffer, std::size_t) { return const_cast<void*>(buffer); }
void* start_region_unpack(void*, void* buffer, std::size_t) { return buffer; }
std::size_t region_size(void* state) { return static_cast<const Region*>(state)->bytes(); }
std::size_t pack_region(void* state, std::size_t offset, void* dest, std::size_t max) {
  const auto& r = *static_cast<const Region*>(state);
  const std::size_t n = std::min(max, r.bytes() - std::min(offset, r.bytes()));
  pack_range(r, offset, n, dest);
  return n;
}
ucs_status_t unpack_region(void* state, std::size_t offset, const void* src, std::size_t n) {
  const auto& r = *static_cast<const Region*>(state);
  if (offset > r.bytes() || n > r.bytes() - offset) return UCS_ERR_MESSAGE_TRUNCATED;
  unpack_range(src, r, offset, n);
  return UCS_OK;
}
void finish_region(void*) {}
const ucp_generic_dt_ops_t kRegionOps{&start_region, &start_region_unpack, &region_size,
                                      &pack_region,  &unpack_region,       &finish_region};

class UcxTransport final : public Transport {
 public:
  UcxTransport(Bootstrap& bootstrap, const UcxOptions& o)
      : timeout_(o.timeout_seconds),
        chunk_(o.chunk_bytes),
        staging_(o.staging_bytes),
        rank_(bootstrap.rank()),
        size_(bootstrap.size()),
        watchdog_(control_, rank_, size_, o.timeout_seconds) {
    control_.ucx = this;
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_REQUEST_SIZE;
    params.features = UCP_FEATURE_TAG;
    params.request_size = sizeof(std::size_t);  // on_recv's
    ucp_config_t* config = nullptr;
    check(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
    const ucs_status_t st = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    check(st, "ucp_init");
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    check(ucp_worker_create(context_, &wp, &worker_), "ucp_worker_create");
    check(ucp_dt_create_generic(&kRegionOps, nullptr, &region_dt_), "ucp_dt_create_generic");
    ucp_address_t* addr = nullptr;
    std::size_t len = 0;
    check(ucp_worker_get_address(worker_, &addr, &len), "ucp_worker_get_address");
    const auto* bytes = reinterpret_cast<const unsigned char*>(addr);
    // Each rank's worker address, followed by its process identity (the watchdog's).
    const detail::ProcessId me = detail::this_process();
    std::vector<unsigned char> mine(bytes, bytes + len);
    const auto* id = reinterpret_cast<const unsigned char*>(me.data());
    mine.insert(mine.end(), id, id + sizeof me);
    ucp_worker_release_address(worker_, addr);
    const auto all = bootstrap.allgather(mine);
    std::vector<detail::ProcessId> processes(all.size());
    for (std::size_t r = 0; r < all.size(); ++r) {
      if (all[r].size() < sizeof(detail::ProcessId))
        throw CommError(static_cast<int>(r), "sent a malformed worker address");
      std::memcpy(processes[r].data(), all[r].data() + all[r].size() - sizeof(detail::ProcessId),
                  sizeof(detail::ProcessId));
    }
    watchdog_.set_processes(processes);
    eps_.resize(static_cast<std::size_t>(size_), nullptr);
    failed_.assign(static_cast<std::size_t>(size_), 0);
    for (int p = 0; p < size_; ++p) {
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.address = reinterpret_cast<const ucp_address_t*>(all[static_cast<std::size_t>(p)].data());
      ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.cb = &UcxTransport::on_error;
      ep.err_handler.arg = &failed_[static_cast<std::size_t>(p)];
      check(ucp_ep_create(worker_, &ep, &eps_[static_cast<std::size_t>(p)]), "ucp_ep_create");
    }
  }

  ~UcxTransport() override {
    // After a failure, transfers to the dead peer never finish; the process is ending, and
    // tearing UCX down under them only prints complaints. A destructor reports nothing: the
    // closes are best effort.
    if (watchdog_.failed()) return;
    // Flushed: a send completes once its data is on its way, and a forced close could drop
    // what is still queued here (the last messages of the session's closing barrier). A peer
    // that does not let a close finish within the timeout is left as after a failure.
    // All closes are started at once and finish together.
    const auto until = Clock::now() + std::chrono::duration<double>(timeout_);
    std::vector<void*> closing;
    for (auto* ep : eps_) {
      if (!ep) continue;
      ucp_request_param_t prm{};
      void* r = ucp_ep_close_nbx(ep, &prm);
      if (UCS_PTR_IS_PTR(r)) closing.push_back(r);
    }
    while (!closing.empty()) {
      if (Clock::now() > until) return;
      ucp_worker_progress(worker_);
      std::erase_if(closing, [](void* r) {
        if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
        ucp_request_free(r);
        return true;
      });
    }
    for (auto* v : {&cancelled_, &given_up_})
      for (auto& c : *v) ucp_request_free(c.handle);  // ended by the worker's end
    ucp_worker_destroy(worker_);
    ucp_dt_destroy(region_dt_);
    ucp_cleanup(context_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "ucx"; }
  TransportCaps caps() const override {
    TransportCaps c;
    c.multicast = TransportCaps::Multicast::Chain;
    c.max_tag = kMaxDataTag;
    c.chain_staging_bytes = staging_;
    return c;
  }
  std::size_t chain_chunk(std::span<const int> members) const override {
    (void)members;
    return chunk_;
  }
  bool failed() const { return watchdog_.failed(); }
  const std::optional<CommError>& announced() const { return watchdog_.announced(); }

  Request post_send(const Region& from, int dst, int tag) override {
    return Request(send(from, dst, tag));
  }
  Request post_recv(const Region& to, int src, int tag) override {
    return Request(recv(to, src, tag));
  }

  // Progresses the worker; a failed request is reported (peer_failed).
  bool test(Request::Impl& impl) override {
    auto& r = static_cast<UcxRequest&>(impl);
    if (completed(r)) {
      if (r.expect >= 0)  // once: test() may be asked again
        detail::check_arrived(r.peer, static_cast<std::int64_t>(r.arrived),
                              std::exchange(r.expect, -1));
      if (!std::exchange(r.counted, true)) watchdog_.progressed();  // a send's too
      return true;
    }
    if (r.status == UCS_ERR_MESSAGE_TRUNCATED && r.expect >= 0)
      detail::arrived_longer(r.peer, std::exchange(r.expect, -1));
    if (r.status != UCS_OK) peer_failed(r.peer, r.status);
    if (failed_[static_cast<std::size_t>(r.peer)]) peer_failed(r.peer, UCS_OK);
    watchdog_.watch_sometimes();
    return false;
  }

  void idle(const Request::Impl* waiting, std::span<const int> peers, int polls,
            Clock::time_point since) override {
    ucp_worker_progress(worker_);
    if ((polls & 15) == 0) watchdog_.watch();
    const auto* r = static_cast<const UcxRequest*>(waiting);
    const std::span<const int> on = r ? std::span<const int>(&r->peer, 1) : peers;
    for (int p : on)
      if (failed_[static_cast<std::size_t>(p)]) peer_failed(p, UCS_OK);
    watchdog_.check_wait(since, on);
    // Yield, not sleep: a sleep costs ~80 us here, and UCX's shared-memory transports move
    // data only while both sides progress (see mpi.cc).
    if (polls > 64) sched_yield();
  }

  // UCX cancels receives; a send the peer matched goes on packing from its region until it
  // ends: kept, with its region, until settle_cancelled() finds it ended.
  void cancel(Request::Impl& impl) override {
    auto& r = static_cast<UcxRequest&>(impl);
    if (!r.handle) return;
    ucp_request_cancel(worker_, r.handle);
    cancelled_.push_back({std::exchange(r.handle, nullptr), std::move(r.region)});
  }

  bool settle_cancelled(Clock::time_point until) override {
    const auto ended = [](std::vector<Cancelled>& v) {
      std::erase_if(v, [](Cancelled& c) {
        if (ucp_request_check_status(c.handle) == UCS_INPROGRESS) return false;
        ucp_request_free(c.handle);
        return true;
      });
    };
    for (int polls = 0;; ++polls) {
      ucp_worker_progress(worker_);
      if (polls == 0) ended(given_up_);  // looked at, not waited for: this wait is the caller's
      ended(cancelled_);
      if (cancelled_.empty()) return true;
      if (Clock::now() >= until) {
        std::move(cancelled_.begin(), cancelled_.end(), std::back_inserter(given_up_));
        cancelled_.clear();
        return false;
      }
      if (polls > 64) sched_yield();
    }
  }

  void barrier(const std::function<void()>& meanwhile) override {
    dissemination(kBarrierTag, meanwhile);
  }
  // The session's closing barrier, on a tag of its own: a peer in a barrier of the program's
  // waits for this process instead of passing it.
  void closing_barrier() {
    dissemination(kClosingTag, [] {});
  }

  void check_peers() override { watchdog_.check_notices(); }

  void abort(const Error& why) override {
    watchdog_.abandon(why);
    detail::linger([&] { return control_.drain(); });
  }

 private:
  static void on_error(void* arg, ucp_ep_h, ucs_status_t) { *static_cast<char*>(arg) = 1; }

  // A transfer with `peer` failed (`st`), or UCX found the peer unreachable (UCS_OK).
  [[noreturn]] void peer_failed(int peer, ucs_status_t st) {
    watchdog_.peer_failed(peer, st != UCS_OK
                                    ? std::string("transfer failed: ") + ucs_status_string(st)
                                    : "failed (UCX found it unreachable)");
  }

  // Control messages on the tags below the barrier's (see kMaxDataTag).
  struct Control final : detail::ControlChannel {
    UcxTransport* ucx = nullptr;
    struct Out {
      void* req;
      std::string payload;
    };
    std::vector<std::unique_ptr<Out>> out;

    static int tag(Kind k) { return kBarrierTag - 1 - static_cast<int>(k); }
    // A send that fails at once goes to a peer that is gone: nothing to keep (the watchdog
    // names that peer).
    void post(int peer, Kind kind, const std::string& payload) override {
      auto o = std::make_unique<Out>(Out{nullptr, payload});
      ucp_request_param_t prm{};
      void* r = ucp_tag_send_nbx(ucx->eps_[static_cast<std::size_t>(peer)], o->payload.data(),
                                 o->payload.size(), make_tag(ucx->rank_, tag(kind)), &prm);
      if (UCS_PTR_IS_PTR(r)) {  // null: sent
        o->req = r;
        out.push_back(std::move(o));
      }
      drain();
    }
    std::optional<Message> poll() override {
      ucp_worker_progress(ucx->worker_);
      for (Kind k : {Kind::Fail, Kind::Ping, Kind::Pong}) {
        ucp_tag_recv_info_t info{};
        ucp_tag_message_h msg = ucp_tag_probe_nb(ucx->worker_, static_cast<std::uint32_t>(tag(k)),
                                                 0xffffffffu, 1, &info);
        if (!msg) continue;
        std::string payload(info.length, '\0');
        ucp_request_param_t prm{};
        void* r = ucp_tag_msg_recv_nbx(ucx->worker_, payload.data(), payload.size(), msg, &prm);
        if (UCS_PTR_IS_ERR(r)) check(UCS_PTR_STATUS(r), "ucp_tag_msg_recv_nbx");
        if (UCS_PTR_IS_PTR(r)) {
          ucs_status_t st;
          while ((st = ucp_request_check_status(r)) == UCS_INPROGRESS)
            ucp_worker_progress(ucx->worker_);
          ucp_request_free(r);
          check(st, "ucp_tag_msg_recv_nbx");
        }
        return Message{static_cast<int>(info.sender_tag >> 32), k, std::move(payload)};
      }
      return std::nullopt;
    }
    // Forgets sends that left (or failed: their peer is gone); true when none is in flight.
    bool drain() {
      ucp_worker_progress(ucx->worker_);
      std::erase_if(out, [](const std::unique_ptr<Out>& o) {
        if (ucp_request_check_status(o->req) == UCS_INPROGRESS) return false;
        ucp_request_free(o->req);
        return true;
      });
      return out.empty();
    }
  };

  std::shared_ptr<UcxRequest> prepare(int peer) {
    if (peer < 0 || peer >= size_)
      throw ValidationError("peer", "device " + std::to_string(peer) + " is outside the world of " +
                                        std::to_string(size_) + " ranks");
    auto req = std::make_shared<UcxRequest>();
    req->peer = peer;
    return req;
  }

  std::shared_ptr<UcxRequest> send(const Region& from, int dst, int tag) {
    auto req = prepare(dst);
    ucp_request_param_t prm{};
    const auto [buf, count] = wire(from, *req, prm);
    track(*req, ucp_tag_send_nbx(eps_[static_cast<std::size_t>(dst)], buf, count,
                                 make_tag(rank_, tag), &prm));
    return req;
  }

  std::shared_ptr<UcxRequest> recv(const Region& to, int src, int tag) {
    auto req = prepare(src);
    ucp_request_param_t prm{};
    const auto [buf, count] = wire(to, *req, prm);
    req->expect = static_cast<std::int64_t>(to.bytes());
    // Never completed at once: UCX 1.13 leaves recv_info's length 0 then, so every receive
    // gets a request and its length from on_recv.
    prm.op_attr_mask |= UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    prm.cb.recv = &on_recv;
    track(*req, ucp_tag_recv_nbx(worker_, buf, count, make_tag(src, tag), ~ucp_tag_t{0}, &prm));
    return req;
  }

  // A dissemination barrier over zero-byte messages on a reserved tag.
  void dissemination(int tag, const std::function<void()>& meanwhile) {
    for (int step = 1; step < size_; step <<= 1) {
      const Region none = Region::contiguous(nullptr, 0);
      const auto s = send(none, (rank_ + step) % size_, tag);
      const auto r = recv(none, (rank_ - step + size_) % size_, tag);
      wait(*s, meanwhile);
      wait(*r, meanwhile);
    }
  }

  // The engine's wait loop, for the barrier's own requests.
  void wait(UcxRequest& r, const std::function<void()>& meanwhile) {
    const auto since = Clock::now();
    for (int polls = 0; !test(r);) {
      idle(&r, {}, ++polls, since);
      meanwhile();
    }
  }

  // The (buffer, count) UCX is given for the request's region: its bytes when contiguous, else
  // the region itself as one element of the generic datatype (set in prm). Both sides' streams
  // are the region's bytes, so a contiguous side matches a strided one.
  std::pair<void*, std::size_t> wire(const Region& r, UcxRequest& req,
                                     ucp_request_param_t& prm) const {
    if (r.is_contiguous()) return {r.origin(), r.bytes()};
    req.region = std::make_unique<Region>(r);  // lives as long as the request
    prm.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    prm.datatype = region_dt_;
    return {req.region.get(), 1};
  }

  // A post that failed at once (its endpoint is broken) fails the request, which test()
  // reports as the peer's failure.
  void track(UcxRequest& req, ucs_status_ptr_t p) {
    if (UCS_PTR_IS_ERR(p)) {
      req.status = UCS_PTR_STATUS(p);
      return;
    }
    req.handle = p;  // null: completed at once
  }

  // Whether the request finished successfully; a failed one keeps its status in r.status.
  bool completed(UcxRequest& r) {
    if (r.handle) {
      ucp_worker_progress(worker_);
      const ucs_status_t st = ucp_request_check_status(r.handle);
      if (st == UCS_INPROGRESS) return false;
      r.status = st;
      if (st == UCS_OK && r.expect >= 0) r.arrived = *static_cast<std::size_t*>(r.handle);
      ucp_request_free(r.handle);
      r.handle = nullptr;
    }
    return r.status == UCS_OK;
  }

  double timeout_;
  std::size_t chunk_, staging_;
  int rank_ = 0, size_ = 0;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_datatype_t region_dt_ = 0;  // kRegionOps
  std::vector<ucp_ep_h> eps_;
  std::vector<char> failed_;  // per peer: UCX reported its endpoint broken
  Control control_;
  detail::Watchdog watchdog_;
  struct Cancelled {
    void* handle;
    std::unique_ptr<Region> region;
  };
  std::vector<Cancelled> cancelled_;  // cancel()'s, until settle_cancelled() finds them ended
  std::vector<Cancelled> given_up_;   // still going at a settle_cancelled() deadline
};

}  // namespace

struct UcxSession::Impl {
  UcxTransport* transport = nullptr;  // the world's
  std::unique_ptr<Communicator> world;
  Bootstrap* bootstrap;
};

UcxSession::UcxSession(Bootstrap& bootstrap, UcxOptions options) : impl_(std::make_unique<Impl>()) {
  auto transport = std::make_unique<UcxTransport>(bootstrap, options);
  impl_->transport = transport.get();
  impl_->world = std::make_unique<Communicator>(std::move(transport));
  impl_->bootstrap = &bootstrap;
  bootstrap.barrier();  // every endpoint exists before anyone sends
}

UcxSession::~UcxSession() {
  // The end is collective, as MPI_Finalize's: without it a process that ended right after its
  // last send was taken for failed by a peer still receiving that send. A barrier of the
  // session's own transport on a tag of its own (a peer still in one of the program's barriers
  // is not let through by it): bounded by its timeout and failure-aware, so a peer that ended
  // without it (it failed, or threw) costs at most the timeout. Not while an exception unwinds
  // here: the peers may wait on this process for something else, and would time out first.
  if (!impl_->transport->failed() && std::uncaught_exceptions() == 0) {
    try {
      impl_->transport->closing_barrier();
    } catch (const std::exception&) {  // a peer failed: the transport knows it (below)
    }
  }
  // The bootstrap's peers hear which device failed: MPI's ranks still in one of its exchanges
  // (the verification totals) named the first rank whose process had ended, one that ended
  // normally, not the failed one.
  if (const auto& why = impl_->transport->announced())
    impl_->bootstrap->on_peer_failure(*why);
  else if (impl_->transport->failed())
    impl_->bootstrap->on_failure();
}

Communicator& UcxSession::world() { return *impl_->world; }

}  // namespace meshcast
