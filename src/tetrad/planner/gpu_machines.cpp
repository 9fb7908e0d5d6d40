#include "tetrad/planner/gpu_machines.hpp"

#include "tetrad/backend/gpu_parts.hpp"

namespace tetrad::planner {

GpuKind gpu_kind(const std::string& device_name) {
  const backend::GpuPart p = backend::gpu_part(device_name);
  GpuKind k;
  k.part = p.part;
  k.bf16_tflops = p.bf16_tflops;
  k.fp32_tflops = p.fp32_tflops;
  // The machine file of each part's usual system.
  if (p.part.rfind("H200", 0) == 0) k.machine = "h200-ib";
  else if (p.part.rfind("H100", 0) == 0) k.machine = "h100-ib";
  else if (p.part.rfind("A100", 0) == 0) k.machine = "dgx-a100";
  return k;
}

}  // namespace tetrad::planner
