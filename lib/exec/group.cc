// Groups and their tags. The transport's data tags [0, max_tag] are cut into `contexts_` windows
// of `window_` tags; the world holds window 0 and each group the next free one, in creation order
// (the same on every device, since every device creates its groups in the same order). An
// operation takes the next run of its group's window; runs cycle through the window, and a run
// still held by an operation in flight on this device is freed first by finishing that operation
// (every device reserves the same runs in the same order, so a peer that posts into a run has
// finished that run's previous operation too, and messages of one run never meet another's).
#include <algorithm>
#include <deque>
#include <unordered_map>

#include "lib/support/raised.h"
#include "meshcast/communicator.h"

namespace meshcast {

struct Group::State {
  Communicator* comm = nullptr;
  std::vector<int> devices;
  std::unordered_map<int, int> index;  // device -> rank in the group
  int base = 0;                        // the group's first tag
  std::uint32_t window = 1;
  std::uint64_t next = 0;  // the next run's start, unwrapped
  std::uint64_t ops = 0;   // operations started (names for node-memory operations)
  std::uint64_t context = 0;
  struct Run {
    std::uint64_t start;  // unwrapped, as `next`
    std::weak_ptr<InFlight> op;
  };
  // Runs of operations that may still be in flight, oldest first. Runs tile the unwrapped tags
  // in order, and a reservation finishes every live run its tags meet: so the live runs all
  // lie within the last window, and those a new run meets are the oldest ones (a prefix).
  std::deque<Run> live;
  std::size_t prune_live_at = 64;
};

namespace {

// Below this many data tags, groups get smaller windows (MPI guarantees only 32768 tags).
constexpr std::uint32_t kWindow = 1u << 16;

}  // namespace

void Communicator::init_groups() {
  const auto tags = static_cast<std::uint64_t>(std::max(caps_.max_tag, 0)) + 1;
  window_ = static_cast<std::uint32_t>(
      std::min<std::uint64_t>(kWindow, std::max<std::uint64_t>(tags / 8, 1)));
  contexts_ = static_cast<std::uint32_t>(tags / window_);
  live_.assign(contexts_, {});
  std::vector<int> all(static_cast<std::size_t>(size_));
  for (int d = 0; d < size_; ++d) all[static_cast<std::size_t>(d)] = d;
  auto s = std::make_shared<Group::State>();
  s->comm = this;
  s->devices = std::move(all);
  s->window = window_;
  live_[0] = s;
  world_ = Group(std::move(s));
}

Group Communicator::group(std::vector<int> devices) {
  if (devices.empty()) throw ValidationError("group", "is empty");
  auto s = std::make_shared<Group::State>();
  s->index.reserve(devices.size());
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const int d = devices[i];
    if (d < 0 || d >= size_)
      throw ValidationError("group", "device " + std::to_string(d) + " is outside the world of " +
                                         std::to_string(size_));
    if (!s->index.emplace(d, static_cast<int>(i)).second)
      throw ValidationError("group", "device " + std::to_string(d) + " appears twice");
  }
  if (contexts_ < 2)
    throw ValidationError("group", "the " + backend() + " transport has tags for the world only");
  const auto context = 1 + groups_made_ % (contexts_ - 1);
  if (!live_[context].expired())
    throw ValidationError("group", "more than " + std::to_string(contexts_ - 1) +
                                       " groups alive at once on one communicator");
  ++groups_made_;
  s->comm = this;
  s->devices = std::move(devices);
  s->context = context;
  s->base = static_cast<int>(context * window_);
  s->window = window_;
  live_[context] = s;
  return Group(std::move(s));
}

const std::vector<int>& Group::devices() const {
  static const std::vector<int> none;
  return s_ ? s_->devices : none;
}

int Group::index_of(int device) const {
  if (!s_) return -1;
  if (s_->index.empty()) return device >= 0 && device < size() ? device : -1;  // the world
  const auto it = s_->index.find(device);
  return it == s_->index.end() ? -1 : it->second;
}

Communicator& Group::comm() const {
  if (!s_) throw ValidationError("group", "is empty (default-constructed)");
  return *s_->comm;
}

TagBlock Group::reserve(std::size_t streams, std::weak_ptr<InFlight> op) const {
  if (!s_) throw ValidationError("group", "is empty (default-constructed)");
  State& s = *s_;
  s.comm->check_live();
  const auto length = static_cast<std::uint32_t>(std::clamp<std::size_t>(streams, 1, s.window));
  const std::uint64_t first = s.next;
  const auto start = static_cast<std::uint32_t>(first % s.window);
  s.next += length;
  ++s.ops;
  // Finish what still holds tags of this run (rare: the window is 65536 tags on most transports):
  // the live runs that start before this run's image one window back ends.
  while (!s.live.empty() && s.live.front().start + s.window < first + length) {
    const auto held = s.live.front().op.lock();
    s.live.pop_front();
    if (held && !held->done()) held->finish();
  }
  const auto completed = [](const State::Run& r) {
    const auto held = r.op.lock();
    return !held || held->done();
  };
  while (!s.live.empty() && completed(s.live.front())) s.live.pop_front();
  if (!op.expired()) {
    // Pruned as it doubles: ops that completed at once are never polled away.
    auto& live = s.comm->in_flight_;
    if (live.size() >= s.comm->prune_in_flight_at_) {
      s.comm->prune_in_flight();
      s.comm->prune_in_flight_at_ = std::max<std::size_t>(64, 2 * live.size());
    }
    live.push_back(op);
    // In order of start: a reservation made inside a finish() above took later tags, and is in
    // already. Completed runs behind a live one (each weak_ptr holds its op's allocation) are
    // dropped as the runs double.
    const auto at =
        std::upper_bound(s.live.begin(), s.live.end(), first,
                         [](std::uint64_t f, const State::Run& r) { return f < r.start; });
    s.live.insert(at, {first, std::move(op)});
    if (s.live.size() >= s.prune_live_at) {
      std::erase_if(s.live, completed);
      s.prune_live_at = std::max<std::size_t>(64, 2 * s.live.size());
    }
  }
  return TagBlock(s.base, start, length, s.window);
}

void Communicator::prune_in_flight() {
  std::erase_if(in_flight_, [](const std::weak_ptr<InFlight>& w) {
    const auto op = w.lock();
    return !op || op->done();
  });
}

void Communicator::poll_in_flight() {
  // (An op polled here that waits polls no others; where transfers match in issue order, a
  // poll would issue them in an order that differs between devices.)
  if (polling_ || in_flight_.empty() || caps_.ordered_matching) return;
  const detail::Raised raised(polling_);
  prune_in_flight();
  // By index, each op held while it runs: polling one may start another (a reservation).
  for (std::size_t i = 0; i < in_flight_.size(); ++i) {
    const auto op = in_flight_[i].lock();
    if (!op || op->done()) continue;
    try {
      op->poll();
    } catch (const std::exception&) {
      // The op keeps its failure and throws it where it is tested or waited on: the wait this
      // poll helps is another operation's, which its own peers end if they must.
    }
  }
}

std::uint32_t Group::window() const {
  if (!s_) throw ValidationError("group", "is empty (default-constructed)");
  return s_->window;
}

std::uint64_t Group::next_id() const {
  if (!s_) throw ValidationError("group", "is empty (default-constructed)");
  s_->comm->check_live();
  std::uint64_t z = s_->context * 0x9e3779b97f4a7c15ull + (++s_->ops);  // splitmix64
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace meshcast
