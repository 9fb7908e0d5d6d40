#include "tetrad/planner/long_context.hpp"

#include <iomanip>
#include <sstream>

#include "tetrad/core/error.hpp"
#include "tetrad/planner/validate.hpp"

namespace tetrad::planner {

std::vector<ContextRow> torchtitan_context_rows() {
  // TorchTitan (Liang et al., "TorchTitan: One-stop PyTorch native solution for production ready
  // LLM pre-training", ICLR 2025), long-context table: Llama 3.1 8B, 8 H100, FSDP 8 / CP, full
  // activation checkpointing, torch.compile, Float8; local batch 1.
  const struct { int seq, cp; double tps; } published[] = {
      {32768, 1, 3890}, {65536, 2, 2540}, {131072, 4, 1071}, {262144, 8, 548}};
  const Machine m = load_machine("h100-ib");
  std::vector<ContextRow> out;
  for (const auto& p : published) {
    PlanInput in;
    in.model_name = "llama-8b";
    in.model = planner_model("llama-8b");
    in.model.max_seq = std::max(in.model.max_seq, p.seq);  // the 256K row runs past 128K
    in.seq = p.seq;
    in.global_batch = 8 / p.cp;  // one sequence per FSDP rank
    in.micro_batch = in.global_batch;
    in.precision = Precision::BF16;
    in.recompute = Recompute::Full;
    in.overlap = Overlap::All;  // FSDP2 prefetches the next layer's gather, overlaps its reduce-scatter
    in.memory_model = MemoryModel::Reference;
    in.shard_over_context = true;
    in.cp_comm = CpComm::AllGather;
    in.ranks = 8;
    const GridShape g = {{Axis::Z, 8 / p.cp}, {Axis::C, p.cp}};
    ContextRow r;
    r.seq = p.seq;
    r.cp = p.cp;
    r.reported = p.tps;
    r.estimate = estimate(in, g, m);
    if (!r.estimate.valid) fail("TorchTitan row ", p.seq, " CP ", p.cp, ": the planner rejects ",
                                grid_label(g), ": ", r.estimate.reject);
    r.predicted = r.estimate.tokens_per_s / in.ranks;
    r.fp8_speedup = r.estimate.step / (r.estimate.step - r.estimate.compute_gemm / 2);
    out.push_back(r);
  }
  return out;
}

std::string context_rows_text(const std::vector<ContextRow>& rows) {
  std::ostringstream o;
  o << std::fixed;
  o << "| sequence | CP | grid | reported tokens/s/GPU (FP8) | predicted (bf16) | error | relative to 32K: "
       "reported | predicted | attention share of the step | exposed context exchange | FP8 bound (GEMMs at 2x) "
       "| predicted x bound |\n"
    << "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const auto& r : rows) {
    const Estimate& e = r.estimate;
    double cx = 0;
    for (const auto& c : e.collectives)
      if (c.axis == AxisSet(Axis::C)) cx += c.exposed;
    o << "| " << r.seq / 1024 << "K | " << r.cp << " | " << grid_label(e.grid) << " | "
      << std::setprecision(0) << r.reported << " | " << r.predicted << " | " << std::showpos
      << std::setprecision(1) << 100 * r.error() << "%" << std::noshowpos << " | "
      << std::setprecision(3) << r.reported / rows.front().reported << " | "
      << r.predicted / rows.front().predicted << " | " << std::setprecision(1)
      << 100 * e.compute_attention / e.step << "% | " << 100 * cx / e.step << "% | "
      << std::setprecision(2) << r.fp8_speedup << "x | " << std::setprecision(0)
      << r.predicted * r.fp8_speedup << " |\n";
  }
  return o.str();
}

}  // namespace tetrad::planner
