#include "meshcast/communicator.h"

namespace meshcast {
namespace {

// Several requests completed as one (the default broadcast's sends).
struct Composite : Request::Impl {
  std::vector<Request> parts;
};

}  // namespace

Request Communicator::ibcast(const Region& region, int root, std::span<const int> group, int tag) {
  if (rank() != root) return irecv(region, root, tag);
  auto all = std::make_shared<Composite>();
  for (int d : group)
    if (d != root) all->parts.push_back(isend(region, d, tag));
  return Request(std::move(all));
}

std::shared_ptr<void> Communicator::scratch(std::size_t bytes) {
  return std::shared_ptr<void>(::operator new(bytes), [](void* p) { ::operator delete(p); });
}

void Communicator::wait(Request& r) {
  if (!r.valid()) return;
  if (auto* c = dynamic_cast<Composite*>(r.get()))
    wait_all(c->parts);
  else
    wait_one(*r.get());
  r.reset();
}

void Communicator::wait_all(std::span<Request> rs) {
  for (Request& r : rs) wait(r);
}

}  // namespace meshcast
