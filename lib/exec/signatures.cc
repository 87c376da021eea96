#include "lib/exec/signatures.h"

#include <thread>

namespace meshcast::detail {

void PeerSignatures::post(Communicator& comm, int tag, Words to, Words from) {
  if (comm.caps().device_memory) return;
  to_ = std::move(to);
  from_ = std::move(from);
  arrived_.assign(from_.size(), 0);  // sized once: receives write into it
  checked_.assign(from_.size(), 0);
  for (auto& [device, word] : to_)
    sends_.push_back(comm.isend(Region::contiguous(&word, sizeof word), device, tag));
  for (std::size_t i = 0; i < from_.size(); ++i)
    recvs_.push_back(
        comm.irecv(Region::contiguous(&arrived_[i], sizeof arrived_[i]), from_[i].first, tag));
}

void PeerSignatures::check(std::size_t i, const Differ& differ) {
  checked_[i] = 1;
  if (arrived_[i] != from_[i].second) differ(from_[i].first, arrived_[i], from_[i].second);
}

bool PeerSignatures::test(Communicator& comm, const Differ& differ) {
  bool all = true;
  for (std::size_t i = 0; i < recvs_.size(); ++i) {
    if (checked_[i]) continue;
    if (comm.test(recvs_[i]))
      check(i, differ);
    else
      all = false;
  }
  for (auto& r : sends_) all = comm.test(r) && all;
  return all;
}

void PeerSignatures::wait_all(Communicator& comm, const Differ& differ) {
  for (std::size_t i = 0; i < recvs_.size(); ++i) {
    if (checked_[i]) continue;
    comm.wait(recvs_[i]);
    check(i, differ);
  }
  comm.wait_all(sends_);
}

void PeerSignatures::await_from(Communicator& comm, int device, const Differ& differ,
                                std::chrono::milliseconds most) {
  const auto until = std::chrono::steady_clock::now() + most;
  for (std::size_t i = 0; i < from_.size(); ++i) {
    if (from_[i].first != device || checked_[i]) continue;
    while (!comm.test(recvs_[i])) {
      if (std::chrono::steady_clock::now() >= until) return;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    check(i, differ);
  }
}

void PeerSignatures::cancel(Communicator& comm) {
  for (auto& r : sends_) comm.cancel(r);
  for (auto& r : recvs_) comm.cancel(r);
}

}  // namespace meshcast::detail
