// Baselines for bench/mpi_reshard.cc, each the way a careful user would write the move by hand
// with MPI (or ScaLAPACK) alone. Every one is set up once (counts, boxes, buffers) and then
// run() many times; run() is what gets timed. Communicators are over the union of the two
// meshes, rank order = device id order.
#pragma once

#define OMPI_SKIP_MPICXX 1
#include <meshcast/meshcast.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace mcbench {

inline void mpi_check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw std::runtime_error(std::string(what) + " failed");
}

// Position of a device id in the sorted union (its rank in the union's communicator).
inline int union_rank(const std::vector<int>& devices, int device) {
  return static_cast<int>(std::lower_bound(devices.begin(), devices.end(), device) -
                          devices.begin());
}

// A hand-written MPI_Alltoallv redistribution. Each task's box goes to each of its destination
// devices from one holder: the destination itself if it holds the box (a local copy, no MPI),
// otherwise the holders in turn (the k-th destination that lacks the box gets it from holder
// k mod holders), which spreads a replicated source's load. Each rank packs what each peer
// needs from its tile into one send buffer (peers in rank order, tasks in task order), one
// MPI_Alltoallv moves everything, and each rank unpacks in the same order.
class AlltoallvMove {
 public:
  AlltoallvMove(const meshcast::Layout& src, const meshcast::Layout& dst, MPI_Comm comm,
                std::vector<int> devices, int me, const void* src_local, void* dst_local)
      : comm_(comm) {
    using namespace meshcast;
    const int n = static_cast<int>(devices.size());
    const std::size_t elem = dtype_size(src.dtype());
    const Box stile = src.mesh().contains(me) ? src.tile_of(me) : Box();
    const Box dtile = dst.mesh().contains(me) ? dst.tile_of(me) : Box();
    auto* sbase = const_cast<void*>(src_local);
    std::vector<std::vector<Region>> to(static_cast<std::size_t>(n)),
        from(static_cast<std::size_t>(n));
    for (const Task& t : tasks(src, dst)) {
      if (t.sources.size() != 1) throw std::runtime_error("AlltoallvMove: partial sources");
      const std::vector<int>& holders = t.sources[0];
      std::size_t k = 0;
      for (int d : t.destinations) {
        int s = d;
        if (std::find(holders.begin(), holders.end(), d) == holders.end())
          s = holders[k++ % holders.size()];
        if (s == me && d == me) {
          local_.push_back(
              {Region::of(sbase, elem, stile, t.box), Region::of(dst_local, elem, dtile, t.box)});
        } else if (s == me) {
          to[static_cast<std::size_t>(union_rank(devices, d))].push_back(
              Region::of(sbase, elem, stile, t.box));
        } else if (d == me) {
          from[static_cast<std::size_t>(union_rank(devices, s))].push_back(
              Region::of(dst_local, elem, dtile, t.box));
        }
      }
    }
    auto layout = [n](const std::vector<std::vector<Region>>& pieces, std::vector<int>& counts,
                      std::vector<int>& displs, std::vector<Region>& flat) {
      counts.assign(static_cast<std::size_t>(n), 0);
      displs.assign(static_cast<std::size_t>(n), 0);
      std::int64_t off = 0;
      for (int p = 0; p < n; ++p) {
        displs[static_cast<std::size_t>(p)] = static_cast<int>(off);
        for (const Region& r : pieces[static_cast<std::size_t>(p)]) {
          off += static_cast<std::int64_t>(r.bytes());
          flat.push_back(r);
        }
        counts[static_cast<std::size_t>(p)] =
            static_cast<int>(off - displs[static_cast<std::size_t>(p)]);
      }
      if (off > INT32_MAX) throw std::runtime_error("AlltoallvMove: more than 2 GiB per rank");
      return static_cast<std::size_t>(off);
    };
    sbuf_.resize(layout(to, scounts_, sdispls_, send_));
    rbuf_.resize(layout(from, rcounts_, rdispls_, recv_));
  }

