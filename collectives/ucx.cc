// The UCX backend over the UCP tag API. A message's tag carries (source device, plan tag), and
// UCX matches messages of one endpoint and tag in order, as the executor needs. Strided regions
// travel as a UCX generic datatype whose pack and unpack callbacks copy the byte ranges UCX asks
// for straight from and into the region (pack_range / unpack_range): no staging buffer.
// Endpoints use peer error handling, so a failed peer turns into a CommError, not a hang.
#include "meshcast/ucx.h"

#include <sched.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "meshcast/error.h"
#include "watchdog.h"

namespace meshcast {
namespace {

using Clock = std::chrono::steady_clock;

void check(ucs_status_t st, const char* what) {
  if (st != UCS_OK) throw CommError("ucx", std::string(what) + ": " + ucs_status_string(st));
}

ucp_tag_t make_tag(int src, int tag) {
  return (static_cast<ucp_tag_t>(static_cast<std::uint32_t>(src)) << 32) |
         static_cast<std::uint32_t>(tag);
}

struct UcxRequest : Request::Impl {
  void* handle = nullptr;  // UCX request, null once complete
  ucs_status_t status = UCS_OK;
  Region region;  // a strided region: what the generic datatype's callbacks read or write
  int peer = -1;
};

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

class UcxComm final : public Communicator {
 public:
  UcxComm(Bootstrap& bootstrap, const UcxOptions& o)
      : timeout_(o.timeout_seconds),
        chunk_(o.chunk_bytes),
        staging_(o.staging_bytes),
        rank_(bootstrap.rank()),
        size_(bootstrap.size()),
        watchdog_(control_, rank_, size_, o.timeout_seconds) {
    control_.comm = this;
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG;
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
    const auto all = bootstrap.allgather(mine);
    ucp_worker_release_address(worker_, addr);
    std::vector<detail::ProcessId> processes(all.size());
    for (std::size_t r = 0; r < all.size(); ++r) {
      if (all[r].size() < sizeof(detail::ProcessId))
        throw CommError("ucx", "rank " + std::to_string(r) + " sent a malformed worker address");
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
      ep.err_handler.cb = &UcxComm::on_error;
      ep.err_handler.arg = &failed_[static_cast<std::size_t>(p)];
      check(ucp_ep_create(worker_, &ep, &eps_[static_cast<std::size_t>(p)]), "ucp_ep_create");
    }
  }

  ~UcxComm() override {
    // After a failure, transfers to the dead peer never finish; the process is ending, and
    // tearing UCX down under them only prints complaints.
    if (watchdog_.failed()) return;
    for (auto* ep : eps_) {
      if (!ep) continue;
      ucp_request_param_t prm{};
      prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* r = ucp_ep_close_nbx(ep, &prm);
      if (UCS_PTR_IS_PTR(r)) {
        while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(worker_);
        ucp_request_free(r);
      }
    }
    ucp_worker_destroy(worker_);
    ucp_dt_destroy(region_dt_);
    ucp_cleanup(context_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "ucx"; }
  bool failed() const { return watchdog_.failed(); }

  void abandon(const std::string& field, const std::string& cause) override {
    watchdog_.abandon(field, cause);
    detail::linger([&] { return control_.drain(); });
  }

  Request isend(const Region& from, int dst, int tag) override {
    auto req = prepare(dst);
    ucp_request_param_t prm{};
    const auto [buf, count] = wire(from, *req, prm);
    track(*req, ucp_tag_send_nbx(eps_[static_cast<std::size_t>(dst)], buf, count,
                                 make_tag(rank_, tag), &prm));
    return Request(req);
  }

  Request irecv(const Region& to, int src, int tag) override {
    auto req = prepare(src);
    ucp_request_param_t prm{};
    const auto [buf, count] = wire(to, *req, prm);
    track(*req, ucp_tag_recv_nbx(worker_, buf, count, make_tag(src, tag), ~ucp_tag_t{0}, &prm));
    return Request(req);
  }

  Request ibcast(const Region& region, int root, std::span<const int> group, int tag) override {
    return ibcast_chain(region, root, group, tag, chunk_, staging_);
  }

  void barrier() override {
    // A dissemination barrier over tagged zero-byte messages on a reserved tag.
    constexpr int kBarrierTag = -1;
    for (int step = 1; step < size_; step <<= 1) {
      Region none = Region::contiguous(nullptr, 0);
      Request s = isend(none, (rank_ + step) % size_, kBarrierTag);
      Request r = irecv(none, (rank_ - step + size_) % size_, kBarrierTag);
      wait(s);
      wait(r);
    }
  }

 protected:
  void wait_one(Request::Impl& impl) override {
    auto& r = static_cast<UcxRequest&>(impl);
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_);
    int idle = 0;
    while (!completed(r)) {
      if (advance_chains()) idle = 0;
      if ((idle & 15) == 0) watchdog_.watch();
      if (failed_[static_cast<std::size_t>(r.peer)] || r.status != UCS_OK) peer_failed(r);
      if (Clock::now() > deadline) watchdog_.diagnose({r.peer});
      // Yield, not sleep: a sleep costs ~80 us here, and UCX's shared-memory transports move
      // data only while both sides progress (see mpi.cc).
      if (++idle > 64) sched_yield();
    }
  }

