// The GEMM precision of a model, one type for every layer (docs/precision.md): fp32, or operands
// rounded to bf16 (nearest even) with fp32 accumulation. Chosen per call by whoever owns the
// model's precision setting (GemmArgs::precision, AttentionArgs::precision), never a process-wide
// switch; the planner prices a grid in it (planner::PlanInput::precision).
//
// What a setting means on a backend is the backend's to say: "fp32" and "bf16" are themselves;
// "auto" asks the backend (Backend::auto_precision: the faster of the two there, and why; on a
// CPU measured once per machine, backend/cpu/precision_auto.hpp). resolve_precision (backend.hpp) is that one query: the
// trainer, the planner's query of a run config (`--grid auto`, `tetrad plan`) and the benchmark
// all call it.
#pragma once
#include <cstdint>
#include <string>

namespace tetrad::backend {

enum class Precision : uint8_t { FP32, BF16 };

// "fp32" | "bf16"; anything else throws Error naming the choices.
Precision parse_precision(const std::string& name);
std::string precision_name(Precision p);  // "fp32" | "bf16"

// A precision setting resolved on one backend. why: for "auto", the backend's reason, one phrase
// the trainer prints ("bf16 GEMMs 186 GFLOP/s < fp32 362 (0.51x) on ...", "forced by
// TETRAD_PRECISION_AUTO=fp32"); empty for a setting that names its precision.
struct PrecisionChoice {
  Precision precision = Precision::FP32;
  std::string why;
};

}  // namespace tetrad::backend