  void run() {
    std::size_t off = 0;
    for (const meshcast::Region& r : send_) {
      meshcast::pack(r, sbuf_.data() + off);
      off += r.bytes();
    }
    for (const auto& [a, b] : local_) meshcast::copy_region(a, b);
    mpi_check(MPI_Alltoallv(sbuf_.data(), scounts_.data(), sdispls_.data(), MPI_BYTE, rbuf_.data(),
                            rcounts_.data(), rdispls_.data(), MPI_BYTE, comm_),
              "MPI_Alltoallv");
    off = 0;
    for (const meshcast::Region& r : recv_) {
      meshcast::unpack(rbuf_.data() + off, r);
      off += r.bytes();
    }
  }

 private:
  MPI_Comm comm_;
  std::vector<int> scounts_, sdispls_, rcounts_, rdispls_;
  std::vector<meshcast::Region> send_, recv_;
  std::vector<std::pair<meshcast::Region, meshcast::Region>> local_;
  std::vector<std::byte> sbuf_, rbuf_;
};

// All-gather-then-slice: one holder of each distinct source tile (the first in mesh order)
// contributes it whole to one MPI_Allgatherv over the union, so every rank ends with the whole
// tensor (as tiles, in rank order); each destination rank then copies its tile out of it.
class AllgatherSliceMove {
 public:
  AllgatherSliceMove(const meshcast::Layout& src, const meshcast::Layout& dst, MPI_Comm comm,
                     std::vector<int> devices, int me, const void* src_local, void* dst_local)
      : comm_(comm), src_(src_local) {
    using namespace meshcast;
    const int n = static_cast<int>(devices.size());
    const std::size_t elem = dtype_size(src.dtype());
    counts_.assign(static_cast<std::size_t>(n), 0);
    displs_.assign(static_cast<std::size_t>(n), 0);
    std::vector<Box> tiles(static_cast<std::size_t>(n));
    for (const auto& group : src.replica_groups()) {
      const auto p = static_cast<std::size_t>(union_rank(devices, group[0]));
      tiles[p] = src.tile_of(group[0]);
      counts_[p] = static_cast<int>(tiles[p].volume() * static_cast<std::int64_t>(elem));
    }
    std::int64_t off = 0;
    for (int p = 0; p < n; ++p) {
      displs_[static_cast<std::size_t>(p)] = static_cast<int>(off);
      off += counts_[static_cast<std::size_t>(p)];
    }
    if (off > INT32_MAX) throw std::runtime_error("AllgatherSliceMove: more than 2 GiB");
    all_.resize(static_cast<std::size_t>(off));
    mine_ = counts_[static_cast<std::size_t>(union_rank(devices, me))];
    if (!dst.mesh().contains(me)) return;
    const Box dtile = dst.tile_of(me);
    for (int p = 0; p < n; ++p) {
      const Box& t = tiles[static_cast<std::size_t>(p)];
      if (!counts_[static_cast<std::size_t>(p)]) continue;
      const Box b = intersect(t, dtile);
      if (b.empty()) continue;
      slices_.push_back({Region::of(all_.data() + displs_[static_cast<std::size_t>(p)], elem, t, b),
                         Region::of(dst_local, elem, dtile, b)});
    }
  }

  void run() {
    mpi_check(MPI_Allgatherv(src_, mine_, MPI_BYTE, all_.data(), counts_.data(), displs_.data(),
                             MPI_BYTE, comm_),
              "MPI_Allgatherv");
    for (const auto& [a, b] : slices_) meshcast::copy_region(a, b);
  }

 private:
  MPI_Comm comm_;
  const void* src_;
  int mine_ = 0;
  std::vector<int> counts_, displs_;
  std::vector<std::byte> all_;
  std::vector<std::pair<meshcast::Region, meshcast::Region>> slices_;
};

}  // namespace mcbench

