// Device queries behind the thin runtime wrappers (gpu_api.hpp).
#include "tetrad/backend/cuda/gpu_api.hpp"

namespace tetrad::gpu {

int device_count(std::string* why) {
  int n = 0;
  const gpuError_t e = gpuGetDeviceCount(&n);
  if (e != gpuSuccess) {
    // No driver, no device, or a driver older than the runtime: a GPU test skips with this.
    if (why) *why = std::string("cudaGetDeviceCount: ") + gpu_error_string(e);
    cudaGetLastError();  // clear the sticky error so later queries start clean
    return 0;
  }
  if (n == 0 && why) *why = "the CUDA driver reports no device";
  return n;
}

DeviceInfo device_info(int device) {
  cudaDeviceProp p{};
  GPU_CHECK(cudaGetDeviceProperties(&p, device));
  DeviceInfo d;
  d.index = device;
  d.name = p.name;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.sms = p.multiProcessorCount;
  d.total_bytes = p.totalGlobalMem;
  d.l2_bytes = size_t(p.l2CacheSize);
  d.smem_per_block_optin = p.sharedMemPerBlockOptin;
  return d;
}

}  // namespace tetrad::gpu
