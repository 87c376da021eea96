// A user's program on meshcast::nccl: one process (MESHCAST_RANK=0, MESHCAST_SIZE=1) moves a
// tensor within its GPU's memory. Without a GPU NcclSession refuses, naming it; the program then
// says so and exits 77 (skipped): it linked and started, which is what a machine without a GPU
// can check.
#include "meshcast/nccl.h"

#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <vector>

#include "meshcast/bootstrap.h"
#include "meshcast/error.h"
#include "meshcast/meshcast.h"
#include "meshcast/testing.h"

int main() {
  try {
    const auto boot = meshcast::TcpBootstrap::from_env();
    if (!boot) return 2;
    std::unique_ptr<meshcast::NcclSession> session;
    try {
      session = std::make_unique<meshcast::NcclSession>(*boot);
    } catch (const meshcast::Error& e) {  // InternalError here, CommError where a peer has none
      if (std::strstr(e.what(), "no CUDA device") == nullptr) throw;
      std::printf("consumer: linked; no GPU here (%s)\n", e.what());
      return 77;
    }
    const meshcast::Shape shape{64};
    const auto src = meshcast::Layout::parse(shape, meshcast::DType::f32, "1@0:R");
    const auto dst = meshcast::Layout::parse(shape, meshcast::DType::f32, "1@0:R");
    std::vector<float> in(64), out(64);
    meshcast::fill_source(src, 0, in.data());
    auto gin = session->allocate(in.size() * 4), gout = session->allocate(out.size() * 4);
    session->upload(in.data(), gin.get(), in.size() * 4);
    meshcast::reshard(meshcast::plan(src, dst), session->world(), gin.get(), gout.get());
    session->download(gout.get(), out.data(), out.size() * 4);
    return meshcast::count_mismatches(dst, 0, out.data()) == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
