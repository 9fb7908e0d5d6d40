#include "tetrad/planner/gpu_machines.hpp"

#include <algorithm>
#include <cctype>

namespace tetrad::planner {

GpuKind gpu_kind(const std::string& device_name) {
  std::string n = device_name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return char(std::toupper(c)); });
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  GpuKind k;
  // Datasheet dense peaks (NVIDIA H200, H100, A100 datasheets).
  if (has("H200")) {
    k = {"h200-ib", 989, 67, has("NVL") ? "H200 NVL" : "H200 SXM"};
    if (has("NVL")) { k.bf16_tflops = 835; k.fp32_tflops = 60; }
  } else if (has("H100")) {
    if (has("PCIE")) k = {"h100-ib", 756, 51, "H100 PCIe"};
    else if (has("NVL")) k = {"h100-ib", 835, 60, "H100 NVL"};
    else k = {"h100-ib", 989, 67, "H100 SXM"};
  } else if (has("A100")) {
    k = {"dgx-a100", 312, 19.5, has("PCIE") ? "A100 PCIe" : "A100 SXM"};
  }
  return k;
}

}  // namespace tetrad::planner
