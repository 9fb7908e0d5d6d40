// ParallelTransformer::update_expert_bias (parallel_transformer.hpp): the mixture of experts'
// aux-loss-free balancing bias, moved after each optimizer step by the step's expert load. The
// bias tensors are whole on every rank that stores their layer (sharding.cpp: replicated, not
// Z-sharded) and the optimizer leaves them alone (ParamKind::Buffer), so each rank applies the
// same update to its own copy from the same summed load.
#include "tetrad/parallel/parallel_transformer.hpp"

#include "tetrad/core/error.hpp"

namespace tetrad::parallel {

void ParallelTransformer::update_expert_bias(const std::vector<int64_t>& load) {
  if (!cfg_.moe() || !cfg_.moe_expert_bias() || load.empty()) return;
  const int64_t E = cfg_.n_experts;
  TETRAD_CHECK(load.size() == size_t(cfg_.n_layer * E), "expert load of ", load.size(),
               " entries for ", cfg_.n_layer, " layers of ", E, " experts");
  backend::Queue& q = ctx_.bq();
  std::vector<float> bias(static_cast<size_t>(E));
  for (const TensorShard& t : plan_.tensors) {
    if (t.spec->role != TensorRole::ExpertBias || t.shard_numel == 0) continue;
    TETRAD_CHECK(t.shard_numel == E && !t.z_sharded, t.spec->name, ": the expert bias is whole");
    // Read in place by the block (not gathered, no bf16 copy: WeightGatherer::weight), so the
    // gathers of the next step's weights that apply_update may have started stay valid.
    float* p = params_.data() + t.offset;
    q.copy_to_host(bias.data(), p, size_t(E) * sizeof(float));
    q.synchronize();
    update_expert_bias_values(bias.data(), load.data() + size_t(t.spec->layer) * size_t(E), E,
                              cfg_.expert_bias_rate);
    q.copy_to_device(p, bias.data(), size_t(E) * sizeof(float));
  }
  q.synchronize();
}

}  // namespace tetrad::parallel
