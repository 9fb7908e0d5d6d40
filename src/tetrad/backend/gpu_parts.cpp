#include "tetrad/backend/gpu_parts.hpp"

#include <algorithm>
#include <cctype>

namespace tetrad::backend {

GpuPart gpu_part(const std::string& device_name) {
  std::string n = device_name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return char(std::toupper(c)); });
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  // Datasheet dense peaks (NVIDIA H200, H100, A100 datasheets).
  if (has("H200")) return has("NVL") ? GpuPart{"H200 NVL", 835, 60} : GpuPart{"H200 SXM", 989, 67};
  if (has("H100")) {
    if (has("PCIE")) return {"H100 PCIe", 756, 51};
    if (has("NVL")) return {"H100 NVL", 835, 60};
    return {"H100 SXM", 989, 67};
  }
  if (has("A100")) return {has("PCIE") ? "A100 PCIe" : "A100 SXM", 312, 19.5};
  return {};
}

}  // namespace tetrad::backend
