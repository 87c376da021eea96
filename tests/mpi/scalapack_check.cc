// Cross-check against ScaLAPACK: for 2-D block layouts that are also ScaLAPACK distributions
// (one block per process), meshcast's MPI reshard and ScaLAPACK's p?gemr2d redistribute the same
// source tiles, and the destination buffers must agree bit for bit (memcmp) and hold exactly the
// expected values (count_mismatches). Run by ctest under mpirun at 4 ranks.
//   scalapack_check
// Exit status 0 when every case agrees, 1 on any difference, 77 (skip) below 4 ranks.
//
// How a meshcast tile is a ScaLAPACK local block. meshcast stores the global m x n matrix A
// row-major and each device's tile row-major; ScaLAPACK stores matrices column-major. A
// row-major r x c array is, byte for byte, the column-major c x r array of its transpose. So the
// matrix ScaLAPACK redistributes is B = A^T (n x m, column-major): B's global storage is A's,
// and every row-major local tile of A (rows [i0, i0 + r), columns [j0, j0 + c)) is, unchanged,
// the column-major local block of B (rows [j0, j0 + c), columns [i0, i0 + r)) with leading
// dimension c. A's dim 1 (split `splits(1)` ways) becomes B's rows, A's dim 0 (split
// `splits(0)` ways) B's columns. With n divisible by splits(1) and m by splits(0), meshcast's
// even shards [k*n/p, (k+1)*n/p) are ScaLAPACK's blocks of MB = n / splits(1) rows and
// NB = m / splits(0) columns, one block per process, so block-cyclic = block. The process that
// holds A's shard (bi, bj) sits at BLACS grid row bj, column bi (Cblacs_gridmap with explicit
// device ids, which also covers permuted, transposed (S1S0) and disjoint meshes).
#include <meshcast/meshcast.h>
#include <meshcast/mpi.h>
#include <meshcast/testing.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
// BLACS C interface and ScaLAPACK redistribution (libscalapack-openmpi ships no C header).
void Cblacs_pinfo(int* mypnum, int* nprocs);
void Cblacs_get(int context, int what, int* value);
void Cblacs_gridinit(int* context, const char* order, int nprow, int npcol);
void Cblacs_gridmap(int* context, int* usermap, int ldumap, int nprow, int npcol);
void Cblacs_gridinfo(int context, int* nprow, int* npcol, int* myrow, int* mycol);
void Cblacs_gridexit(int context);
void Cblacs_exit(int notdone);
void Cpdgemr2d(int m, int n, double* a, int ia, int ja, int* desca, double* b, int ib, int jb,
               int* descb, int context);
void Cpsgemr2d(int m, int n, float* a, int ia, int ja, int* desca, float* b, int ib, int jb,
               int* descb, int context);
int numroc_(const int* n, const int* nb, const int* iproc, const int* isrcproc, const int* nprocs);
void descinit_(int* desc, const int* m, const int* n, const int* mb, const int* nb,
               const int* irsrc, const int* icsrc, const int* context, const int* lld, int* info);
}

using namespace meshcast;

namespace {

// A meshcast 2-D layout seen as a ScaLAPACK distribution of B = A^T (see the file comment).
struct Grid {
  int context = -1;  // -1 on a process outside the layout's mesh
  int desc[9] = {};
  bool ok = true;  // BLACS placed this process where the mapping says
};

Grid make_grid(const Layout& l, int me) {
  const int m = static_cast<int>(l.shape()[0]), n = static_cast<int>(l.shape()[1]);
  const int nprow = static_cast<int>(l.splits(1)), npcol = static_cast<int>(l.splits(0));
  const int mb = n / nprow, nb = m / npcol;  // B's block: rows of B = columns of A
  std::vector<int> map(static_cast<std::size_t>(nprow * npcol), -1);
  for (std::int64_t i = 0; i < l.mesh().size(); ++i) {
    const auto bi = l.shard_index(0, i), bj = l.shard_index(1, i);
    map[static_cast<std::size_t>(bj + bi * nprow)] = l.mesh().device(i);
  }
  Grid g;
  Cblacs_get(0, 0, &g.context);  // the system context (MPI_COMM_WORLD); every rank calls gridmap
  Cblacs_gridmap(&g.context, map.data(), nprow, nprow, npcol);
  if (!l.mesh().contains(me)) {
    // Not in this grid: ScaLAPACK wants CTXT = -1; the other entries are not examined.
    g.context = -1;
    const int d[9] = {1, -1, n, m, mb, nb, 0, 0, 1};
    std::memcpy(g.desc, d, sizeof d);
    return g;
  }
  int pr = 0, pc = 0, row = -1, col = -1;
  Cblacs_gridinfo(g.context, &pr, &pc, &row, &col);
  const std::int64_t index = *l.mesh().index_of(me);
  g.ok = pr == nprow && pc == npcol && row == l.shard_index(1, index) &&
         col == l.shard_index(0, index);
  const int zero = 0, lld = std::max(1, numroc_(&n, &mb, &row, &zero, &nprow));
  int info = 0;
  descinit_(g.desc, &n, &m, &mb, &nb, &zero, &zero, &g.context, &lld, &info);
  g.ok = g.ok && info == 0 && lld == std::max<std::int64_t>(1, l.tile_of(me)[1].size());
  return g;
}

struct Case {
  const char* shape;
  const char* src;
  const char* dst;
};

}  // namespace