  // Progresses the worker; a finished request is checked.
  bool test_one(Request::Impl& impl) override {
    auto& r = static_cast<UcxRequest&>(impl);
    completed(r);
    if (r.status != UCS_OK) peer_failed(r);
    return r.handle == nullptr;
  }

  // A transfer with r.peer failed. The peer may have left after another device's failure: a
  // notice naming the device that failed first, if one comes within a moment, is the better
  // answer (watch() throws it); else the peer is named.
  [[noreturn]] void peer_failed(const UcxRequest& r) {
    const auto grace = Clock::now() + std::chrono::milliseconds(500);
    while (Clock::now() < grace) {
      watchdog_.watch();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    const std::string who = "device " + std::to_string(r.peer);
    const std::string why = r.status != UCS_OK
                                ? std::string("transfer failed: ") + ucs_status_string(r.status)
                                : "failed (UCX found it unreachable)";
    watchdog_.abandon(who, why);
    throw CommError(who, why);
  }

  // Whether the request finished successfully; a failed one keeps its status in r.status.
  bool completed(UcxRequest& r) {
    if (r.handle) {
      ucp_worker_progress(worker_);
      const ucs_status_t st = ucp_request_check_status(r.handle);
      if (st == UCS_INPROGRESS) return false;
      r.status = st;
      ucp_request_free(r.handle);
      r.handle = nullptr;
    }
    return r.status == UCS_OK;
  }

 private:
  static void on_error(void* arg, ucp_ep_h, ucs_status_t) { *static_cast<char*>(arg) = 1; }

  // Control messages on the reserved tags 0xfffffff0 + kind (plan tags are < 32768, the
  // barrier's is 0xffffffff).
  struct Control final : detail::ControlChannel {
    UcxComm* comm = nullptr;
    struct Out {
      void* req;
      std::string payload;
    };
    std::vector<std::unique_ptr<Out>> out;

    static int tag(Kind k) { return static_cast<int>(0xfffffff0u + static_cast<unsigned>(k)); }
    void post(int peer, Kind kind, const std::string& payload) override {
      auto o = std::make_unique<Out>(Out{nullptr, payload});
      ucp_request_param_t prm{};
      void* r = ucp_tag_send_nbx(comm->eps_[static_cast<std::size_t>(peer)], o->payload.data(),
                                 o->payload.size(), make_tag(comm->rank_, tag(kind)), &prm);
      if (UCS_PTR_IS_PTR(r)) {  // null: sent; an error: the peer is gone, nothing to keep
        o->req = r;
        out.push_back(std::move(o));
      }
      drain();
    }
    std::optional<Message> poll() override {
      ucp_worker_progress(comm->worker_);
      for (Kind k : {Kind::Fail, Kind::Ping, Kind::Pong}) {
        ucp_tag_recv_info_t info{};
        ucp_tag_message_h msg = ucp_tag_probe_nb(comm->worker_, static_cast<std::uint32_t>(tag(k)),
                                                 0xffffffffu, 1, &info);
        if (!msg) continue;
        std::string payload(info.length, '\0');
        ucp_request_param_t prm{};
        void* r = ucp_tag_msg_recv_nbx(comm->worker_, payload.data(), payload.size(), msg, &prm);
        if (UCS_PTR_IS_PTR(r)) {
          while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(comm->worker_);
          ucp_request_free(r);
        }
        return Message{static_cast<int>(info.sender_tag >> 32), k, std::move(payload)};
      }
      return std::nullopt;
    }
    // Forgets sends that left; true when none is in flight.
    bool drain() {
      ucp_worker_progress(comm->worker_);
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

  // The (buffer, count) UCX is given for the request's region: its bytes when contiguous, else
  // the region itself as one element of the generic datatype (set in prm). Both sides' streams
  // are the region's bytes, so a contiguous side matches a strided one.
  std::pair<void*, std::size_t> wire(const Region& r, UcxRequest& req,
                                     ucp_request_param_t& prm) const {
    if (r.is_contiguous()) return {r.origin(), r.bytes()};
    req.region = r;  // lives as long as the request
    prm.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    prm.datatype = region_dt_;
    return {&req.region, 1};
  }

  // A post that failed at once fails the request, which its test or wait reports (peer_failed).
  void track(UcxRequest& req, ucs_status_ptr_t p) {
    if (UCS_PTR_IS_ERR(p)) {
      req.status = UCS_PTR_STATUS(p);
      return;
    }
    req.handle = p;  // null: completed at once
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
};

}  // namespace

struct UcxSession::Impl {
  std::unique_ptr<UcxComm> world;
  Bootstrap* bootstrap;
};

UcxSession::UcxSession(Bootstrap& bootstrap, UcxOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->world = std::make_unique<UcxComm>(bootstrap, options);
  impl_->bootstrap = &bootstrap;
  bootstrap.barrier();  // every endpoint exists before anyone sends
}

UcxSession::~UcxSession() {
  if (impl_->world->failed()) impl_->bootstrap->on_failure();
}

Communicator& UcxSession::world() { return *impl_->world; }

}  // namespace meshcast
