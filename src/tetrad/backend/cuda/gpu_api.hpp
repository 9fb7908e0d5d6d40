// The one place where the CUDA runtime is named. Everything else in backend/cuda calls these
// gpu* names, so that a HIP port is this header with hip* on the right-hand side (hipMalloc,
// hipStream_t, hipEvent_t, ... have the same signatures) plus rocBLAS/hipBLASLt for gemm.cpp and
// RCCL for the communicator (whose API is NCCL's).
//
// Errors: GPU_CHECK(call) throws tetrad::Error naming the call, the file:line and the runtime's
// error string, never aborts: a job on a GPU that fails reports it like any other error.
// gpu_check_launch("kernel") after each launch turns a bad launch configuration into such an error
// at once instead of at the next synchronising call.
#pragma once
#include <cuda_runtime_api.h>

#include <string>

#include "tetrad/core/error.hpp"

namespace tetrad::gpu {

using gpuStream_t = cudaStream_t;
using gpuEvent_t = cudaEvent_t;
using gpuError_t = cudaError_t;
constexpr gpuError_t gpuSuccess = cudaSuccess;

inline const char* gpu_error_string(gpuError_t e) { return cudaGetErrorString(e); }

[[noreturn]] inline void gpu_fail(const char* call, const char* file, int line, gpuError_t e) {
  fail("CUDA call failed: ", call, " at ", file, ":", line, ": ", gpu_error_string(e), " (",
       int(e), ")");
}

inline void gpu_check_launch(const char* kernel) {
  const gpuError_t e = cudaGetLastError();
  if (e != gpuSuccess) fail("CUDA kernel launch failed: ", kernel, ": ", gpu_error_string(e));
}

// Thin wrappers (same argument order as the runtime; HIP's are identical).
inline gpuError_t gpuMalloc(void** p, size_t n) { return cudaMalloc(p, n); }
inline gpuError_t gpuFree(void* p) { return cudaFree(p); }
inline gpuError_t gpuMallocHost(void** p, size_t n) { return cudaMallocHost(p, n); }
inline gpuError_t gpuFreeHost(void* p) { return cudaFreeHost(p); }
inline gpuError_t gpuMemcpyAsync(void* d, const void* s, size_t n, gpuStream_t st) {
  return cudaMemcpyAsync(d, s, n, cudaMemcpyDefault, st);
}
inline gpuError_t gpuMemcpy2DAsync(void* d, size_t dpitch, const void* s, size_t spitch,
                                   size_t width, size_t height, gpuStream_t st) {
  return cudaMemcpy2DAsync(d, dpitch, s, spitch, width, height, cudaMemcpyDefault, st);
}
inline gpuError_t gpuMemsetAsync(void* d, int v, size_t n, gpuStream_t st) {
  return cudaMemsetAsync(d, v, n, st);
}
inline gpuError_t gpuStreamCreate(gpuStream_t* s) {
  return cudaStreamCreateWithFlags(s, cudaStreamNonBlocking);
}
inline gpuError_t gpuStreamDestroy(gpuStream_t s) { return cudaStreamDestroy(s); }
inline gpuError_t gpuStreamSynchronize(gpuStream_t s) { return cudaStreamSynchronize(s); }
inline gpuError_t gpuStreamWaitEvent(gpuStream_t s, gpuEvent_t e) {
  return cudaStreamWaitEvent(s, e, 0);
}
inline gpuError_t gpuEventCreate(gpuEvent_t* e, bool timing) {
  return cudaEventCreateWithFlags(e, timing ? cudaEventDefault : cudaEventDisableTiming);
}
inline gpuError_t gpuEventDestroy(gpuEvent_t e) { return cudaEventDestroy(e); }
inline gpuError_t gpuEventRecord(gpuEvent_t e, gpuStream_t s) { return cudaEventRecord(e, s); }
inline gpuError_t gpuEventQuery(gpuEvent_t e) { return cudaEventQuery(e); }
inline gpuError_t gpuEventSynchronize(gpuEvent_t e) { return cudaEventSynchronize(e); }
inline gpuError_t gpuEventElapsedTime(float* ms, gpuEvent_t a, gpuEvent_t b) {
  return cudaEventElapsedTime(ms, a, b);
}
inline constexpr gpuError_t gpuErrorNotReady = cudaErrorNotReady;
inline gpuError_t gpuGetDeviceCount(int* n) { return cudaGetDeviceCount(n); }
inline gpuError_t gpuSetDevice(int d) { return cudaSetDevice(d); }
inline gpuError_t gpuGetDevice(int* d) { return cudaGetDevice(d); }
inline gpuError_t gpuMemGetInfo(size_t* free_b, size_t* total_b) {
  return cudaMemGetInfo(free_b, total_b);
}
inline gpuError_t gpuDeviceSynchronize() { return cudaDeviceSynchronize(); }
// Whether the host can load and store through p: host memory (pageable, pinned or unregistered)
// yes, device memory no (managed memory counts as host-readable).
inline bool gpuHostReadable(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error of an unknown pointer: plain host memory
    return true;
  }
  return a.type != cudaMemoryTypeDevice;
}

// The device's facts the backend uses (read once per device).
struct DeviceInfo {
  int index = -1;
  std::string name;
  int cc_major = 0, cc_minor = 0;  // compute capability
  int sms = 0;
  size_t total_bytes = 0;
  size_t l2_bytes = 0;
  size_t smem_per_block_optin = 0;  // the most dynamic shared memory a block can ask for
};

// Number of usable devices; 0 (never an exception) when there is no driver or no device, with
// the runtime's reason in *why when given.
int device_count(std::string* why = nullptr);
DeviceInfo device_info(int device);

}  // namespace tetrad::gpu

#define GPU_CHECK(call)                                                              \
  do {                                                                               \
    const ::tetrad::gpu::gpuError_t gpu_check_e_ = (call);                           \
    if (gpu_check_e_ != ::tetrad::gpu::gpuSuccess)                                   \
      ::tetrad::gpu::gpu_fail(#call, __FILE__, __LINE__, gpu_check_e_);              \
  } while (0)