int main(int argc, char** argv) {
  MpiSession mpi(&argc, &argv, MpiOptions{60});
  Communicator& comm = mpi.world();
  const int me = comm.rank();
  if (comm.size() < 4) {
    if (me == 0) std::printf("SKIP: needs 4 ranks, have %d\n", comm.size());
    return 77;
  }
  int blacs_me = 0, blacs_n = 0;
  Cblacs_pinfo(&blacs_me, &blacs_n);
  int all = 0;  // a context over every process, for p?gemr2d
  Cblacs_get(0, 0, &all);
  Cblacs_gridinit(&all, "R", 1, blacs_n);

  // Sizes divisible by every split, so both libraries cut the same blocks; rows != columns, so
  // a transposition mistake cannot go unnoticed.
  const Case cases[] = {
      {"24,40", "2x2@0-3:S0S1", "1x4@0-3:S0S1"},        // 2x2 -> 1x4
      {"64,96", "4x1@0-3:S0S1", "2x2@0-3:S0S1"},        // 4x1 -> 2x2
      {"40,24", "2x2@0-3:S0S1", "2x2@0-3:S1S0"},        // 2x2 -> the transposed grid
      {"48,32", "2x2@0-3:S0S1", "2x2@[3,1,2,0]:S0S1"},  // same grid, devices permuted
      {"36,44", "1x4@0-3:S0S1", "4x1@0-3:S0S1"},        // column blocks -> row blocks
      {"20,28", "1x2@0-1:S0S1", "2x1@2-3:S0S1"},        // disjoint meshes
      {"32,16", "2x2@0-3:S01R", "2x2@[0,2,1,3]:RS10"},  // two axes on one dim
      {"256,384", "2x2@0-3:S0S1", "1x4@0-3:S0S1"},      // larger, several MPI messages
  };
  const Strategy strategies[] = {Strategy::Broadcast, Strategy::SendRecv, Strategy::AllGather};
  int failed = 0, checked = 0;
  for (const Case& c : cases) {
    for (DType t : {DType::f64, DType::f32}) {
      const Shape shape = parse_shape(c.shape);
      const Layout src = Layout::parse(shape, t, c.src, "src"),
                   dst = Layout::parse(shape, t, c.dst, "dst");
      const std::size_t elem = dtype_size(t);
      std::vector<std::byte> in, ours, theirs;
      if (src.mesh().contains(me)) {
        in.resize(static_cast<std::size_t>(src.local_elements(me)) * elem);
        fill_source(src, me, in.data());
      }
      const std::size_t out_bytes =
          dst.mesh().contains(me) ? static_cast<std::size_t>(dst.local_elements(me)) * elem : 0;

      // ScaLAPACK: B = A^T, (n x m), from grid `gs` to grid `gd`.
      Grid gs = make_grid(src, me), gd = make_grid(dst, me);
      theirs.assign(out_bytes, std::byte{0xA5});  // poison: a missed element cannot be right
      const int bm = static_cast<int>(shape[1]), bn = static_cast<int>(shape[0]);
      if (t == DType::f64)
        Cpdgemr2d(bm, bn, reinterpret_cast<double*>(in.data()), 1, 1, gs.desc,
                  reinterpret_cast<double*>(theirs.data()), 1, 1, gd.desc, all);
      else
        Cpsgemr2d(bm, bn, reinterpret_cast<float*>(in.data()), 1, 1, gs.desc,
                  reinterpret_cast<float*>(theirs.data()), 1, 1, gd.desc, all);
      const bool mapped = mpi.sum(gs.ok && gd.ok ? 0 : 1) == 0;
      if (gs.context >= 0) Cblacs_gridexit(gs.context);
      if (gd.context >= 0) Cblacs_gridexit(gd.context);

      for (Strategy s : strategies) {
        PlanOptions opt;
        opt.strategy = s;
        const Plan p = plan(src, dst, Topology::single_host(), opt);
        ours.assign(out_bytes, std::byte{0x5A});
        reshard(p, comm, in.empty() ? nullptr : in.data(), ours.empty() ? nullptr : ours.data());
        const long long wrong = mpi.sum(out_bytes ? count_mismatches(dst, me, ours.data()) : 0);
        const long long differ =
            mpi.sum(out_bytes && std::memcmp(ours.data(), theirs.data(), out_bytes) != 0 ? 1 : 0);
        const long long theirs_wrong =
            mpi.sum(out_bytes ? count_mismatches(dst, me, theirs.data()) : 0);
        ++checked;
        const bool ok = mapped && wrong == 0 && differ == 0 && theirs_wrong == 0;
        if (!ok) ++failed;
        if (me == 0)
          std::printf(
              "%s shape %-8s %s %s -> %s %-9s: meshcast wrong %lld, scalapack wrong %lld, "
              "ranks differing %lld%s\n",
              ok ? "ok  " : "FAIL", c.shape, to_string(t).c_str(), c.src, c.dst,
              to_string(s).c_str(), wrong, theirs_wrong, differ,
              mapped ? "" : ", BLACS grid not as mapped");
      }
    }
  }
  Cblacs_gridexit(all);
  Cblacs_exit(1);  // keep MPI: MpiSession finalizes it
  if (me == 0) std::printf("scalapack_check: %d comparisons, %d failed\n", checked, failed);
  return failed ? 1 : 0;
}
