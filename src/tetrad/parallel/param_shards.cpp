// ParallelTransformer: the parameters and their shards. Whole tensors in and out (initial values,
// checkpoints: scatter / gather over Z, D and the pipeline stages).
#include "tetrad/parallel/parallel_transformer.hpp"

#include <algorithm>
#include <cstring>

#include "tetrad/core/error.hpp"
#include "tetrad/model/params.hpp"

namespace tetrad::parallel {

using tetrad::init_parameter;

void ParallelTransformer::init_weights(uint64_t seed) {
  for (size_t i = 0; i < table_.specs.size(); ++i) {
    std::vector<float> full(table_.specs[i].numel);
    init_parameter(cfg_, table_.specs[i], i, seed, full.data());
    set_tensor(i, full.data());
  }
}

std::vector<float> ParallelTransformer::shard_of(size_t i, const float* full) const {
  const TensorShard& t = plan_.tensors[i];
  if (!t.stored) return {};  // another pipeline stage's layer
  std::vector<float> block(t.z_sharded ? t.shard_numel * ctx_.g().shape.z() : t.block_numel, 0.0f);
  extract_block(t, full, block.data());
  const int64_t first = t.z_sharded ? t.shard_numel * ctx_.g().coord.z() : 0;
  return std::vector<float>(block.begin() + first, block.begin() + first + t.shard_numel);
}

void ParallelTransformer::scatter_tensor(float* local, size_t i, const float* full) const {
  const TensorShard& t = plan_.tensors[i];
  const std::vector<float> shard = shard_of(i, full);
  upload(local + t.offset, shard.data(), t.shard_numel);
}

void ParallelTransformer::upload(float* dev, const float* host, int64_t n) const {
  if (n <= 0) return;
  ctx_.bq().copy_to_device(dev, host, size_t(n) * sizeof(float));
  ctx_.bq().synchronize();  // `host` may go away when the caller returns
}

void ParallelTransformer::gather_tensor(const float* local, size_t i, float* full) {
  gather_shard(local + plan_.tensors[i].offset, i, full);
}

void ParallelTransformer::gather_shard(const float* shard, size_t i, float* full) {
  const TensorShard& t = plan_.tensors[i];
  // Disjoint blocks summed into zeros: exact. Only one owner of each replicated block writes.
  // A stage that does not store the tensor (another stage's layer) contributes zeros; every
  // rank of its Z group is in the same stage, so the Z all-gather is skipped by all or none.
  std::fill(full, full + t.spec->numel, 0.0f);
  if (t.stored) {
    std::vector<float> block(t.z_sharded ? t.shard_numel * ctx_.g().shape.z() : t.block_numel);
    if (t.z_sharded && ctx_.g().shape.z() > 1) {
      ctx_.bq().synchronize();  // the shard is final (the host side of a staged all-gather reads it)
      ctx_.g().host().z().allgather(shard, block.data(), size_t(t.shard_numel));  // into host memory
    } else if (t.block_numel > 0) {
      ctx_.bq().copy_to_host(block.data(), shard, size_t(t.block_numel) * sizeof(float));
      ctx_.bq().synchronize();
    }
    const GridCoord& c = ctx_.g().coord;
    bool owner = t.first_replica && c.z() == 0 && owns(t);
    if (t.layout == ShardLayout::ColsX) owner = owner && c.y() == 0;
    if (t.layout == ShardLayout::RowsY) owner = owner && c.x() == 0;
    if (t.layout == ShardLayout::Replicated) owner = owner && c.x() == 0 && c.y() == 0;
    if (owner) insert_block(t, block.data(), full);
  }
  if (ctx_.g().world.size() > 1) ctx_.g().host().world.allreduce_sum(full, size_t(t.spec->numel));  // host
}

void ParallelTransformer::scatter_state_tensor(float* state, size_t i, const float* full) const {
  if (opt_.zero == 0) return scatter_tensor(state, i, full);
  const std::vector<float> shard = shard_of(i, full);
  const int64_t lo = optimizer_layout().param_offsets[i] - plan_.tensors[i].offset;
  upload(state + optimizer_layout().state_offsets[i], shard.data() + lo, optimizer_layout().sizes[i]);
}

void ParallelTransformer::gather_state_tensor(const float* state, size_t i, float* full) {
  if (opt_.zero == 0) return gather_tensor(state, i, full);
  const int64_t q = reduce_->piece(i);
  float* pieces = reduce_->piece_staging();
  // D (with C: C x D; an expert tensor's expert-data group)
  const comm::Communicator& replicas = ctx_.g().replicas_for(plan_.tensors[i].expert);
  float* mine = pieces + q * replicas.size();
  ctx_.zero_dev(mine, q);
  ctx_.copy_dev(mine, state + optimizer_layout().state_offsets[i], optimizer_layout().sizes[i]);
  if (q > 0 && replicas.size() > 1) {  // q = 0: not stored on this stage
    ctx_.bq().synchronize();  // a staged all-gather reads `mine` from the host side
    replicas.allgather(mine, pieces, size_t(q));
  } else
    ctx_.copy_dev(pieces, static_cast<const float*>(mine), q);
  gather_shard(pieces, i, full);  // the pieces in D order are the shard (padding past its end)
}

// A mixture of experts' router is a linear layer computed in fp32 in every precision: no bf16
// copy (gathered in fp32).
bool ParallelTransformer::gemm_weight(int i) const {
  if (i < 0) return false;
  const ParamSpec& s = table_.specs[size_t(i)];
  return (s.kind == ParamKind::Linear && s.role != TensorRole::Router) || i == head_;
}

}  // namespace tetrad::parallel
