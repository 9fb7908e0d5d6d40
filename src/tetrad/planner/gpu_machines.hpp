// Which machine file belongs to a GPU, from the name the driver reports ("NVIDIA H200", "NVIDIA
// H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"), with the part's datasheet peaks (backend/gpu_parts.hpp,
// the MFU baseline of a GPU backend). `tetrad plan` uses the machine file. Pure string matching,
// tested on every build.
#pragma once
#include <string>

namespace tetrad::planner {

struct GpuKind {
  std::string machine;        // machines/<machine>.toml: "h200-ib", "h100-ib", "dgx-a100"; "" unknown
  double bf16_tflops = 0;     // dense bf16 tensor-core peak of the part (datasheet); 0 unknown
  double fp32_tflops = 0;     // plain fp32 (non-tensor) peak
  std::string part;           // "H200 SXM", "H100 SXM", "H100 PCIe", "A100 SXM", ...
};

// Unknown names come back with empty machine and zero peaks (the caller then reports MFU against
// the measured GEMM ceiling only, and says why).
GpuKind gpu_kind(const std::string& device_name);

}  // namespace tetrad::planner
