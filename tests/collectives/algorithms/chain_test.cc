// The chain broadcast's bookkeeping (Communicator::ibcast over a transport whose multicast is a
// chain; the wait loop and test) on one device, against a scripted transport: this test plays
// the upstream device (receives complete at once with its bytes) and the downstream one (a send
// completes a few polls after it was posted, several at a time, and its bytes are read when it
// completes, as a real transport reads them). Checked: the bytes forwarded downstream, the bytes
// landed here, that every send completed before wait() returned, that at most the window of
// sends was ever in flight, and that a strided box is staged through no more scratch than the
// bound (a chunk reused too early would change what a later send reads).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "meshcast/communicator.h"

namespace meshcast {
namespace {

class Scripted : public Transport {
 public:
  Scripted(int rank, std::vector<std::byte> upstream, std::size_t chunk, std::size_t staging,
           int delay)
      : rank_(rank),
        upstream_(std::move(upstream)),
        chunk_(chunk),
        staging_(staging),
        delay_(delay) {}
  int rank() const override { return rank_; }
  int size() const override { return 3; }
  std::string name() const override { return "scripted"; }
  TransportCaps caps() const override {
    TransportCaps c;
    c.multicast = TransportCaps::Multicast::Chain;
    c.chain_staging_bytes = staging_;
    return c;
  }
  std::size_t chain_chunk(std::span<const int>) const override { return chunk_; }

  Request post_send(const Region& from, int, int) override {
    auto op = std::make_shared<Op>(Op{from, true, clock_ + delay_, false, sends_.size()});
    sends_.push_back(op);
    ++in_flight_;
    most_in_flight_ = std::max(most_in_flight_, in_flight_);
    return Request(op);
  }
  Request post_recv(const Region& to, int, int) override {
    auto op = std::make_shared<Op>(Op{to, false, clock_, false, received_});
    received_ += to.bytes();
    recvs_.push_back(op);
    return Request(op);
  }
  bool test(Request::Impl& impl) override {
    deliver_due();
    return static_cast<Op&>(impl).done;
  }
  // Time passes while the engine waits.
  void idle(const Request::Impl*, std::span<const int>, int, Clock::time_point) override {
    ++clock_;
  }
  void cancel(Request::Impl&) override {}
  void barrier(const std::function<void()>& /*meanwhile*/) override {}
  void abort(const Error&) override {}
  std::shared_ptr<void> scratch(std::size_t bytes) override {
    scratch_bytes_ += bytes;
    return Transport::scratch(bytes);
  }

  // The bytes the sends carried, in posting order.
  std::vector<std::byte> wire() const {
    std::vector<std::byte> out;
    for (const auto& w : wire_) out.insert(out.end(), w.begin(), w.end());
    return out;
  }
  bool all_sends_done() const {
    for (const auto& s : sends_)
      if (!s->done) return false;
    return true;
  }
  std::size_t most_in_flight() const { return most_in_flight_; }
  std::size_t scratch_bytes() const { return scratch_bytes_; }
  // Time passes between two polls of a caller that only tests.
  void tick() { ++clock_; }

 private:
  struct Op : Request::Impl {
    Op(Region r, bool s, long d, bool dn, std::size_t k)
        : region(r), send(s), due(d), done(dn), index(k) {}
    Region region;
    bool send;
    long due;
    bool done;
    std::size_t index;  // sends: posting order; receives: offset in the upstream bytes
  };
  void deliver_due() {
    for (auto& s : sends_)
      if (!s->done && s->due <= clock_) {
        if (wire_.size() <= s->index) wire_.resize(s->index + 1);
        wire_[s->index].resize(s->region.bytes());
        pack(s->region, wire_[s->index].data());
        s->done = true;
        --in_flight_;
      }
    for (auto& r : recvs_)
      if (!r->done && r->due <= clock_) {
        unpack(upstream_.data() + r->index, r->region);
        r->done = true;
      }
  }

  int rank_;
  std::vector<std::byte> upstream_;
  std::size_t chunk_, staging_;
  int delay_;
  std::size_t scratch_bytes_ = 0;
  long clock_ = 0;
  std::size_t received_ = 0, in_flight_ = 0, most_in_flight_ = 0;
  std::vector<std::shared_ptr<Op>> sends_, recvs_;
  std::vector<std::vector<std::byte>> wire_;
};

std::vector<std::byte> pattern(std::size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed * 7) % 251);
  return v;
}

// The box this device holds: contiguous (a whole 12 x 10 tile of i32) or strided (columns 2..6).
struct Place {
  std::vector<std::int32_t> tile = std::vector<std::int32_t>(120, -1);
  Box whole = Box({{0, 12}, {0, 10}});
  Region region(bool strided) {
    const Box box = strided ? Box({{0, 12}, {2, 7}}) : whole;
    return Region::of(tile.data(), sizeof(std::int32_t), whole, box);
  }
};

TEST(Chain, EveryRoleForwardsAndLandsTheBytesAndFinishesItsSends) {
  // Completed by wait(), or by polling test() alone (as ireshard's callers do).
  for (bool by_test : {false, true})
    for (bool strided : {false, true})
      for (std::size_t chunk : {1, 3, 7, 64, 1000})
        // Staging: unbounded, then 1, 2 and 5 chunks, and less than one (rounded up to one).
        for (std::size_t staging : {std::size_t{1} << 30, chunk, 2 * chunk, 5 * chunk, chunk / 2})
          for (int delay : {0, 1, 3, 6})
            for (int role = 0; role < 3; ++role) {  // root, middle, last of the chain
              SCOPED_TRACE(::testing::Message()
                           << "by_test " << by_test << " strided " << strided << " chunk " << chunk
                           << " staging " << staging << " delay " << delay << " role " << role);
              Place here;
              Region r = here.region(strided);
              const std::vector<std::byte> data = pattern(r.bytes(), static_cast<int>(chunk));
              const std::vector<int> group = role == 0   ? std::vector<int>{1, 2}
                                             : role == 1 ? std::vector<int>{0, 1, 2}
                                                         : std::vector<int>{0, 1};
              if (role == 0) unpack(data.data(), r);  // the root holds the box
              auto owned = std::make_unique<Scripted>(
                  1, role == 0 ? std::vector<std::byte>{} : data, chunk, staging, delay);
              Scripted& script = *owned;
              Communicator comm(std::move(owned));
              Request req = comm.ibcast(r, group.front(), group, 5);
              if (by_test) {
                int polls = 0;
                while (!comm.test(req)) {
                  script.tick();
                  ASSERT_LT(++polls, 100000) << "test() never completes the chain";
                }
                EXPECT_TRUE(comm.test(req)) << "stays complete";
              } else {
                comm.wait(req);
              }
              EXPECT_TRUE(script.all_sends_done());
              EXPECT_LE(script.most_in_flight(), 4u);
              // Scratch: none for a contiguous box, else whole chunks within the bound (at least
              // one), never more than the box needs.
              const std::size_t chunks = (r.bytes() + chunk - 1) / chunk;
              EXPECT_EQ(script.scratch_bytes(),
                        strided
                            ? std::min(std::clamp<std::size_t>(staging / chunk, 1, chunks) * chunk,
                                       r.bytes())
                            : 0);
              std::vector<std::byte> landed(r.bytes());
              pack(r, landed.data());
              EXPECT_EQ(landed, data);
              EXPECT_EQ(script.wire(), role == 2 ? std::vector<std::byte>{} : data);
            }
}

}  // namespace
}  // namespace meshcast
