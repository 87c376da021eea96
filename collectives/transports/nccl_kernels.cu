#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "nccl_kernels.h"

namespace meshcast::detail {
namespace {

// Two regions of equal counts, flattened for a kernel argument.
struct Boxes {
  int rank;
  long long count[kMaxRank];
  long long ext_a[kMaxRank], off_a[kMaxRank];
  long long ext_b[kMaxRank], off_b[kMaxRank];
};

Boxes boxes_of(const Region& a, const Region& b) {
  Boxes x{};
  x.rank = static_cast<int>(a.count.size());
  for (int d = 0; d < x.rank; ++d) {
    x.count[d] = a.count[d];
    x.ext_a[d] = a.extent[d];
    x.off_a[d] = a.offset[d];
    x.ext_b[d] = b.extent[d];
    x.off_b[d] = b.offset[d];
  }
  return x;
}

// Element offsets of the i-th box element (row-major) in both buffers.
__device__ void locate(const Boxes& x, long long i, long long& a, long long& b) {
  long long sa = 1, sb = 1;
  a = b = 0;
  for (int d = x.rank - 1; d >= 0; --d) {
    const long long c = i % x.count[d];
    i /= x.count[d];
    a += (x.off_a[d] + c) * sa;
    b += (x.off_b[d] + c) * sb;
    sa *= x.ext_a[d];
    sb *= x.ext_b[d];
  }
}

template <class T>
__global__ void copy_kernel(const T* from, T* to, Boxes x, long long n) {
  for (long long i = blockIdx.x * 1LL * blockDim.x + threadIdx.x; i < n;
       i += 1LL * gridDim.x * blockDim.x) {
    long long a, b;
    locate(x, i, a, b);
    to[b] = from[a];
  }
}

template <class T>
__global__ void add_kernel(const T* from, T* to, Boxes x, long long n) {
  for (long long i = blockIdx.x * 1LL * blockDim.x + threadIdx.x; i < n;
       i += 1LL * gridDim.x * blockDim.x) {
    long long a, b;
    locate(x, i, a, b);
    to[b] = static_cast<T>(to[b] + from[a]);
  }
}

template <class T>
__global__ void zero_kernel(T* to, Boxes x, long long n) {
  for (long long i = blockIdx.x * 1LL * blockDim.x + threadIdx.x; i < n;
       i += 1LL * gridDim.x * blockDim.x) {
    long long a, b;
    locate(x, i, a, b);
    to[b] = T{};
  }
}

// Element types whose sum add_kernel's `+` gives. A complex number adds componentwise; a 16-byte
// element (c128) is copied and zeroed as a Pair of 64-bit words.
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

unsigned blocks(long long n) {
  return static_cast<unsigned>(n / 256 + 1 < 4096 ? n / 256 + 1 : 4096);
}

template <class T>
cudaError_t launch_copy(const Region& f, const Region& t, cudaStream_t s) {
  const long long n = f.elements();
  if (n == 0) return cudaSuccess;
  copy_kernel<T><<<blocks(n), 256, 0, s>>>(static_cast<const T*>(f.base), static_cast<T*>(t.base),
                                           boxes_of(f, t), n);
  return cudaGetLastError();
}

template <class T>
cudaError_t launch_add(const Region& f, const Region& t, const Boxes& x, long long n,
                       cudaStream_t s) {
  add_kernel<T>
      <<<blocks(n), 256, 0, s>>>(static_cast<const T*>(f.base), static_cast<T*>(t.base), x, n);
  return cudaGetLastError();
}

}  // namespace

cudaError_t gpu_copy(const Region& from, const Region& to, cudaStream_t stream) {
  if (from.count.size() > kMaxRank) return cudaErrorInvalidValue;
  switch (from.elem_size) {
    case 1:
      return launch_copy<std::uint8_t>(from, to, stream);
    case 2:
      return launch_copy<std::uint16_t>(from, to, stream);
    case 4:
      return launch_copy<std::uint32_t>(from, to, stream);
    case 8:
      return launch_copy<std::uint64_t>(from, to, stream);
    case 16:
      return launch_copy<Pair<std::uint64_t>>(from, to, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t gpu_zero(const Region& r, cudaStream_t stream) {
  const long long n = r.elements();
  if (n == 0) return cudaSuccess;
  if (r.count.size() > kMaxRank) return cudaErrorInvalidValue;
  const Boxes x = boxes_of(r, r);
  switch (r.elem_size) {
    case 1:
      zero_kernel<<<blocks(n), 256, 0, stream>>>(static_cast<std::uint8_t*>(r.base), x, n);
      break;
    case 2:
      zero_kernel<<<blocks(n), 256, 0, stream>>>(static_cast<std::uint16_t*>(r.base), x, n);
      break;
    case 4:
      zero_kernel<<<blocks(n), 256, 0, stream>>>(static_cast<std::uint32_t*>(r.base), x, n);
      break;
    case 8:
      zero_kernel<<<blocks(n), 256, 0, stream>>>(static_cast<std::uint64_t*>(r.base), x, n);
      break;
    case 16:
      zero_kernel<<<blocks(n), 256, 0, stream>>>(static_cast<Pair<std::uint64_t>*>(r.base), x, n);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t gpu_add(const Region& from, const Region& to, DType dtype, cudaStream_t stream) {
  const long long n = from.elements();
  if (n == 0) return cudaSuccess;
  if (from.count.size() > kMaxRank) return cudaErrorInvalidValue;
  const Boxes x = boxes_of(from, to);
  switch (dtype) {
    case DType::f16:
      return launch_add<__half>(from, to, x, n, stream);
    case DType::bf16:
      return launch_add<__nv_bfloat16>(from, to, x, n, stream);
    case DType::f32:
      return launch_add<float>(from, to, x, n, stream);
    case DType::f64:
      return launch_add<double>(from, to, x, n, stream);
    // Integers add as the unsigned type of their width: the sum wraps modulo 2^bits (numpy's
    // add) without signed overflow.
    case DType::i8:
    case DType::u8:
      return launch_add<std::uint8_t>(from, to, x, n, stream);
    case DType::i16:
    case DType::u16:
      return launch_add<std::uint16_t>(from, to, x, n, stream);
    case DType::i32:
    case DType::u32:
      return launch_add<std::uint32_t>(from, to, x, n, stream);
    case DType::i64:
    case DType::u64:
      return launch_add<unsigned long long>(from, to, x, n, stream);
    case DType::b8:
      return launch_add<Bool>(from, to, x, n, stream);
    case DType::c64:
      return launch_add<Pair<float>>(from, to, x, n, stream);
    case DType::c128:
      return launch_add<Pair<double>>(from, to, x, n, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace meshcast::detail
