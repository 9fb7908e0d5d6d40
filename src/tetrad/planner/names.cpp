// The planner's names of its options and collectives (planner.hpp).
#include "tetrad/core/error.hpp"
#include "tetrad/core/names.hpp"
#include "tetrad/planner/planner.hpp"

namespace tetrad::planner {

namespace {
constexpr Named<Overlap> kOverlapNames[] = {
    {Overlap::None, "none"}, {Overlap::Tensor, "tensor"}, {Overlap::All, "all"}};
}  // namespace

Overlap parse_overlap(const std::string& s) { return parse_named(s, kOverlapNames, "overlap"); }
AttentionKernel parse_attention_kernel(const std::string& s) {
  if (s == "fused") return AttentionKernel::Fused;
  if (s == "materialized") return AttentionKernel::Materialized;
  fail("attention kernel '", s, "': expected fused (FlashAttention's way) or materialized (the "
       "scores written to memory)");
}
const char* name(AttentionKernel k) { return k == AttentionKernel::Fused ? "fused" : "materialized"; }
const char* name(Precision p) { return p == Precision::FP32 ? "fp32" : "bf16"; }
const char* name(Overlap o) { return name_of(o, kOverlapNames); }
const char* op_name(Op op) {
  switch (op) {
    case Op::AllReduce: return "all-reduce";
    case Op::AllGather: return "all-gather";
    case Op::ReduceScatter: return "reduce-scatter";
    case Op::SendRecv: return "send/recv";
    case Op::AllToAll: return "all-to-all";
  }
  return "?";
}

}  // namespace tetrad::planner
