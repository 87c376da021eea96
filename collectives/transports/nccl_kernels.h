// CUDA kernels of the NCCL backend: strided box copy, zero-fill and sum on GPU memory.
// Internal to collectives/.
#pragma once

#include <cuda_runtime.h>

#include "box_walk.h"
#include "meshcast/region.h"

namespace meshcast::detail {

cudaError_t gpu_copy(const Region& from, const Region& to, cudaStream_t stream);
cudaError_t gpu_zero(const Region& r, cudaStream_t stream);
cudaError_t gpu_add(const Region& from, const Region& to, DType dtype, cudaStream_t stream);

}  // namespace meshcast::detail