#ifdef MESHCAST_HAS_SCALAPACK
extern "C" {
// BLACS C interface and ScaLAPACK redistribution (libscalapack-openmpi ships no C header).
void Cblacs_pinfo(int* mypnum, int* nprocs);
void Cblacs_get(int context, int what, int* value);
void Cblacs_gridinit(int* context, const char* order, int nprow, int npcol);
void Cblacs_gridmap(int* context, int* usermap, int ldumap, int nprow, int npcol);
void Cblacs_gridinfo(int context, int* nprow, int* npcol, int* myrow, int* mycol);
void Cblacs_gridexit(int context);
void Cblacs_exit(int notdone);
int Csys2blacs_handle(MPI_Comm comm);
void Cfree_blacs_system_handle(int handle);
void Cpdgemr2d(int m, int n, double* a, int ia, int ja, int* desca, double* b, int ib, int jb,
               int* descb, int context);
void Cpsgemr2d(int m, int n, float* a, int ia, int ja, int* desca, float* b, int ib, int jb,
               int* descb, int context);
}

namespace mcbench {

// A 2-D meshcast layout whose tiles are ScaLAPACK blocks, as a BLACS grid and descriptor of
// B = A^T: a row-major m x n matrix A is byte for byte the column-major n x m matrix A^T, and
// each row-major tile of A (r x c) the column-major local block of A^T (c x r, leading
// dimension c). A's dim 1 (split q ways) is B's rows, A's dim 0 (split p ways) B's columns, so
// the grid is q x p, blocks MB = n/q, NB = m/p (sizes must divide), and the holder of A's shard
// (bi, bj) sits at grid row bj, column bi. tests/mpi/scalapack_check.cc checks the mapping bit
// for bit against meshcast. `system` is a BLACS system handle (Csys2blacs_handle) of a
// communicator whose rank i is device i; every process of it constructs the grid (collective).
struct ScalapackGrid {
  int context = -1;
  int desc[9] = {};

  ScalapackGrid(const meshcast::Layout& l, int me, int system) {
    const int m = static_cast<int>(l.shape()[0]), n = static_cast<int>(l.shape()[1]);
    const int nprow = static_cast<int>(l.splits(1)), npcol = static_cast<int>(l.splits(0));
    if (n % nprow || m % npcol || l.mesh().size() != nprow * npcol)
      throw std::runtime_error("ScalapackGrid: " + l.str() + " is not a ScaLAPACK block layout");
    std::vector<int> map(static_cast<std::size_t>(nprow * npcol), -1);
    for (std::int64_t i = 0; i < l.mesh().size(); ++i)
      map[static_cast<std::size_t>(l.shard_index(1, i) + l.shard_index(0, i) * nprow)] =
          l.mesh().device(i);
    context = system;
    Cblacs_gridmap(&context, map.data(), nprow, nprow, npcol);
    const int mb = n / nprow, nb = m / npcol;
    const bool member = l.mesh().contains(me);
    if (!member) context = -1;  // p?gemr2d: CTXT -1 outside the grid, the rest unread
    const int d[9] = {1, context, n, m, mb, nb, 0, 0, std::max(1, mb)};
    std::memcpy(desc, d, sizeof d);
  }
  ~ScalapackGrid() {
    if (context >= 0) Cblacs_gridexit(context);
  }
  ScalapackGrid(const ScalapackGrid&) = delete;
  ScalapackGrid& operator=(const ScalapackGrid&) = delete;
};

// Cp?gemr2d of the whole matrix from grid `a` to grid `b`; `all` is a context over every rank.
inline void scalapack_gemr2d(meshcast::DType t, const meshcast::Layout& l, ScalapackGrid& a,
                             const void* in, ScalapackGrid& b, void* out, int all) {
  const int bm = static_cast<int>(l.shape()[1]), bn = static_cast<int>(l.shape()[0]);
  if (t == meshcast::DType::f64)
    Cpdgemr2d(bm, bn, static_cast<double*>(const_cast<void*>(in)), 1, 1, a.desc,
              static_cast<double*>(out), 1, 1, b.desc, all);
  else if (t == meshcast::DType::f32)
    Cpsgemr2d(bm, bn, static_cast<float*>(const_cast<void*>(in)), 1, 1, a.desc,
              static_cast<float*>(out), 1, 1, b.desc, all);
  else
    throw std::runtime_error("scalapack_gemr2d: f64 or f32 only");
}

}  // namespace mcbench
#endif
