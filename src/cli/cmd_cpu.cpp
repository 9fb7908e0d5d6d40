// `tetrad cpu`: what this CPU runs (features, kernel paths, bf16 GEMMs, what precision auto picks
// and the measurement behind it, the peaks MFU divides by).
#include <cstdlib>
#include <iostream>
#include <memory>

#include "cli/command.hpp"
#include "tetrad/backend/backend.hpp"
#include "tetrad/core/cpu.hpp"

namespace tetrad::cli {

namespace {

Runner setup(CLI::App& sub) {
  auto measure = std::make_shared<bool>(false);
  sub.add_flag("--measure", *measure,
               "measure precision auto's GEMM rates again and replace the cached figures "
               "(as TETRAD_PRECISION_AUTO=measure does for any command)");
  return [measure](Context&) {
    if (*measure) ::setenv("TETRAD_PRECISION_AUTO", "measure", 1);
    backend::Backend& cpu = backend::cpu_backend();
    const backend::PrecisionChoice p = cpu.auto_precision();
    std::cout << "cpu: " << cpu_features().summary() << "\n"
              << "bf16 GEMMs: " << cpu.capabilities().gemm_bf16_path << "\n"
              << "precision auto: " << backend::precision_name(p.precision) << " (" << p.why
              << ")\n";
    for (backend::Precision q : {backend::Precision::FP32, backend::Precision::BF16}) {
      const backend::DevicePeak pk = cpu.peak(q, 0);
      std::cout << "MFU peak, " << backend::precision_name(q) << ": " << int64_t(pk.gflops + 0.5)
                << " GFLOP/s, " << pk.name << "\n";
    }
    std::cout << "switches: TETRAD_MAX_CPU_ISA=scalar|avx2|avx512|avx512_bf16|amx caps the "
                 "kernels (and oneDNN); TETRAD_BF16=emulate; TETRAD_PRECISION_AUTO=fp32|bf16 "
                 "forces auto, =measure measures it again; TETRAD_CACHE_DIR=DIR|off keeps the "
                 "measurements (default ~/.cache/tetrad)\n";
  };
}

}  // namespace

const Command cpu_command{
    "cpu", "what this CPU runs: features, kernel paths, bf16 GEMMs, what precision auto picks",
    false, &setup};

}  // namespace tetrad::cli
