#include "tetrad/planner/planner.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tetrad/core/error.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/parallel/activation_layout.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/parallel/sharding.hpp"

namespace tetrad::planner {

std::string grid_label(const GridShape& g) {
  std::string s;
  for (Axis a : parallel::kAxesInRankOrder)
    if (a != Axis::C) s.append(s.empty() ? "" : "x").append(std::to_string(g[a]));
  if (g.c() > 1) s += " c" + std::to_string(g.c());
  return s;
}

std::vector<GridShape> all_grids(int n) {
  if (n < 1) fail("number of ranks must be >= 1 (got ", n, ")");
  return parallel::factorizations(n, {Axis::X, Axis::Y, Axis::Z, Axis::C, Axis::P, Axis::D});
}

// ------------------------------------------------------------------------------------ FLOPs

double model_flops_per_step(const ModelConfig& m, int64_t sequences, int seq, AttentionFlops a) {
  const Sizes s = sizes(m);
  const double attention = a == AttentionFlops::Causal ? 0.5 : 1.0;
  const double per_token =
      6.0 * (s.L * s.block_matmul() + s.head()) + attention * 12.0 * s.L * s.A * seq;
  return per_token * double(sequences) * seq;
}

double hardware_flops_per_step(const ModelConfig& m, int64_t sequences, int seq, Recompute r,
                               AttentionFlops a) {
  const Sizes s = sizes(m);
  const double attention = a == AttentionFlops::Causal ? 0.5 : 1.0;
  double extra = 0;  // per token
  if (r == Recompute::Full) extra = 2.0 * s.L * s.block_matmul() + attention * 4.0 * s.L * s.A * seq;
  if (r == Recompute::Selective) extra = attention * 4.0 * s.L * s.A * seq;
  return model_flops_per_step(m, sequences, seq, a) + extra * double(sequences) * seq;
}

void set_flop_counts(Estimate& e, const PlanInput& in) {
  e.model_flops = model_flops_per_step(in.model, in.global_batch, in.seq);
  e.hardware_flops = hardware_flops_per_step(in.model, in.global_batch, in.seq, in.recompute);
  e.model_flops_full = model_flops_per_step(in.model, in.global_batch, in.seq, AttentionFlops::Full);
  e.hardware_flops_full =
      hardware_flops_per_step(in.model, in.global_batch, in.seq, in.recompute, AttentionFlops::Full);
}

double bubble_fraction(int p, int m, int v) {
  TETRAD_CHECK(p >= 1 && m >= 1 && v >= 1);
  return double(p - 1) / (double(v) * double(m));
}

parallel::LayerSplit layer_split_of(const PlanInput& in, const GridShape& g) {
  if (g.p() == 1) return parallel::LayerSplit::even(in.model.n_layer, 1);
  return parallel::resolve_layer_split(in.pipeline_layers, in.model, in.seq, g.p(),
                                       in.virtual_stages);
}

std::vector<int> stage_layer_counts(const parallel::LayerSplit& split, int p) {
  TETRAD_CHECK(p >= 1 && split.virtual_stages() % p == 0);
  std::vector<int> n(size_t(p), 0);
  for (int j = 0; j < split.virtual_stages(); ++j) {
    const auto [l0, l1] = split.layers(j);
    n[size_t(j % p)] += l1 - l0;
  }
  return n;
}

int stage_layer_count(const parallel::LayerSplit& split, int p) {
  const auto n = stage_layer_counts(split, p);
  return *std::max_element(n.begin(), n.end());
}

int stage_layer_count(int n_layer, int p, int v) {
  // n_layer = 0: the planner's way of isolating the top-level activations (no layers at all).
  if (n_layer == 0) return 0;
  // Stage 0 holds the most (the first L mod (p·v) virtual stages get one more layer).
  return stage_layer_count(parallel::LayerSplit::even(n_layer, p * v), p);
}

PipelineTime pipeline_time(parallel::PipelineSchedule s, int p, int m, int v,
                           const std::function<double(int, const parallel::PipeOp&)>& op_seconds) {
  TETRAD_CHECK(p >= 1 && m >= 1 && v >= 1);
  PipelineTime out;
  // Each stage's busy time for one micro-batch (every micro-batch costs the same).
  std::vector<double> per_mb(size_t(p), 0.0);
  for (int st = 0; st < p; ++st)
    for (int c = 0; c < v; ++c)
      for (bool fwd : {true, false}) per_mb[size_t(st)] += op_seconds(st, parallel::PipeOp{fwd, 0, c});
  out.busiest_stage = int(std::max_element(per_mb.begin(), per_mb.end()) - per_mb.begin());
  out.busiest = double(m) * per_mb[size_t(out.busiest_stage)];
  if (p == 1) {
    out.makespan = out.busiest;  // one stage never waits
    return out;
  }
  const double work = double(p) * p * 2.0 * m * v;  // the simulation's cost: ops x stages scanned
  if (work <= double(1 << 20)) {
    const parallel::PipelineTiming t = parallel::simulate_pipeline(
        s, p, m, v, [&](int st, size_t, const parallel::PipeOp& op) { return op_seconds(st, op); });
    out.makespan = t.makespan;
    out.simulated = true;
  } else {
    out.makespan = out.busiest * (1 + bubble_fraction(p, m, v));
  }
  return out;
}

double overlap_contention(double comm, double compute, double f) {
  if (!(f > 0) || comm <= 0 || compute <= 0) return 0;
  const double together = comm * (1 - f) >= compute ? comm : compute + f * comm;
  return together - std::max(comm, compute);
}

// ------------------------------------------------------------------------------------ placement

Placement place(const GridShape& g, AxisSet axes, const Machine& m) {
  return place_ranks(parallel::group_ranks(0, g, axes), g, m);  // rank 0's group
}
Placement place_ranks(const std::vector<int>& members, const GridShape& g, const Machine& m) {
  Placement pl;
  pl.group_size = int(members.size());
  std::set<int> nodes;
  for (int r : members) nodes.insert(r / m.ranks_per_node);
  pl.nodes = int(nodes.size());
  pl.per_node = std::max(1, pl.group_size / pl.nodes);
  if (pl.nodes == 1) {
    pl.bandwidth = m.intra_group_bandwidth(pl.per_node);
    pl.latency = m.intra_latency;
    // A measured table (this machine) replaces the two-level figures: per collective, the row
    // of the nearest group size.
    const char* ops[3] = {"all-reduce", "all-gather", "reduce-scatter"};
    for (int k = 0; k < 3; ++k) {
      const MeasuredLink* best = nullptr;
      for (const auto& l : m.measured)
        if (l.op == ops[k] &&
            (!best || std::abs(l.group_size - pl.group_size) < std::abs(best->group_size - pl.group_size)))
          best = &l;
      if (best) {
        pl.op_bandwidth[k] = best->bandwidth;
        pl.op_latency[k] = best->latency;
        if (k == 0) pl.bandwidth = best->bandwidth, pl.latency = best->latency;
      }
    }
  } else {
    // A ring over nodes with per_node consecutive members per node crosses each node's NICs once
    // per group; every rank of a node is in one group of this axis, so ranks_per_node / per_node
    // rings share the node's injection bandwidth at once.
    const int ranks_here = std::min(m.ranks_per_node, g.size());
    const double rings_per_node = std::max(1.0, double(ranks_here) / pl.per_node);
    pl.bandwidth = std::min(m.intra_group_bandwidth(pl.per_node), m.inter_bandwidth / rings_per_node);
    pl.latency = m.inter_latency;
    pl.intra_latency = m.intra_latency;
    // Above the node: the groups' egress when the ring crosses groups (network.hpp).
    const RingGroups rg = ring_groups(members, g.size(), m.ranks_per_node, m.topology);
    pl.groups = rg.ring_groups;
    pl.job_groups = rg.job_groups;
    pl.cross_fraction = rg.cross_fraction();
    const double capped =
        topology_ring_bandwidth(pl.bandwidth, rings_per_node, rg, m.topology, m.inter_bandwidth);
    pl.topology_limited = capped < pl.bandwidth;
    pl.bandwidth = capped;
  }
  return pl;
}

double collective_seconds(Op op, double bytes, const Placement& pl) {
  const int g = pl.group_size;
  TETRAD_CHECK(op != Op::AllToAll);  // alltoall_seconds (planner.hpp) prices it
  if (op == Op::SendRecv) return pl.latency + bytes / pl.bandwidth;
  if (g <= 1) return 0;
  const double frac = double(g - 1) / g;
  const int k = int(op);
  const double bw = pl.op_bandwidth[k] > 0 ? pl.op_bandwidth[k] : pl.bandwidth;
  const double lat = pl.op_bandwidth[k] > 0 ? pl.op_latency[k] : pl.latency;
  switch (op) {
    case Op::AllReduce: {
      const double ring = 2.0 * (g - 1) * lat + 2.0 * frac * bytes / bw;
      if (pl.nodes <= 1) return ring;
      // Across nodes NCCL picks its tree when it is faster (latency in log2(nodes)).
      return std::min(ring, tree_allreduce_seconds(bytes, pl.nodes, pl.per_node, lat,
                                                   pl.intra_latency, bw));
    }
    case Op::AllGather:
    case Op::ReduceScatter: return (g - 1) * lat + frac * bytes / bw;
    case Op::SendRecv: case Op::AllToAll: break;
  }
  return 0;
}

// ------------------------------------------------------------------------------------ memory

int64_t layer_activation_elements(const ModelConfig& m, const GridShape& g, int64_t N, Recompute mode) {
  // The model's own spec list (parallel/activation_layout.hpp), every tensor in fp32.
  const parallel::LocalDims d = parallel::LocalDims::of(m, g);
  int64_t n = 0;
  for (const parallel::LayerActSpec& t : parallel::kLayerActs)
    if (t.keep == parallel::ActKeep::Output || parallel::act_kept(t.keep, mode))
      n += parallel::act_floats(parallel::act_rows_of(N, parallel::act_rows(t), 1), t.width, t.store, d, false);
  return n;
}

int64_t trainer_activation_elements(const ModelConfig& m, const GridShape& g, int64_t N) {
  // One layer's tensors (kLayerActs) for each layer of the fullest stage, and the top-level ones
  // (kGlobalActs: the embedding's output, the head's, the work buffers), in fp32 (the bf16-only
  // gradient copies take nothing there), the stream not sharded (no "dfull").
  const parallel::LocalDims d = parallel::LocalDims::of(m, g);
  int64_t global = 0;
  for (const parallel::GlobalActSpec& t : parallel::kGlobalActs)
    global += parallel::act_floats(parallel::act_rows_of(N, parallel::act_rows(t), 1), t.width, t.store, d, false);
  return layer_activation_elements(m, g, N, Recompute::None) * stage_layer_count(m.n_layer, g.p()) +
         global;
}

namespace {

// Parameters of the stage holding the embedding (first) and the head (last); both on one stage
// when Gp = 1. Matrices are blocks over X and Y, split again over Z; vectors split over X or Y.
struct StageParams {
  double matrices = 0;  // z-sharded GEMM weights a rank stores
  double vectors = 0;   // norm weights, biases, position table (replicated over Z, D)
  double layer_block = 0, top_block = 0;  // gathered sizes (all of a layer's blocks / top blocks)
  double total() const { return matrices + vectors; }
};

// layers: the layers this stage stores (all of them when Gp = 1).
StageParams stage_params(const ModelConfig& m, const GridShape& g, bool first, bool last, int layers, int ep = 1) {
  // tetrad's pipeline keeps a copy of every top-level tensor (embeddings, final norm, head) on
  // every stage (parallel/sharding.hpp, TensorShard::stored), so each stage holds both ends.
  if (g.p() > 1) first = last = true;
  const Sizes s = sizes(m, ep);
  const double xy = double(g.x()) * g.y(), Ls = layers;
  StageParams sp;
  // Two norms, and with biases those of the transposed layers (over X) and of q|k|v and fc (Y);
  // with only a q|k|v bias, that one; the q/k norms' two head-wide vectors whole on every rank.
  const double layer_vec = s.qk_norm_vectors +
      (s.biases ? (2 * s.norm_vectors + 2) * s.H / g.x() + (s.QKV + s.F) / g.y()
       : s.qkv_bias ? 2 * s.norm_vectors * s.H / g.x() + s.QKV / g.y() : 2 * s.norm_vectors * s.H / g.x());
  sp.matrices = Ls * s.block_stored() / xy / g.z();
  sp.vectors = Ls * layer_vec;
  sp.layer_block = s.block_stored() / xy + layer_vec;
  if (first) {
    sp.matrices += s.head() / xy / g.z();  // token embedding
    sp.top_block += s.head() / xy;
    if (s.learned_positions) {
      sp.vectors += s.S_max * s.H / g.x();  // position table
      sp.top_block += s.S_max * s.H / g.x();
    }
  }
  if (last) {
    const double lnf = s.norm_vectors * s.H / g.x();
    sp.vectors += lnf;
    sp.top_block += lnf;
    if (!s.tied || !first) {  // untied head, or the tied copy on the last stage
      sp.matrices += s.head() / xy / g.z();
      sp.top_block += s.head() / xy;
    }
  }
  return sp;
}

int64_t micro_batch_of(const PlanInput& in, const GridShape& g) {
  if (in.micro_batch_per_data_group > 0) return in.micro_batch_per_data_group * (token_slots(g) / g.z());
  return in.micro_batch > 0 ? in.micro_batch : in.micro_batch_per_replica * token_slots(g);
}

// MemoryModel::Reference (planner.hpp): the textbook layout, not tetrad's.
MemoryBreakdown reference_memory_of_stage(const PlanInput& in, const GridShape& g, bool first, bool last) {
  const ModelConfig& m = in.model;
  // The fullest stage under the trainer's split (every stage keeps both ends' tensors, so the
  // most layers is the most memory).
  const double Ls = stage_layer_count(layer_split_of(in, g), g.p());
  const GridShape gc = g;  // with C: tokens per rank S / Gc; parameters as without_context says
  const GridShape gf = without_context(g, in.shard_over_context);
  const StageParams sp = stage_params(m, gf, first, last, int(Ls));
  const double psi = sp.total();
  const bool bf16 = in.precision == Precision::BF16;
  const double bw = bf16 ? 2 : 4;            // bytes of a weight / gradient
  const double opt = bf16 ? 12 : 8;          // fp32 master + m + v, or m + v
  MemoryBreakdown mb;
  mb.weights = bw * psi;
  // Megatron-LM under bf16 keeps its gradients in fp32 main-grad buffers (dp_grad_comm_bytes 4).
  mb.grads = (in.dp_grad_comm_bytes > 0 ? in.dp_grad_comm_bytes : bw) * psi / (in.zero >= 2 ? g.d() : 1);
  mb.optimizer = opt * psi / (in.zero >= 1 ? g.d() : 1);
  if (gf.z() > 1) mb.gathered = 2 * bw * (sp.layer_block + sp.top_block);  // weights + grad blocks
  // Activations: the trainer's buffers for one micro-batch, reduced by recomputation; a 1F1B
  // stage keeps min(p, m) micro-batches in flight (the first stage the most).
  const int64_t mbatch = std::max<int64_t>(1, micro_batch_of(in, g));
  const int64_t N = mbatch / std::max(1, token_slots(gc)) * in.seq / gc.c();
  const int64_t m_count = std::max<int64_t>(1, in.global_batch / mbatch);
  const double act_b = bf16 ? 2 : 4;
  GridShape one_layer = gf;
  const double all = double(trainer_activation_elements(m, gf, N));
  ModelConfig m0 = m;
  m0.n_layer = 0;
  one_layer[Axis::P] = 1;
  const double global = double(trainer_activation_elements(m0, one_layer, N));
  const double per_layer_count = stage_layer_count(m.n_layer, g.p());  // what `all` holds
  const double per_layer = per_layer_count > 0 ? (all - global) / per_layer_count : 0;
  const int v = in.virtual_stages;
  double kept = per_layer;  // per layer per micro-batch
  double work = 0;          // one layer's recomputed activations while its backward runs
  // What each mode keeps is the trainer's (ParallelTransformer::activation_bytes): selective drops
  // the attention output and its log-sum-exp (recomputed from the kept q|k|v), full keeps only
  // the block's input; the recomputed tensors share one layer's scratch.
  if (in.recompute != Recompute::None) {
    kept = double(layer_activation_elements(m, gf, N, in.recompute));
    work = per_layer - kept;
  }
  // Micro-batch chunks the first stage holds at once, from the trainer's own schedule
  // (1F1B: min(p, m) micro-batches; interleaved: more chunks, each Ls / v layers).
  double in_flight_layers = Ls * double(std::min<int64_t>(g.p(), m_count));
  if (g.p() > 1) {
    try {
      const auto ops = parallel::pipeline_schedule(in.schedule, g.p(), 0, int(m_count), v);
      int live = 0, most = 0;
      for (const auto& op : ops) most = std::max(most, live += op.forward ? 1 : -1);
      in_flight_layers = Ls / v * most;
    } catch (const Error&) {
      // A combination the trainer refuses is rejected by divisibility_problem; keep the 1F1B count.
    }
  }
  mb.activations = act_b * (kept * in_flight_layers + work + global) + context_gather_bytes(in, gc, mbatch / std::max(1, token_slots(gc)), in.seq / gc.c());
  return mb;
}

}  // namespace

int64_t local_parameters(const ModelConfig& m, const GridShape& g) {
  const int layers = stage_layer_count(m.n_layer, g.p());  // the ShardPlan default: even, v = 1
  const auto a = stage_params(m, g, true, g.p() == 1, layers),
             b = stage_params(m, g, g.p() == 1, true, layers);
  return int64_t(std::llround(std::max(a.total(), b.total())));
}

parallel::ParallelOptions model_options(const PlanInput& in) {
  parallel::ParallelOptions po;
  po.precision = in.precision == Precision::BF16 ? backend::Precision::BF16 : backend::Precision::FP32;
  po.recompute = in.recompute;
  po.zero = in.zero;
  po.virtual_stages = in.virtual_stages;
  po.pipeline_layers = in.pipeline_layers;
  po.sparse_embedding_grad = in.sparse_embedding_grad;
  po.sequence_shard = in.sequence_shard;
  po.overlap = in.overlap_switches;
  // The context exchange's buffers follow parallel.cp_comm; unset (auto), the all-gather's,
  // the larger for Gc >= 2 (4 Gc blocks against the ring's 6).
  po.cp_comm = in.cp_comm == CpComm::Ring ? parallel::ContextComm::Ring : parallel::ContextComm::AllGather;
  return po;
}

MemoryBreakdown memory_breakdown(const parallel::ModelMemory& m) {
  MemoryBreakdown b;
  b.weights = double(m.params + m.params16);
  b.grads = double(m.grads);
  b.optimizer = double(m.optimizer);
  b.gathered = double(m.gathered);
  b.staging = double(m.staging);
  b.activations = double(m.activation_total());
  return b;
}

MemoryBreakdown memory_of_grid(const PlanInput& in, const GridShape& g) {
  if (in.memory_model == MemoryModel::Reference) {
    const MemoryBreakdown a = reference_memory_of_stage(in, g, true, g.p() == 1);
    if (g.p() == 1) return a;
    const MemoryBreakdown b = reference_memory_of_stage(in, g, false, true);
    return a.total() >= b.total() ? a : b;
  }
  // The model's own arithmetic for the rank of each candidate stage (coordinate 0 on the other
  // axes: ZeRO's pieces are ceil(n / Gd) on every D rank, and X, Y, Z blocks divide evenly).
  const int64_t mbatch = std::max<int64_t>(1, micro_batch_of(in, g));
  const int local = int(std::max<int64_t>(1, mbatch / std::max(1, token_slots(g))));
  const int m_count = int(std::max<int64_t>(1, in.global_batch / mbatch));
  const parallel::ParallelOptions po = model_options(in);
  // A context axis: the trainer's formula takes it (S / Gc tokens of each sequence per rank,
  // ZeRO's pieces over C x D, the exchange's buffers as ContextAttention allocates them). With
  // shard_over_context (TorchTitan's layout, not tetrad's) C is folded into Z at S / Gc and the
  // exchange is TorchTitan's (K|V only, in the run's precision) beside it.
  const GridShape gf = in.shard_over_context ? without_context(g, true) : g;
  const int seq_local = in.shard_over_context ? in.seq / g.c() : in.seq;
  const double gather =
      in.shard_over_context ? context_gather_bytes(in, g, local, in.seq / g.c()) : 0.0;
  // Every stage keeps the top-level tensors and the whole activation buffer, so the fullest is
  // the one with the most layers (state) or the most in flight (stage 0) or the last chunk's
  // stash (stage p - 1): those three, not all p (plans over thousands of ranks stay cheap).
  std::vector<int> stages{0};
  if (g.p() > 1) {
    const std::vector<int> n = stage_layer_counts(layer_split_of(in, g), g.p());
    stages.push_back(int(std::max_element(n.begin(), n.end()) - n.begin()));
    stages.push_back(g.p() - 1);
  }
  MemoryBreakdown best;
  bool first = true;
  for (int st : stages) {
    parallel::GridCoord c;
    c[Axis::P] = st;
    MemoryBreakdown b = memory_breakdown(
        parallel::model_memory(in.model, gf, c, local, seq_local, po, in.schedule, m_count));
    b.activations += gather;
    if (first || b.total() > best.total()) best = b;
    first = false;
  }
  return best;
}

// ------------------------------------------------------------------------------------ validity

std::string divisibility_problem(const PlanInput& in, const GridShape& g) {
  const ModelConfig& m = in.model;
  if (g.c() > 1 && in.seq % (2 * g.c()) != 0)
    return "sequence length (" + std::to_string(in.seq) + ") is not divisible by 2 x Gc = " +
           std::to_string(2 * g.c()) + " (each sequence is cut into 2 Gc chunks, rank r holding chunks r "
           "and 2 Gc - 1 - r)";
  try {
    parallel::validate_grid_for_model(m, in.shard_over_context ? without_context(g, true) : g);
  } catch (const Error& e) {
    std::string s = e.what();
    if (s.starts_with("grid: ")) s = s.substr(6);
    return s;
  }
  // The trainer splits layers over Gp x virtual stages unevenly if need be, but each virtual
  // stage needs one (parallel_transformer.cpp); interleaving needs m divisible by Gp
  // (pipeline_schedule.cpp).
  if (m.n_layer < g.p() * in.virtual_stages)
    return "model.n_layer (" + std::to_string(m.n_layer) + ") is smaller than Gp x virtual stages = " +
           std::to_string(g.p() * in.virtual_stages);
  if (g.p() > 1) {
    try {
      (void)layer_split_of(in, g);  // an explicit split of the wrong length for this Gp
    } catch (const Error& e) {
      return e.what();
    }
  }
  const int64_t mb = micro_batch_of(in, g);
  if (mb < 1) return "no micro-batch given (a searched one is chosen per grid by estimate())";
  if (mb % token_slots(g) != 0)
    return "micro-batch (" + std::to_string(mb) + ") is not divisible by Gz x Gd = " +
           std::to_string(token_slots(g));
  if (in.global_batch % mb != 0)
    return "global batch (" + std::to_string(in.global_batch) +
           ") is not a multiple of the micro-batch (" + std::to_string(mb) + ")";
  if (g.p() > 1 && in.schedule == Schedule::Interleaved && (in.global_batch / mb) % g.p() != 0)
    return "the interleaved schedule needs the micro-batches (" + std::to_string(in.global_batch / mb) +
           ") divisible by Gp = " + std::to_string(g.p());
  // (With a context axis a rank's tokens are its 2 chunks of each sequence: seq / Gc of them.)
  if (const int64_t rank_tokens = mb / token_slots(g) * (in.seq / g.c());
      in.sequence_shard && g.y() > 1 && rank_tokens % g.y() != 0)
    return "parallel.sequence_shard: the " + std::to_string(rank_tokens) +
           " tokens of a micro-batch per rank do not split evenly over Gy = " + std::to_string(g.y());
  // Z shards each rank's block of every GEMM weight without padding (parallel/sharding.cpp).
  const int64_t hd = m.head_dim(), Cx = m.n_embd / g.x();
  const std::vector<std::pair<const char*, int64_t>> blocks = {
      {"q|k|v", int64_t(m.n_head + 2 * m.n_kv_head) * hd / g.y() * Cx},
      {"attention output", int64_t(m.q_dim() / g.y()) * Cx},
      {"MLP up", int64_t(m.ffn / g.y()) * Cx},
      {"MLP down", int64_t(m.ffn / g.y()) * Cx},
      {"embedding", int64_t(m.vocab_size / g.y()) * Cx}};
  const int gz = without_context(g, in.shard_over_context).z();  // Z, or Z x C sharding over context
  for (const auto& [what, n] : blocks)
    if (n % gz != 0)
      return std::string("the ") + what + " block of a rank (" + std::to_string(n) +
             " elements) is not divisible by " + (gz == g.z() ? "Gz" : "Gz x Gc") + " = " + std::to_string(gz);
  if (in.seq > m.max_seq)
    return "sequence length " + std::to_string(in.seq) + " exceeds model.max_seq " +
           std::to_string(m.max_seq);
  return expert_parallel_problem(in, g);
}

bool trainer_supports_pipeline() {
  try {
    parallel::parse_grid("1,1,1,1,1");
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::string trainer_grid_string(const GridShape& g) {
  std::ostringstream o;
  if (g.c() > 1 || g.e() > 1) return g.to_arg();  // only the named form gives C and E
  if (trainer_supports_pipeline())
    o << g.x() << "," << g.y() << "," << g.z() << "," << g.p() << "," << g.d();
  else
    o << g.x() << "," << g.y() << "," << g.z() << "," << g.d();
  return o.str();
}

// ------------------------------------------------------------------------------------ the model

std::string missing_rate_message(const Machine& m, Precision p) {
  const char* key = p == Precision::BF16 ? "peak_bf16_tflops" : "peak_fp32_tflops";
  std::ostringstream o;
  o << "machine '" << m.name << "'" << (m.source.empty() ? "" : " (" + m.source + ")")
    << " has no " << name(p) << " rate, which a " << name(p) << " run needs: add [compute] " << key
    << " (TFLOP/s per rank) to the file, or measure this machine with `mpirun -n RANKS tetrad plan "
       "--measure-machine "
    << (m.source.empty() ? "machines/" + m.name + ".toml" : m.source) << "`";
  if (p == Precision::BF16) o << " (it records the bf16 GEMM rate the trainer runs here)";
  return o.str();
}

void require_rate(const Machine& m, Precision p) {
  if (m.peak(p == Precision::BF16) <= 0) fail(missing_rate_message(m, p));
}

// ------------------------------------------------------------------- estimate, by cost term

namespace {

// Why a grid's memory per rank does not fit the machine; "" when it fits.
std::string fit_problem(const MemoryBreakdown& mem, const Machine& mach) {
  if (mem.total() <= mach.memory_bytes) return "";
  std::ostringstream o;
  o << std::fixed << std::setprecision(1) << "does not fit: needs " << mem.total() / 1e9
    << " GB per rank (weights " << mem.weights / 1e9 << ", grads " << mem.grads / 1e9
    << ", optimizer " << mem.optimizer / 1e9 << ", gathered " << mem.gathered / 1e9
    << ", staging " << mem.staging / 1e9 << ", activations " << mem.activations / 1e9 << "), machine has "
    << mach.memory_bytes / 1e9 << " GB";
  return o.str();
}

// Compute of one micro-batch on one rank, per layer and for the top (embedding + head).
struct ComputeTimes {
  GemmTimes gt;
  AttentionSeconds attn;  // one layer's attention core, forward and backward (attention.cpp)
  double layer_fwd = 0, layer_bwd = 0, layer_dw = 0;  // seconds per layer
  double head_fwd = 0, head_bwd = 0;                  // seconds of the head and the loss
};

ComputeTimes compute_times(const PlanInput& in, const GridShape& g, const Machine& mach, const Sizes& s, double T) {
  const ModelConfig& m = in.model;
  const bool bf16 = in.precision == Precision::BF16;
  const double act_b = bf16 ? 2 : 4;
  const bool full = in.recompute == Recompute::Full, any_rc = in.recompute != Recompute::None;
  ComputeTimes c;
  // Attention: heads split over Y, sequences shared over X where Gx divides them (else every X
  // rank runs all of them: x_shares_sequences), by the run's kernel (attention.cpp) on the T / Gx
  // tokens of this rank's sequences.
  const double x_share = x_shares_sequences(in, g, T) ? g.x() : 1;
  c.attn = attention_core_seconds(in, mach, T / x_share, g.y());
  ModelConfig m1 = m;
  m1.n_layer = 1;
  GridShape g1 = without_context(g, in.shard_over_context);
  g1[Axis::P] = 1;
  ModelConfig m0 = m;
  m0.n_layer = 0;
  const double layer_elems =
      double(trainer_activation_elements(m1, g1, int64_t(T)) - trainer_activation_elements(m0, g1, int64_t(T)));
  // Elementwise work is memory-bound: each stored activation is written and read in forward and
  // backward, and its gradient written and read (4 passes); recomputation adds a forward (2).
  const double elem_passes = 4 + (any_rc ? 2 : 0);
  // Each GEMM at the efficiency of its own per-rank shape (Machine::gemm_eff): forward
  // C[T, n] = A[T, k] W[k, n], input gradient [T, k] = [T, n] W^T, weight gradient
  // [k, n] = A^T [T, n] (a GEMM with k = T).
  c.gt = block_gemm_times(s, g, T, mach, bf16);
  const double t_gemm_fwd = c.gt.fwd;
  c.layer_dw = c.gt.dw;
  c.layer_fwd = t_gemm_fwd + c.attn.fwd + 2 * layer_elems * act_b / mach.memory_bandwidth;
  c.layer_bwd = c.gt.din + c.gt.dw + (full ? t_gemm_fwd : 0) + c.attn.bwd + (any_rc ? c.attn.fwd : 0) +
                (elem_passes - 2) * layer_elems * act_b / mach.memory_bandwidth;
  // The cross-entropy's passes run on this rank's 1/Gx of the rows (vocab_parallel.cpp).
  const double logits_b = T * s.V / g.y() * act_b / (int64_t(T) % g.x() == 0 ? g.x() : 1);
  // The head's GEMMs and the cross-entropy's passes over the logits (2 forward, 2 backward).
  c.head_fwd = c.gt.head_fwd + 2 * logits_b / mach.memory_bandwidth;
  c.head_bwd = c.gt.head_bwd + 2 * logits_b / mach.memory_bandwidth;
  return c;
}

// The exposed part of an overlapped class of a layer's collectives (what its compute cannot hide).
double z_fwd_exposed(const CommSums& c, const ComputeTimes& t) { return std::max(0.0, c.z_fwd - t.layer_fwd); }
double z_bwd_exposed(const CommSums& c, const ComputeTimes& t) {
  return std::max(0.0, c.z_bwd - (t.layer_bwd - t.layer_dw));
}
double din_exposed(const CommSums& c, const ComputeTimes& t) { return std::max(0.0, c.din - t.layer_dw); }

// A layer's communication per micro-batch: exposed and the contention of the hidden part.
struct LayerComm {
  double exposed = 0, contention = 0;
};

LayerComm layer_comm(const CommSums& c, const ComputeTimes& t, bool ov_tensor, double f, int gc,
                     double fwd_mult) {
  LayerComm l;
  // The context ring hides behind the attention whatever the overlap switches say (it is the
  // ring's algorithm): each step behind one block's attention (context.cpp).
  const double attn_f = fwd_mult * t.attn.fwd, attn_b = t.attn.bwd;
  const double ring_exp = ring_exposed(c.ring_fwd, c.ring_bwd, attn_f, attn_b, gc);
  const double ring_contention = overlap_contention(c.ring_fwd, attn_f, f) + overlap_contention(c.ring_bwd, attn_b, f);
  l.exposed = c.layer_total() - c.ring_fwd - c.ring_bwd + ring_exp;
  l.contention = ring_contention;
  // Overlap contention (docs/planner.md): a collective running beside compute holds
  // collective_units of the machine's units, so the compute it hides behind runs at
  // 1 - f of its rate while they overlap, f = collective_units / units.
  if (ov_tensor) {
    l.exposed = c.fwd_ar + z_fwd_exposed(c, t) + z_bwd_exposed(c, t) + din_exposed(c, t) + ring_exp;
    l.contention = ring_contention + overlap_contention(c.z_fwd, t.layer_fwd, f) +
                   overlap_contention(c.z_bwd, t.layer_bwd - t.layer_dw, f) +
                   overlap_contention(c.din, t.layer_dw, f);
  }
  return l;
}

// ---- the pipeline: each op's duration on its stage from the layers the trainer gives that
// virtual stage (layer_split_of: parallel.pipeline_layers as the trainer resolves it), and the
// schedule's makespan (pipeline_time).

// One op's seconds on its stage, by part: compute, exposed communication, contention.
struct OpParts {
  double compute = 0, comm = 0, contention = 0;
  double total() const { return compute + comm + contention; }
};

struct PipelineParts {
  PipelineTime pt;
  OpParts busiest;  // the busiest stage's parts (what the printed shares describe)
};

PipelineParts pipeline_parts(const PlanInput& in, const GridShape& g, const parallel::LayerSplit& layer_split,
                             const ComputeTimes& t, const CommSums& sums, const LayerComm& lc, int64_t mcount) {
  // Chunks per stage: the split's (parallel.virtual_stages with a pipeline axis; without one the
  // model runs every layer as one chunk whatever the schedule says, layer_split_of).
  const int v = layer_split.virtual_stages() / g.p();
  TETRAD_CHECK(v >= 1 && layer_split.virtual_stages() == g.p() * v);
  const double layer_time = t.layer_fwd + t.layer_bwd;
  const double fwd_share = t.layer_fwd / layer_time;
  const std::vector<int> split = layer_split.counts();
  auto op_parts = [&](int stage, const parallel::PipeOp& op) {
    const int j = op.chunk * g.p() + stage, V = g.p() * v;
    const double nl = split.at(size_t(j));
    const double share = op.forward ? fwd_share : 1 - fwd_share;  // of the layer's comm
    OpParts o;
    o.compute = nl * (op.forward ? t.layer_fwd : t.layer_bwd);
    o.comm = nl * share * lc.exposed;
    o.contention = nl * share * lc.contention;
    if (op.forward && j == 0) o.comm += sums.mb_at[int(MbAt::FirstFwd)];
    if (j == V - 1) {
      o.compute += op.forward ? t.head_fwd : t.head_bwd;
      o.comm += sums.mb_at[int(op.forward ? MbAt::LastFwd : MbAt::LastBwd)];
    }
    o.comm += sums.mb_at[int(MbAt::EveryOp)] / (2.0 * v);  // one transfer per op
    return o;
  };
  PipelineParts r;
  r.pt = pipeline_time(in.schedule, g.p(), int(mcount), v,
                       [&](int st, const parallel::PipeOp& op) { return op_parts(st, op).total(); });
  for (int c = 0; c < v; ++c)
    for (bool fwd : {true, false}) {
      const OpParts o = op_parts(r.pt.busiest_stage, parallel::PipeOp{fwd, 0, c});
      r.busiest.compute += o.compute, r.busiest.comm += o.comm, r.busiest.contention += o.contention;
    }
  return r;
}

// Optimizer: AdamW streams parameters, gradients and moments (read p, g, m, v, write p, m, v:
// 28 bytes per fp32 parameter; 36 with bf16 weights and fp32 master copies), plus the gradient
// norm's read; ZeRO >= 1 updates only 1/Gd of them.
double optimizer_seconds(const PlanInput& in, const GridShape& g, const Machine& mach, const StageParams& sp) {
  const bool bf16 = in.precision == Precision::BF16;
  const double w_b = bf16 ? 2 : 4;
  const double opt_params = sp.total() / (in.zero >= 1 ? g.d() : 1);
  return ((bf16 ? 36.0 : 28.0) * opt_params + w_b * sp.total()) / mach.memory_bandwidth;
}

// Per-step totals of every collective into e.collectives, exposure apportioned within its class;
// returns the exposed seconds by axis ("comm x", ...).
std::map<std::string, double> per_step_collectives(Estimate& e, const std::vector<CommItem>& items, const CommSums& sums,
                                                   const ComputeTimes& t, double Ls, int64_t mcount,
                                                   bool ov_tensor, double dp_exposed, double ring_share_fwd,
                                                   double ring_share_bwd) {
  std::map<std::string, double> exposed_by_axis;
  for (auto& it : items) {
    CollectiveCost c = it.c;
    const double per_call = c.seconds;
    if (it.per_layer > 0) c.calls = it.c.calls * Ls * double(mcount);
    else if (it.kind != kData) c.calls = it.c.calls * double(mcount);
    c.seconds = per_call * c.calls;
    double share = 1;
    if (it.kind == kRingFwd || it.kind == kRingBwd) {
      share = it.kind == kRingFwd ? ring_share_fwd : ring_share_bwd;
    } else if (it.per_layer > 0 && ov_tensor && it.kind != kExposed) {
      const double cls = it.kind == kZFwd ? sums.z_fwd : it.kind == kZBwd ? sums.z_bwd : sums.din;
      const double cls_exp = it.kind == kZFwd   ? z_fwd_exposed(sums, t)
                             : it.kind == kZBwd ? z_bwd_exposed(sums, t)
                                                : din_exposed(sums, t);
      share = cls > 0 ? cls_exp / cls : 0;
    }
    if (it.kind == kData) share = sums.step_comm > 0 ? dp_exposed / sums.step_comm : 0;
    c.exposed = c.seconds * share;
    exposed_by_axis[std::string("comm ") + c.group_name()] += c.exposed;
    e.collectives.push_back(c);
  }
  return exposed_by_axis;
}

// Dominant cost: the largest of compute, bubble, optimizer and each axis's exposed time.
std::string dominant_cost(const Estimate& e, const std::map<std::string, double>& exposed_by_axis) {
  std::vector<std::pair<std::string, double>> parts = {
      {"compute", e.compute}, {"bubble", e.bubble}, {"optimizer", e.optimizer}};
  for (auto& [k, v] : exposed_by_axis) parts.push_back({k, v});
  return std::max_element(parts.begin(), parts.end(), [](auto& a, auto& b) {
           return a.second < b.second;
         })->first;
}

}  // namespace

Estimate estimate(const PlanInput& in, const GridShape& g, const Machine& mach) {
  if (g.e() > 1 && in.expert_parallel == 1) {  // the fold named in the grid (--why d=2,e=2)
    PlanInput a = in;
    a.expert_parallel = g.e();
    return estimate(a, GridShape(g).set_e(1), mach);
  }
  if (in.search_micro_batch) return estimate_searching_micro_batch(in, g, mach);
  if (g.c() > 1 && in.cp_comm == CpComm::Auto) {
    // parallel.cp_comm unset: the faster of the ring and the all-gather for this grid.
    PlanInput a = in;
    a.cp_comm = CpComm::Ring;
    Estimate ring = estimate(a, g, mach);
    a.cp_comm = CpComm::AllGather;
    Estimate gather = estimate(a, g, mach);
    if (!ring.valid) return gather;
    if (!gather.valid) return ring;
    return gather.step < ring.step ? gather : ring;
  }
  Estimate e;
  e.grid = GridShape(g).set_e(std::max(1, in.expert_parallel)), e.expert_parallel = in.expert_parallel;
  e.cp_comm = g.c() > 1 ? in.cp_comm : CpComm::Auto;
  e.trainable = g.p() == 1 || trainer_supports_pipeline();
  const ModelConfig& m = in.model;
  const Sizes s = sizes(m, in.expert_parallel);
  set_flop_counts(e, in);
  if (std::string why = divisibility_problem(in, g); !why.empty()) {
    e.reject = "does not divide: " + why;
    return e;
  }
  const bool bf16 = in.precision == Precision::BF16;
  if (mach.peak(bf16) <= 0) {
    e.reject = missing_rate_message(mach, in.precision);
    return e;
  }
  e.micro_batch = micro_batch_of(in, g);
  e.micro_batches = in.global_batch / e.micro_batch;
  // Tokens per rank per micro-batch: its sequences, S / Gc of each with a context axis.
  const double T = double(e.micro_batch / token_slots(g)) * (in.seq / g.c());
  e.tokens_per_rank = int64_t(T);
  e.memory = memory_per_rank(in, g);
  if (std::string why = fit_problem(e.memory, mach); !why.empty()) {
    e.reject = why;
    return e;
  }

  const bool full = in.recompute == Recompute::Full, any_rc = in.recompute != Recompute::None;
  const ComputeTimes t = compute_times(in, g, mach, s, T);
  // The trainer's split (parallel.pipeline_layers): layers of each virtual stage.
  const parallel::LayerSplit layer_split = layer_split_of(in, g);
  const double Ls = stage_layer_count(layer_split, g.p());  // the fullest stage's layers
  const GridShape gf = without_context(g, in.shard_over_context);
  const StageParams sp = stage_params(m, gf, true, g.p() == 1, int(Ls), in.expert_parallel);

  Collectives coll(g, mach);
  add_tensor_layer_comm(coll, in, g, s, T);
  add_sharded_layer_comm(coll, in, g, s);
  add_top_comm(coll, in, g, s, T);
  add_pipeline_comm(coll, in, g, s, T);
  add_data_comm(coll, in, g, sp.matrices - expert_matrices(s, gf, Ls), sp.vectors);  // the experts':
  add_moe_comm(coll, in, g, s, T, Ls, mach);                                       // over E's groups
  add_context_layer_comm(coll, in, g, s, T, e.cp_comm);
  const CommSums sums = comm_sums(coll.items());

  // ---- time of one micro-batch on the slowest stage, with overlap
  const bool ov_tensor = in.overlap != Overlap::None, ov_all = in.overlap == Overlap::All;
  const double f = mach.contended_fraction();
  const double fwd_mult = full ? 2 : 1;
  const LayerComm lc = layer_comm(sums, t, ov_tensor, f, g.c(), fwd_mult);
  // Each ring pass's exposed share (context.cpp), for the per-collective table.
  const double ring_f = ring_exposed(sums.ring_fwd, 0, fwd_mult * t.attn.fwd, 0, g.c());
  const double ring_b = ring_exposed(0, sums.ring_bwd, 0, t.attn.bwd, g.c());
  const int64_t mcount = e.micro_batches;
  const GemmTimes& gt = t.gt;
  e.compute_gemm = double(mcount) * (Ls * (gt.fwd + gt.din + gt.dw + (full ? gt.fwd : 0)) + gt.head_fwd + gt.head_bwd);
  e.compute_attention = double(mcount) * Ls * (t.attn.fwd + t.attn.bwd + (any_rc ? t.attn.fwd : 0));
  const PipelineParts pp = pipeline_parts(in, g, layer_split, t, sums, lc, mcount);
  e.bubble = pp.pt.makespan - pp.pt.busiest;
  const double bwd_last = Ls * t.layer_bwd;
  const double dp_exposed = ov_all ? std::max(0.0, sums.step_comm - bwd_last) : sums.step_comm;
  const double dp_contention = ov_all ? overlap_contention(sums.step_comm, bwd_last, f) : 0.0;
  e.contention = double(mcount) * pp.busiest.contention + dp_contention;
  e.optimizer = optimizer_seconds(in, g, mach, sp);
  e.compute = double(mcount) * pp.busiest.compute;
  e.comm_total = double(mcount) * (Ls * sums.layer_total() + sums.per_mb_total) + sums.step_comm;
  e.comm_exposed = double(mcount) * pp.busiest.comm + dp_exposed;
  e.step = pp.pt.makespan + dp_exposed + dp_contention + e.optimizer;
  e.valid = true;
  e.tokens_per_s = double(in.global_batch) * in.seq / e.step;
  const double peak_all = mach.peak(bf16) * g.size();
  e.mfu = e.model_flops / e.step / peak_all;
  e.hfu = e.hardware_flops / e.step / peak_all;

  const auto exposed_by_axis =
      per_step_collectives(e, coll.items(), sums, t, Ls, mcount, ov_tensor, dp_exposed,
                           sums.ring_fwd > 0 ? ring_f / sums.ring_fwd : 0, sums.ring_bwd > 0 ? ring_b / sums.ring_bwd : 0);
  e.dominant = dominant_cost(e, exposed_by_axis);
  return e;
}

std::vector<Estimate> plan(const PlanInput& in, const Machine& m) {
  in.validate();
  require_rate(m, in.precision);
  std::vector<Estimate> valid, rejected;
  for (const GridShape& g : all_grids(in.ranks)) {
    if (g.p() > 1 && !in.allow_pipeline) continue;
    if (g.c() > 1 && !in.allow_context) continue;
    for (Estimate& e : estimate_expert_axis(in, g, m)) (e.valid ? valid : rejected).push_back(std::move(e));
  }
  std::stable_sort(valid.begin(), valid.end(),
                   [](const Estimate& a, const Estimate& b) { return a.step < b.step; });
  valid.insert(valid.end(), rejected.begin(), rejected.end());
  return valid;
}

}  // namespace tetrad::planner
