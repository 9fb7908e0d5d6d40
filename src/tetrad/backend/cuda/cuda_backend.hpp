// The CUDA backend: the seam's Backend (backend/backend.hpp) on one NVIDIA GPU.
//
// Memory: cudaMalloc'd device buffers (zero-filled at allocation, as the interface requires),
// pinned host staging buffers (cudaMallocHost) for checkpoints, export and the async save.
// Queue: one CUDA stream per Queue (non-blocking streams; events without timing order them);
// ops return at once, the host reads results only through copy_to_host + synchronize.
// Op table: the kernels (kernels.hpp: one .cu per op family) and cuBLASLt (gemm.cpp); bf16 GEMMs
// on the tensor cores.
// Scratch that reductions need (weight-gradient column sums, sums of squares, the fused
// cross-entropy's row statistics) and cuBLASLt's plans and 32 MiB workspace belong to each Queue,
// so ops on different streams never share them; the scratch grows to the largest call during
// the first step and never after (no allocation inside later steps).
//
// Attention arithmetic: bf16 tensor cores when AttentionArgs::precision is BF16 (what a bf16
// training run asks for) or the process chose them (TETRAD_CUDA_ATTENTION=bf16, or
// set_attention_bf16(true)); fp32 (the exact path) otherwise. Anything else in that variable is
// refused.
//
// Device choice: "cuda" is device local_rank % device_count (local rank from OMPI_COMM_WORLD_
// LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID, LOCAL_RANK; 0 without them): one rank per GPU;
// "cuda:N" names the device.
#pragma once
#include <memory>
#include <string>

#include "tetrad/backend/backend.hpp"
#include "tetrad/backend/device_select.hpp"

namespace tetrad::backend::cuda {

// The registry's entry (backend::backends()): available with the device count, or not with the
// runtime's reason ("cudaGetDeviceCount: no CUDA-capable device is detected").
BackendInfo backend_info();

// Whether this process's "cuda" backend runs attention on bf16 tensor cores (see above).
void set_attention_bf16(bool on);
bool attention_bf16();

std::unique_ptr<Backend> create_cuda_backend(int device);

}  // namespace tetrad::backend::cuda
