// estimate's collectives, by axis (planner.hpp).
#include "tetrad/planner/planner.hpp"

namespace tetrad::planner {

bool x_shares_sequences(const PlanInput& in, const GridShape& g, double T) {
  const int64_t sequences = int64_t(T) / in.seq;  // a micro-batch's on this rank (no context axis)
  return g.x() > 1 && g.c() == 1 && sequences > 0 && sequences % g.x() == 0;
}

void add_expert_layer_comm(Collectives& c, const PlanInput& in, const GridShape& g, const Sizes& s, double T);

// Tensor parallelism (X and Y): the layers' norms and linear layers, per layer.
// Bytes per element of the activations' collectives over X and Y (PlanInput::tensor_comm_bytes).
static double tensor_act_bytes(const PlanInput& in) {
  return in.tensor_comm_bytes > 0 ? in.tensor_comm_bytes : in.precision == Precision::BF16 ? 2 : 4;
}

void add_tensor_layer_comm(Collectives& c, const PlanInput& in, const GridShape& g, const Sizes& s, double T) {
  const double act_b = tensor_act_bytes(in);
  const double fwd_mult = in.recompute == Recompute::Full ? 2 : 1;  // full recomputation repeats the forward collectives
  const double stats_b = T * 2 * 8;  // [T, 2] doubles of row statistics
  // Norms: statistics all-reduced over X in forward and again in backward (2 norms per layer).
  c.add("norm statistics (fwd+bwd)", Axis::X, Op::AllReduce, stats_b, 2 * (fwd_mult + 1), kExposed, true);
  // Normal layers (q|k|v, MLP up): fwd all-reduce over X of [T, N/Gy]; bwd dIn over Y [T, H/Gx].
  // With the X ranks sharing attention's sequences each reads only its rows of q|k|v: on 2 X
  // ranks without q/k norms the sum is a reduce-scatter of them (parallel_linear.cpp,
  // normal_fwd_rows); attention's output rows are all-gathered in the forward (again with
  // recomputation) and dq|dk|dv's in the backward.
  const double qkv_b = T * s.QKV / g.y() * act_b;
  const bool share = x_shares_sequences(in, g, T);
  if (share && g.x() == 2 && s.qk_norm_vectors == 0)
    c.add("fwd reduce-scatter of q|k|v output", Axis::X, Op::ReduceScatter, qkv_b, fwd_mult, kExposed, true);
  else
    c.add("fwd all-reduce of q|k|v output", Axis::X, Op::AllReduce, qkv_b, fwd_mult, kExposed, true);
  if (share) {
    const double gathers = in.recompute == Recompute::None ? 1 : 2;
    c.add("fwd all-gather of attention output", Axis::X, Op::AllGather, T * s.A / g.y() * act_b, gathers, kExposed, true);
    c.add("bwd all-gather of dq|dk|dv", Axis::X, Op::AllGather, qkv_b, 1, kExposed, true);
  }
  const bool dense = s.experts == 0;  // a mixture of experts' MLP: add_expert_layer_comm
  if (dense) c.add("fwd all-reduce of MLP-up output", Axis::X, Op::AllReduce, T * s.FW / g.y() * act_b, fwd_mult, kExposed, true);
  c.add("bwd all-reduce of q|k|v dIn", Axis::Y, Op::AllReduce, T * s.H / g.x() * act_b, 1, kDIn, true);
  if (dense) c.add("bwd all-reduce of MLP-up dIn", Axis::Y, Op::AllReduce, T * s.H / g.x() * act_b, 1, kDIn, true);
  // Transposed layers (attention output, MLP down): fwd over Y [T, H/Gx]; bwd dIn over X.
  c.add("fwd all-reduce of attention-output", Axis::Y, Op::AllReduce, T * s.H / g.x() * act_b, fwd_mult, kExposed, true);
  if (dense) c.add("fwd all-reduce of MLP-down output", Axis::Y, Op::AllReduce, T * s.H / g.x() * act_b, fwd_mult, kExposed, true);
  c.add("bwd all-reduce of attention-output dIn", Axis::X, Op::AllReduce, T * s.A / g.y() * act_b, 1, kDIn, true);
  if (dense) c.add("bwd all-reduce of MLP-down dIn", Axis::X, Op::AllReduce, T * s.F / g.y() * act_b, 1, kDIn, true);
  else add_expert_layer_comm(c, in, g, s, T);
}

// A mixture of experts on X and Y (parallel/moe_block.cpp, expert_mlp.cpp), per layer: the
// router's logits [T, n_e] summed over X (its columns are X's); each expert's gate|up rows
// [rows, FW/Gy] over X and its down rows [rows, H/Gx] over Y, on the T·k rows the rank's experts
// take (dispatched to them over E with an even load: T·k on every rank); backward the combine
// weights' gradient [T, k] over X, down's dx [rows, F/Gy] over X and gate|up's dx [rows, H/Gx]
// over Y. The trainer sums them in fp32 buffers in every precision: 4 bytes.
void add_expert_layer_comm(Collectives& c, const PlanInput& in, const GridShape& g, const Sizes& s, double T) {
  const double fwd_mult = in.recompute == Recompute::Full ? 2 : 1;
  const double rows = T * s.topk, b = 4;
  c.add("fwd all-reduce of router logits", Axis::X, Op::AllReduce, T * s.experts * b, fwd_mult, kExposed, true);
  c.add("fwd all-reduce of experts' gate|up", Axis::X, Op::AllReduce, rows * s.FW / g.y() * b, fwd_mult, kExposed, true);
  c.add("fwd all-reduce of experts' down", Axis::Y, Op::AllReduce, rows * s.H / g.x() * b, fwd_mult, kExposed, true);
  c.add("bwd all-reduce of combine weights' gradient", Axis::X, Op::AllReduce, T * s.topk * b, 1, kExposed, true);
  c.add("bwd all-reduce of experts' down dx", Axis::X, Op::AllReduce, rows * s.F / g.y() * b, 1, kDIn, true);
  c.add("bwd all-reduce of experts' gate|up dx", Axis::Y, Op::AllReduce, rows * s.H / g.x() * b, 1, kDIn, true);
}

// Weight sharding (Z): the layer's blocks gathered before forward and again before backward;
// gradient blocks reduce-scattered after backward.
void add_sharded_layer_comm(Collectives& c, const PlanInput& in, const GridShape& g, const Sizes& s) {
  const double w_b = in.precision == Precision::BF16 ? 2 : 4;
  const double g_b = in.z_grad_comm_bytes > 0 ? in.z_grad_comm_bytes : w_b;
  const double layer_block = s.block_stored() / (double(g.x()) * g.y());  // a mixture: its 1/E of the experts
  const AxisSet z = Collectives::shard_axes(g, in.shard_over_context);
  c.add("all-gather of layer weights (fwd)", z, Op::AllGather, layer_block * w_b, 1, kZFwd, true);
  c.add("all-gather of layer weights (bwd)", z, Op::AllGather, layer_block * w_b, 1, kZBwd, true);
  c.add("reduce-scatter of layer weight grads", z, Op::ReduceScatter, layer_block * g_b, 1, kZBwd, true);
}

// Per micro-batch: embedding (fwd all-reduce over Y), head (fwd over X of the logits, bwd dIn
// over Y), cross-entropy (max and sums over Y), final norm, top blocks over Z.
void add_top_comm(Collectives& c, const PlanInput& in, const GridShape& g, const Sizes& s, double T) {
  const bool bf16 = in.precision == Precision::BF16;
  const double act_b = tensor_act_bytes(in), w_b = bf16 ? 2 : 4;
  const double stats_b = T * 2 * 8;
  const double top = (s.tied ? 1 : 2) * s.head() / (double(g.x()) * g.y());
  const double top_b = top * w_b, top_grad_b = top * (in.z_grad_comm_bytes > 0 ? in.z_grad_comm_bytes : w_b);
  c.add("fwd all-reduce of embedding", Axis::Y, Op::AllReduce, T * s.H / g.x() * act_b, 1, kExposed, false, MbAt::FirstFwd);
  // The X ranks share the cross-entropy's rows: on 2 X ranks the logits' sum is a reduce-scatter
  // of the rows each rank's loss reads (vocab_parallel.cpp, head_forward), and their gradient
  // rows are all-gathered over X.
  const bool loss_rows = g.x() > 1 && int64_t(T) % g.x() == 0;
  if (loss_rows && g.x() == 2)
    c.add("fwd reduce-scatter of logits", Axis::X, Op::ReduceScatter, T * s.V / g.y() * act_b, 1, kExposed, false);
  else
    c.add("fwd all-reduce of logits", Axis::X, Op::AllReduce, T * s.V / g.y() * act_b, 1, kExposed, false);
  if (loss_rows)
    c.add("bwd all-gather of dlogits", Axis::X, Op::AllGather, T * s.V / g.y() * act_b, 1, kExposed, false, MbAt::LastBwd);
  c.add("bwd all-reduce of head dIn", Axis::Y, Op::AllReduce, T * s.H / g.x() * act_b, 1, kExposed, false, MbAt::LastBwd);
  c.add("cross-entropy max and sums", Axis::Y, Op::AllReduce, T * 3 * 4, 2, kExposed, false);
  c.add("final norm statistics", Axis::X, Op::AllReduce, stats_b, 2, kExposed, false);
  const AxisSet z = Collectives::shard_axes(g, in.shard_over_context);
  c.add("all-gather of embedding/head", z, Op::AllGather, top_b, 1, kExposed, false, MbAt::FirstFwd);
  c.add("reduce-scatter of embedding/head grads", z, Op::ReduceScatter, top_grad_b, 1, kExposed, false, MbAt::LastBwd);
}

// Pipeline (P): activations forward and their gradients back, [T, H/Gx] split over Y so each rank
// sends its 1/Gy (Megatron's scatter-gather). With v chunks per stage a micro-batch crosses every
// stage boundary v times each way.
void add_pipeline_comm(Collectives& c, const PlanInput& in, const GridShape& g, const Sizes& s, double T) {
  const double act_b = in.precision == Precision::BF16 ? 2 : 4;
  c.add("pipeline send/recv (fwd+bwd)", Axis::P, Op::SendRecv, T * s.H / (double(g.x()) * g.y()) * act_b,
        2.0 * in.virtual_stages, kExposed, false, MbAt::EveryOp);
}

// Data parallelism (D, Z x D), per step: Z shards all-reduced over D (ZeRO 1/2: reduce-scatter +
// all-gather, same ring volume); replicated vectors over Z x D; in dp_grad_comm_bytes a value.
void add_data_comm(Collectives& c, const PlanInput& in, const GridShape& g, double matrices, double vectors) {
  const double w_b = in.dp_grad_comm_bytes > 0 ? in.dp_grad_comm_bytes : in.precision == Precision::BF16 ? 2 : 4;
  const AxisSet grads = in.shard_over_context ? AxisSet(Axis::D) : Collectives::grad_axes(g);
  c.add("data-parallel all-reduce of gradients", grads, Op::AllReduce, matrices * w_b, 1, kData, false);
  c.add("all-reduce of replicated grads (norms, biases)", Collectives::replicated_axes(g), Op::AllReduce,
        vectors * w_b, 1, kData, false);
}


CommSums comm_sums(const std::vector<CommItem>& items) {
  CommSums c;
  for (const auto& it : items) {
    const double t = it.c.seconds * it.c.calls;
    if (it.per_layer > 0) {
      if (it.kind == kExposed) c.fwd_ar += t;
      else if (it.kind == kZFwd) c.z_fwd += t;
      else if (it.kind == kZBwd) c.z_bwd += t;
      else if (it.kind == kDIn) c.din += t;
      else if (it.kind == kRingFwd) c.ring_fwd += t;
      else if (it.kind == kRingBwd) c.ring_bwd += t;
    } else if (it.kind == kData) {
      c.step_comm += t;
    } else {
      c.per_mb_total += t;
      c.mb_at[int(it.at)] += t;
    }
  }
  return c;
}

}  // namespace tetrad::planner
