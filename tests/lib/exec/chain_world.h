// An in-process world whose multicasts travel as the engine's chains (the local transport fans
// them out): threads exchange point-to-point messages through mailboxes, a send completing only
// once its receiver copied it out of the sender's buffer (so a chain that reused a slot before
// its sends completed would forward the wrong bytes). For tests of chains and trees of chains.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "meshcast/communicator.h"

namespace meshcast::testing {

class ChainWorld {
 public:
  // `chunk`: the chains' chunk; `staging`: the scratch a chain stages a strided box through.
  ChainWorld(int size, std::size_t chunk, std::size_t staging)
      : size_(size), chunk_(chunk), staging_(staging), inbox_(static_cast<std::size_t>(size)) {}

  // Runs fn on one thread per device of `devices`; rethrows the first exception.
  void run(const std::function<void(Communicator&)>& fn, const std::vector<int>& devices) {
    parties_ = static_cast<int>(devices.size());
    std::vector<std::thread> threads;
    std::exception_ptr first;
    std::mutex m;
    for (int d : devices)
      threads.emplace_back([&, d] {
        try {
          Communicator comm(std::make_unique<Mailbox>(*this, d));
          fn(comm);
        } catch (...) {
          std::lock_guard<std::mutex> lock(m);
          if (!first) first = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    if (first) std::rethrow_exception(first);
  }

 private:
  struct Post : Request::Impl {
    Post(const Region& r, int s, int t) : region(r), src(s), tag(t) {}
    Region region;
    int src, tag;
    std::atomic<bool> done{false};
  };

  class Mailbox final : public Transport {
   public:
    Mailbox(ChainWorld& w, int rank) : w_(w), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return w_.size_; }
    std::string name() const override { return "chain-world"; }
    TransportCaps caps() const override {
      TransportCaps c;
      c.multicast = TransportCaps::Multicast::Chain;
      c.chain_staging_bytes = w_.staging_;
      return c;
    }
    std::size_t chain_chunk(std::span<const int>) const override { return w_.chunk_; }
    Request post_send(const Region& from, int dst, int tag) override {
      auto p = std::make_shared<Post>(from, rank_, tag);
      std::lock_guard<std::mutex> lock(w_.m_);
      w_.inbox_[static_cast<std::size_t>(dst)].push_back(p);
      return Request(p);
    }
    Request post_recv(const Region& to, int src, int tag) override {
      auto p = std::make_shared<Post>(to, src, tag);
      recvs_.push_back(p);
      return Request(p);
    }
    bool test(Request::Impl& r) override {
      progress();
      return static_cast<Post&>(r).done;
    }
    void idle(const Request::Impl*, std::span<const int>, int, Clock::time_point since) override {
      progress();
      std::this_thread::yield();
      if (Clock::now() - since > std::chrono::seconds(60))
        throw CommError(rank_, "chain world: no progress for 60 s");
    }
    void cancel(Request::Impl&) override {}
    void barrier(const std::function<void()>& /*meanwhile*/) override {
      std::unique_lock<std::mutex> lock(w_.m_);
      const int gen = w_.generation_;
      if (++w_.waiting_ == w_.parties_) {
        w_.waiting_ = 0;
        ++w_.generation_;
        w_.cv_.notify_all();
        return;
      }
      w_.cv_.wait(lock, [&] { return w_.generation_ != gen; });
    }
    void abort(const Error&) override {}

   private:
    // Receives match the first send of their (source, tag) to this device, in posting order.
    void progress() {
      std::lock_guard<std::mutex> lock(w_.m_);
      auto& box = w_.inbox_[static_cast<std::size_t>(rank_)];
      for (auto r = recvs_.begin(); r != recvs_.end();) {
        const auto s = std::find_if(box.begin(), box.end(), [&](const auto& p) {
          return p->src == (*r)->src && p->tag == (*r)->tag;
        });
        if (s == box.end()) {
          ++r;
          continue;
        }
        if ((*s)->region.bytes() != (*r)->region.bytes())
          throw CommError(rank_, "chain world: message size mismatch");
        std::vector<std::byte> wire((*s)->region.bytes());
        pack((*s)->region, wire.data());
        unpack(wire.data(), (*r)->region);
        (*s)->done = true;
        (*r)->done = true;
        box.erase(s);
        r = recvs_.erase(r);
      }
    }

    ChainWorld& w_;
    int rank_;
    std::vector<std::shared_ptr<Post>> recvs_;  // pending, in posting order
  };

  int size_;
  std::size_t chunk_, staging_;
  std::mutex m_;
  std::condition_variable cv_;
  int parties_ = 0, waiting_ = 0, generation_ = 0;
  std::vector<std::vector<std::shared_ptr<Post>>> inbox_;  // per device: sends to it, in order
};

}  // namespace meshcast::testing
