// The datasheet peaks of a GPU part, from the name the driver reports ("NVIDIA H200", "NVIDIA
// H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"): the MFU baseline a GPU backend gives
// (Backend::peak), and the planner's machine choice for a GPU (planner/gpu_machines.hpp). Pure
// string matching, tested on every build.
#pragma once
#include <string>

namespace tetrad::backend {

struct GpuPart {
  std::string part;         // "H200 SXM", "H100 SXM", "H100 PCIe", "A100 SXM", ...; "" unknown
  double bf16_tflops = 0;   // dense bf16 tensor-core peak of the part (datasheet); 0 unknown
  double fp32_tflops = 0;   // plain fp32 (non-tensor) peak
};

// Unknown names come back with an empty part and zero peaks.
GpuPart gpu_part(const std::string& device_name);

}  // namespace tetrad::backend
