// The parallel model's buffers as arithmetic (memory_model.hpp). Each term follows the
// constructor of ParallelTransformer (parallel_transformer.cpp), build_buckets
// (grad_reduction.cpp) and PipelineDriver::stash_peak_bytes (pipeline.cpp); the tests
// (PlannerMemory.*, MemoryMpi.*) hold them equal to the model's own counts on every grid.
#include "tetrad/parallel/memory_model.hpp"

#include <algorithm>

#include "tetrad/model/params.hpp"
#include "tetrad/parallel/context_attention.hpp"
#include "tetrad/parallel/expert_parallel.hpp"
#include "tetrad/parallel/layer_split.hpp"
#include "tetrad/parallel/sharding.hpp"

namespace tetrad::parallel {

ModelMemory model_memory(const ModelConfig& cfg, const GridShape& G, const GridCoord& coord,
                         int local_batch, int max_len, const ParallelOptions& opt,
                         PipelineSchedule schedule, int micro_batches) {
  cfg.validate();
  LayerSplit split;
  if (G.p() > 1) split = resolve_layer_split(opt.pipeline_layers, cfg, max_len, G.p(), opt.virtual_stages);
  validate_grid_for_model(cfg, G);
  // Every layer is sharded alike, so one layer's plan (and the top-level tensors', which do not
  // depend on the layer count or the stage: every stage keeps them) gives the whole stage's: its
  // stored layers times the layer's, plus the top. Exact, and cheap for plans over thousands of
  // ranks of models with a hundred layers.
  ModelConfig one = cfg;
  one.n_layer = 1;
  const ParamTable table = build_param_table(one);
  GridShape g1 = G;
  g1[Axis::P] = 1;
  GridCoord c1 = coord;
  c1[Axis::P] = 0;
  const ShardPlan plan = ShardPlan::build(one, table, g1, c1);
  const std::vector<LayerSlots> slots = layer_slots(cfg.n_layer, split, G.p(), coord.p());
  int64_t stored_layers = 0;
  for (LayerSlots k : slots) stored_layers += k == LayerSlots::Full;
  std::vector<const TensorShard*> layer_tensors, top_tensors;
  for (const auto& t : plan.tensors) (t.spec->layer < 0 ? top_tensors : layer_tensors).push_back(&t);

  const bool bf16 = opt.precision == backend::Precision::BF16;
  const bool copy16 = bf16 && opt.bf16_weight_copy;
  const int64_t f4 = int64_t(sizeof(float)), b2 = 2;
  ModelMemory mm;

  // The local shard; ZeRO pieces: each tensor's shard cut into Gd pieces of ceil(n / Gd), an
  // expert tensor's (E > 1) over its expert-data group of Gd / E ranks.
  int64_t local_total = 0, state_size = 0, piece_max = 0;
  const int64_t Gr = G.size(G.c() > 1 ? replica_axes() : AxisSet(Axis::D));  // ZeRO's replicas
  const int64_t Ge = Gr / G.e();                                             // an expert's
  auto add = [&](const std::vector<const TensorShard*>& ts, int64_t times) {
    for (const TensorShard* t : ts) {
      const int64_t Gt = t->expert ? Ge : Gr;
      const int64_t q = (t->shard_numel + Gt - 1) / Gt;
      local_total += times * t->shard_numel;
      state_size += times * q;
      if (times > 0) piece_max = std::max(piece_max, q);
    }
  };
  add(layer_tensors, stored_layers);
  add(top_tensors, 1);
  if (opt.zero == 0) state_size = local_total;
  mm.params = f4 * local_total;
  mm.params16 = copy16 ? b2 * local_total : 0;
  mm.grads = f4 * (opt.zero == 2 ? state_size : local_total);
  mm.optimizer = f4 * 2 * state_size;
  if (opt.zero != 0) mm.staging += f4 * (Gr + 1) * piece_max;

  if (G.z() > 1 || opt.zero == 2) {
    int64_t layer_max = 0, top = 0;
    for (const auto& t : plan.tensors) {
      const int64_t end = t.block_offset + (t.z_sharded ? t.shard_numel * G.z() : t.block_numel);
      if (t.spec->layer < 0) top = std::max(top, end);
      else layer_max = std::max(layer_max, end);
    }
    if (G.z() > 1) {
      const int64_t L = cfg.n_layer;
      const int64_t slots_z = std::max<int64_t>(
          1, opt.overlap.cache_gathered_weights ? L : std::min<int64_t>(opt.overlap.prefetch_depth + 1, L));
      mm.gathered = f4 * (slots_z * layer_max + top) + (copy16 ? b2 * (slots_z * layer_max + top) : 0);
      mm.staging += f4 * local_total;  // the reduce-scatter's landing buffer
    }
    mm.staging += f4 * (2 * layer_max + top);  // two layers' gradient blocks and the top block
  }
  if (opt.sparse_embedding_grad && G.z() > 1 && G.p() == 1 && opt.zero != 2) {
    const int64_t rows = int64_t(G.z()) * local_batch * (max_len / G.c());
    const LocalDims dims = LocalDims::of(cfg, G);
    const int64_t Cx = dims.Cx, Vy = dims.Vy;
    if (rows * (Cx + 1) < Vy * Cx) mm.staging += f4 * rows * Cx + int64_t(sizeof(int32_t)) * rows;
  }
  // Data-parallel buckets (build_buckets): tensors in the order their gradients become final
  // (layers from the last, then the top-level ones), one open bucket per group (replicated, Z
  // shards, expert shards); a bucket of more than one tensor is staged.
  int64_t staged = 0;
  if (opt.zero == 0) {
    const int64_t cap = int64_t(opt.overlap.dp_bucket_mb * 1048576.0 / sizeof(float));
    int64_t numel[3] = {0, 0, 0}, count[3] = {0, 0, 0};
    auto close = [&](int k) {
      if (count[k] > 1) staged += numel[k];
      numel[k] = count[k] = 0;
    };
    auto bucket = [&](const std::vector<const TensorShard*>& ts) {
      for (const TensorShard* t : ts) {
        if ((t->expert ? Ge : t->z_sharded ? Gr : G.size(token_share_axes())) == 1) continue;
        const int k = t->expert ? 2 : t->z_sharded ? 1 : 0;
        numel[k] += t->shard_numel;
        ++count[k];
        if (numel[k] >= cap) close(k);
      }
    };
    for (int64_t l = 0; l < stored_layers; ++l) bucket(layer_tensors);
    bucket(top_tensors);
    close(2);
    close(1);
    close(0);
  }
  mm.staging += f4 * std::max<int64_t>(staged, 1);

  const bool bf16_acts = bf16 && opt.bf16_activations;
  check_sequence_shard(opt, G, int64_t(local_batch) * (max_len / G.c()));
  const ActivationSizes a =
      activation_sizes(cfg, G, local_batch, max_len, bf16_acts, opt.recompute, slots,
                       seq_shard_ways(opt, G), opt.bf16_stash);
  mm.activations = f4 * a.total;
  // The context axis's exchange (DenseBlock's ContextAttention, one for every layer): sized for
  // the micro-batch's local_batch sequences of max_len / Gc tokens on this rank.
  if (G.c() > 1)
    mm.context = ContextAttention::bytes(LocalDims::of(cfg, G), G, local_batch,
                                         max_len / G.c(), opt.cp_comm);
  // The expert exchange's scratch (ExpertParallel, one for every layer), grown to the largest
  // exchange: sized for the worst a rank can receive, not the even load's E x N k / E.
  if (G.e() > 1 && cfg.moe())
    mm.expert_exchange = ExpertParallel::scratch_bytes(
        LocalDims::of(cfg, G), ExpertParallel::max_rows(cfg, G, int64_t(local_batch) * (max_len / G.c())));
  if (G.p() > 1) {
    // Each forward's chunk stash lives until its backward (pipeline_chunks.cpp): the chunk's
    // layers' slots from its input (the previous layer's output slot) on, the embedding's output
    // with the embedding, the final norm, logits and losses with the head, and the scratch
    // layer's index; plus two receive buffers and one outgoing copy of the hidden state.
    std::vector<int64_t> begin(slots.size() + 1, 0);  // floats before layer l's slots
    for (size_t l = 0; l < slots.size(); ++l)
      begin[l + 1] = begin[l] + (slots[l] == LayerSlots::Full    ? a.layer_kept
                                 : slots[l] == LayerSlots::Input ? a.input_slot
                                                                 : 0);
    const int p = G.p(), v = opt.virtual_stages, V = p * v;
    int64_t alive = 0, peak = 0;
    for (const PipeOp& op : pipeline_schedule(schedule, p, coord.p(), micro_batches, v)) {
      const int j = op.chunk * p + coord.p();
      const auto [l0, l1] = split.layers(j);
      const int64_t k = 1 + begin[size_t(l1)] - begin[size_t(std::max(0, l0 - 1))] +
                        (j == 0 ? a.embedding_out : 0) + (j == V - 1 ? a.head_kept : 0);
      alive += op.forward ? k : -k;
      peak = std::max(peak, alive);
    }
    mm.pipeline = f4 * (peak + 3 * a.input_slot);
  }
  return mm;
}

}  // namespace tetrad::parallel
