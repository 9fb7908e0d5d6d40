// The registry of backends (declared in backend.hpp: backends(), cpu_backend(), create()): the one
// file that knows every backend compiled in, as ggml's backend registry is. It sits above the
// backends it lists, so the interface (backend.cpp) never includes an implementation and the
// implementations include only the interface: no include circle between them.
#include <memory>
#include <string>
#include <vector>

#include "tetrad/backend/backend.hpp"
#include "tetrad/backend/cpu/cpu_backend.hpp"
#include "tetrad/backend/cpu/strict_backend.hpp"
#if TETRAD_HAVE_CUDA
#include "tetrad/backend/cuda/cuda_backend.hpp"
#endif
#include "tetrad/core/error.hpp"

namespace tetrad::backend {

// One entry per backend compiled in; a GPU backend adds its entry here under its build option
// (e.g. #if TETRAD_WITH_CUDA ... cuda::backend_info() ... #endif), reporting available = false
// with the reason when this machine has no device for it.

std::vector<BackendInfo> backends() {
  std::vector<BackendInfo> list;
  BackendInfo c;
  c.name = "cpu";
  c.available = true;
  c.create = [](const std::string&) { return std::unique_ptr<Backend>(new cpu::CpuBackend()); };
  list.push_back(std::move(c));
  // The CPU's arithmetic on memory the host cannot read: the model's device path, checked on
  // every machine (backend/cpu/strict_backend.hpp).
  BackendInfo s;
  s.name = "cpu-strict";
  s.available = true;
  s.create = [](const std::string&) { return std::unique_ptr<Backend>(new cpu::StrictBackend()); };
  list.push_back(std::move(s));
#if TETRAD_HAVE_CUDA
  // Listed in every CUDA build; available only where a device answers (the conformance suite
  // then skips it with the runtime's reason on a machine without a GPU).
  list.push_back(cuda::backend_info());
#endif
  return list;
}

Backend& cpu_backend() {
  static cpu::CpuBackend b;
  return b;
}

std::unique_ptr<Backend> create(const std::string& name) {
  std::string known;
  const std::string family = name.substr(0, name.find(':'));
  for (BackendInfo& b : backends()) {
    known += (known.empty() ? "" : ", ") + b.name + (b.available ? "" : " (unavailable)");
    if (b.name != family) continue;
    if (!b.available) fail("backend \"", name, "\" cannot run here: ", b.why_not);
    if ((family == "cpu" || family == "cpu-strict") && name != family)
      fail("backend \"", name, "\": the ", family, " backend takes no device index");
    return b.create(name);
  }
  fail("unknown backend \"", name, "\"; this build has: ", known);
}

}  // namespace tetrad::backend
