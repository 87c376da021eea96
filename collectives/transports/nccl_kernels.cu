#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "nccl_kernels.h"

namespace meshcast::detail {
namespace {

// Each thread loads this many words before it stores any: loads in flight hide memory latency.
constexpr int kUnroll = 4;
constexpr int kThreads = 256;

// What a kernel does with a word of the source (f) and of the target (t): the target's new value.
struct Copy {
  static constexpr bool kReadsFrom = true, kReadsTo = false;
  template <class W>
  __device__ static W apply(W f, W) {
    return f;
  }
};
struct Zero {
  static constexpr bool kReadsFrom = false, kReadsTo = false;
  template <class W>
  __device__ static W apply(W, W) {
    return W{};
  }
};
struct Add {
  static constexpr bool kReadsFrom = true, kReadsTo = true;
  template <class W>
  __device__ static W apply(W f, W t) {
    return t + f;
  }
};

template <class Word, class Op, class Index>
__global__ void walk_kernel(const Word* from, Word* to, BoxWalk w, Index n) {
  const Index step = static_cast<Index>(gridDim.x) * kThreads;
  for (Index i0 = static_cast<Index>(blockIdx.x) * kThreads + threadIdx.x; i0 < n;
       i0 += kUnroll * step) {
    Word f[kUnroll]{}, t[kUnroll]{};
    long long at[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const Index i = i0 + k * step;
      if (i < n) {
        long long a;
        w.locate(i, a, at[k]);
        if constexpr (Op::kReadsFrom) f[k] = from[a];
        if constexpr (Op::kReadsTo) t[k] = to[at[k]];
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k)
      if (i0 + k * step < n) to[at[k]] = Op::apply(f[k], t[k]);
  }
}

template <class Word, class Op>
cudaError_t launch(const void* from, void* to, const BoxWalk& w, cudaStream_t s) {
  const long long n = w.words();
  if (n == 0) return cudaSuccess;
  const long long want = (n + kThreads * kUnroll - 1) / (kThreads * kUnroll);
  const unsigned blocks = static_cast<unsigned>(want < 4096 ? want : 4096);
  const auto* f = reinterpret_cast<const Word*>(static_cast<const char*>(from) + w.first_a);
  auto* t = reinterpret_cast<Word*>(static_cast<char*>(to) + w.first_b);
  // 32-bit indices divide several times faster; they serve while i0 + kUnroll * step fits.
  if (n < (1LL << 32) - (1LL << 24))
    walk_kernel<Word, Op, unsigned><<<blocks, kThreads, 0, s>>>(f, t, w, static_cast<unsigned>(n));
  else
    walk_kernel<Word, Op, unsigned long long><<<blocks, kThreads, 0, s>>>(f, t, w, n);
  return cudaGetLastError();
}

// A copy or a fill moves bytes: the widest word the addresses allow, whatever the dtype.
template <class Op>
cudaError_t launch_bytes(const Region& from, const Region& to, cudaStream_t s) {
  const BoxWalk w = box_walk(from, to, 16, 1);
  switch (w.word) {
    case 16:
      return launch<uint4, Op>(from.base, to.base, w, s);
    case 8:
      return launch<uint2, Op>(from.base, to.base, w, s);
    case 4:
      return launch<std::uint32_t, Op>(from.base, to.base, w, s);
    case 2:
      return launch<std::uint16_t, Op>(from.base, to.base, w, s);
  }
  return launch<std::uint8_t, Op>(from.base, to.base, w, s);
}

// N elements of T that add lane by lane, loaded and stored as one word.
template <class T, int N>
struct alignas(N == 1 ? alignof(T) : sizeof(T) * N) Lanes {
  T v[N];
};
template <class T, int N>
__device__ Lanes<T, N> operator+(Lanes<T, N> x, const Lanes<T, N>& y) {
#pragma unroll
  for (int k = 0; k < N; ++k) x.v[k] = static_cast<T>(x.v[k] + y.v[k]);
  return x;
}

// Element types whose sum T's `+` gives. A complex number adds componentwise.
template <class T>
struct Pair {
  T re, im;
};
template <class T>
__device__ Pair<T> operator+(Pair<T> x, Pair<T> y) {
  return {x.re + y.re, x.im + y.im};
}
// numpy's bool: the sum is logical or, 0 or 1.
struct Bool {
  std::uint8_t v;
};
__device__ Bool operator+(Bool x, Bool y) { return {static_cast<std::uint8_t>((x.v | y.v) != 0)}; }

// Sixteen bytes of lanes where the addresses allow, else one element per word.
template <class T>
cudaError_t launch_add(const Region& from, const Region& to, cudaStream_t s) {
  constexpr int kWide = 16 / sizeof(T);
  if constexpr (kWide > 1) {
    const BoxWalk w = box_walk(from, to, 16, sizeof(T));
    if (w.word == 16) return launch<Lanes<T, kWide>, Add>(from.base, to.base, w, s);
  }
  return launch<Lanes<T, 1>, Add>(from.base, to.base, box_walk(from, to, sizeof(T), sizeof(T)), s);
}

bool walkable(const Region& from, const Region& to) {
  const std::size_t rank = from.count.size();
  return rank <= kMaxRank && to.count == from.count && from.extent.size() == rank &&
         to.extent.size() == rank && from.offset.size() == rank && to.offset.size() == rank &&
         from.elem_size == to.elem_size;
}

}  // namespace

cudaError_t gpu_copy(const Region& from, const Region& to, cudaStream_t stream) {
  if (!walkable(from, to)) return cudaErrorInvalidValue;
  return launch_bytes<Copy>(from, to, stream);
}

cudaError_t gpu_zero(const Region& r, cudaStream_t stream) {
  if (!walkable(r, r)) return cudaErrorInvalidValue;
  return launch_bytes<Zero>(r, r, stream);
}

cudaError_t gpu_add(const Region& from, const Region& to, DType dtype, cudaStream_t stream) {
  if (!walkable(from, to) || from.elem_size != dtype_size(dtype)) return cudaErrorInvalidValue;
  switch (dtype) {
    case DType::f16:
      return launch_add<__half>(from, to, stream);
    case DType::bf16:
      return launch_add<__nv_bfloat16>(from, to, stream);
    case DType::f32:
      return launch_add<float>(from, to, stream);
    case DType::f64:
      return launch_add<double>(from, to, stream);
    // Integers add as the unsigned type of their width: the sum wraps modulo 2^bits (numpy's
    // add) without signed overflow.
    case DType::i8:
    case DType::u8:
      return launch_add<std::uint8_t>(from, to, stream);
    case DType::i16:
    case DType::u16:
      return launch_add<std::uint16_t>(from, to, stream);
    case DType::i32:
    case DType::u32:
      return launch_add<std::uint32_t>(from, to, stream);
    case DType::i64:
    case DType::u64:
      return launch_add<unsigned long long>(from, to, stream);
    case DType::b8:
      return launch_add<Bool>(from, to, stream);
    case DType::c64:
      return launch_add<Pair<float>>(from, to, stream);
    case DType::c128:
      return launch_add<Pair<double>>(from, to, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace meshcast::detail
