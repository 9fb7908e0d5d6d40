// The planner: a performance and memory model of one training step on a 5D grid
// (Gx, Gy, Gz, Gp, Gd), as pure functions of the configuration (docs/planner.md has every
// equation). It predicts, for every grid of a rank count, the step time split into compute,
// exposed communication, pipeline bubble and optimizer, the per-rank memory, and ranks the grids;
// grids that do not divide the model or do not fit in memory are kept with the reason.
//
// The algorithm modelled is the one tetrad implements (4d-parallelism.md, docs/parallel.md):
// every collective the trainer issues, with its group, element count and how often, costed by a
// ring latency-bandwidth model whose bandwidth depends on where the group's ranks sit (rank order
// x fastest, then y, z, p, d; ranks_per_node consecutive ranks per node). The pipeline axis P
// (between Z and D) runs the trainer's schedules (1F1B or interleaved, parallel.schedule) with
// point-to-point transfers between stages.
//
// Each GEMM runs at the efficiency of its own per-rank shape (Machine::gemm_eff: wave
// quantization over the GPU's SMs and a memory roofline, or a measured lattice on a CPU).
// An overlapped collective holds Machine::collective_units of the units its compute runs on
// (overlap_contention). What it does not model: other kernel-level effects (a collective's HBM
// traffic, clock throttling), contention between different axes' collectives running at the
// same time, hierarchical (two-level) collective algorithms, stragglers.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tetrad/backend/precision.hpp"
#include "tetrad/model/flops.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/parallel/memory_model.hpp"
#include "tetrad/parallel/options.hpp"
#include "tetrad/parallel/layer_split.hpp"
#include "tetrad/parallel/pipeline_schedule.hpp"
#include "tetrad/planner/machine.hpp"

namespace tetrad::planner {

// train.precision: the backend's own type and parser (backend/precision.hpp).
using Precision = backend::Precision;
// train.recompute and parallel.schedule are the trainer's own types and parsers, so the planner
// plans exactly the modes the trainer runs (parallel/options.hpp, pipeline_schedule.hpp).
using Recompute = parallel::Recompute;
using parallel::parse_recompute;               // "none" | "selective" | "full"
using Schedule = parallel::PipelineSchedule;
using parallel::parse_pipeline_schedule;       // "1f1b" | "interleaved"
// What communication hides behind compute. None: everything blocking (tetrad's trainer today).
// Tensor: AxoNN's OAR/ORS/OAG (backward all-reduces behind the weight-gradient GEMM, Z gathers
// and reduce-scatters behind the layer's compute). All: Tensor plus the data-parallel gradient
// all-reduce behind the last micro-batch's backward.
enum class Overlap { None, Tensor, All };
// How a context axis C > 1 exchanges keys and values (issue 28; parallel.cp_comm): Ring: C - 1
// point-to-point steps per attention, each overlapped with the attention on the block already
// present (Megatron-Core); AllGather: K and V all-gathered over C before the attention and dK, dV
// reduce-scattered after it, exposed (TorchTitan); Auto: the faster of the two for each grid.
enum class CpComm { Auto, Ring, AllGather };
CpComm parse_cp_comm(const std::string& s);        // "auto" | "ring" | "all-gather"
const char* name(CpComm c);
// The attention core's kernel (docs/planner.md, "The attention kernel"). Fused: FlashAttention's
// way, the scores never leave the chip and a causal kernel skips the masked half (tetrad's own
// kernel; FlashAttention-2 at the machine's attention_efficiency). Materialized: the scores
// written to memory, as Megatron-LM ran attention before FlashAttention (its SC21 runs): batched
// GEMMs Q·Kᵀ and P·V over every score, causal or not, and between them a fused
// scale-mask-softmax and the dropout of the probabilities, each a pass over the [S, S] scores.
enum class AttentionKernel { Fused, Materialized };
AttentionKernel parse_attention_kernel(const std::string& s);  // "fused" | "materialized"
const char* name(AttentionKernel k);

using backend::parse_precision;                    // "fp32" | "bf16"
Overlap parse_overlap(const std::string& s);       // "none" | "tensor" | "all"
const char* name(Precision p);
inline const char* name(Recompute r) { return parallel::recompute_name(r); }
inline const char* name(Schedule s) { return parallel::schedule_name(s); }
const char* name(Overlap o);

// The grid a plan prices: the trainer's own (parallel/grid.hpp), every axis.
using parallel::Axis;
using parallel::AxisSet;
using parallel::GridShape;
// Every grid with product n, lexicographic in the rank order (x, y, z, c, p, d).
std::vector<GridShape> all_grids(int n);
// "2x1x2x1x1": the extents (x, y, z, p, d), the form of the planner's tables and JSON; a context
// axis C > 1 is appended as "2x1x2x1x1 c4".
std::string grid_label(const GridShape& g);

// Whose memory layout a plan prices. Tetrad: what tetrad's model allocates
// (parallel::model_memory), for every plan of a tetrad run. Reference: the textbook
// mixed-precision layout of Megatron-LM and the ZeRO paper (2-byte weights and gradients in bf16
// plus 12 bytes of fp32 master weights and Adam moments per parameter, 2-byte activations, each
// pipeline stage holding only the kept activations of its micro-batches in flight), for the
// published rows of other frameworks' runs (validate.hpp, scaling.hpp), whose grids fit their
// framework's memory, not tetrad's.
enum class MemoryModel { Tetrad, Reference };

struct PlanInput {
  ModelConfig model;
  std::string model_name;
  int64_t global_batch = 0;    // sequences per optimizer step
  // Sequences per micro-batch of the whole job, split over Z x D (train.micro_batch). When 0,
  // micro_batch_per_replica x Gz x Gd is used instead (so every grid gets the same per-rank
  // micro-batch, as Megatron's "micro-batch size" means).
  int64_t micro_batch = 0;
  int64_t micro_batch_per_replica = 0;
  // Or per data-parallel group, divided over Z (AxoNN's --micro-batch-size: Megatron-AxoNN gives
  // each depth rank micro_batch_size / Gz sequences): the whole job's is this x Gc·Gd, and a grid
  // whose Gz does not divide it is rejected as not dividing.
  int64_t micro_batch_per_data_group = 0;
  // Neither given (both 0): the planner chooses it per grid (micro_batch_candidates: every
  // per-replica micro-batch dividing global_batch / (Gz x Gd), and with it the accumulation
  // count), the fastest that fits; Estimate::micro_batch says which. `tetrad plan` searches when
  // no --micro-batch is given; the trainer's --grid auto does not (it runs the config's).
  bool search_micro_batch = false;
  int seq = 0;
  Precision precision = Precision::FP32;
  Recompute recompute = Recompute::None;
  int zero = 0;                // ZeRO stage over the data axis: 0, 1 (optimizer), 2 (+ gradients)
  Overlap overlap = Overlap::None;
  Schedule schedule = Schedule::OneFOneB;  // parallel.schedule (pipeline grids)
  int virtual_stages = 1;                  // parallel.virtual_stages: chunks per stage (interleaved)
  std::string pipeline_layers = "even";    // parallel.pipeline_layers: the layer split
  // The model's settings that size its buffers (what the trainer passes in ParallelOptions):
  // parallel.prefetch_depth and cache_gathered_weights (Z gather slots), parallel.dp_bucket_mb
  // (staged data-parallel buckets), parallel.sparse_embedding_grad. Only the memory reads them.
  parallel::OverlapOptions overlap_switches;
  bool sparse_embedding_grad = true;
  bool sequence_shard = false;  // parallel.sequence_shard: the stream split over Y (memory only)
  MemoryModel memory_model = MemoryModel::Tetrad;
  // Bytes per element on the wire of the gradients' collectives (docs/planner.md, "The
  // gradients' collectives: their precision"): the reduce-scatter over Z of the layers' weight
  // gradients, and the data-parallel reduction (all-reduce, or ZeRO's reduce-scatter) with the
  // replicated vectors. 0: the run's precision (2 in bf16, 4 in fp32). Tetrad's trainer reduces
  // its fp32 gradients in fp32 unless train.grad_comm_precision = "bf16" (plan_input_of and
  // `tetrad plan` set 4 or 2); Megatron-LM accumulates and all-reduces in fp32 under bf16
  // (accumulate_allreduce_grads_in_fp32, forced by its arguments.py), which AxoNN's runs keep.
  int z_grad_comm_bytes = 0;
  int dp_grad_comm_bytes = 0;
  // Bytes per element of the activations' sums and gathers over X and Y (the layers', the
  // embedding's, the logits'). 0: the run's precision (2 in bf16: Megatron-LM and AxoNN send bf16
  // activations). Tetrad's trainer sums its GEMMs' fp32 outputs in every precision
  // (parallel_linear.cpp): plan_input_of and `tetrad plan` set 4.
  int tensor_comm_bytes = 0;
  int ranks = 1;
  bool allow_pipeline = true;  // plan Gp > 1 grids
  bool allow_context = true;   // plan C > 1 grids (a published run without context parallelism: false)
  CpComm cp_comm = CpComm::Auto;
  AttentionKernel attention_kernel = AttentionKernel::Fused;
  // TorchTitan's FSDP shards the parameters over data x context (its dp_shard x cp mesh): the Z
  // gathers and reduce-scatters run over Z x C and the weights are stored 1/(Gz Gc). Off (tetrad,
  // the default): weights are replicated over C like over D, gradients reduced over D x C.
  bool shard_over_context = false;
  // The expert-parallel axis E of a mixture of experts (planner.hpp, the mixture-of-experts terms): experts sharded
  // over E ranks folded over the data and context ranks (E divides Gc x Gd and the expert count),
  // tokens dispatched to them by all-to-all. 1: every rank holds every expert (a dense model's
  // only value). plan() searches every E of each grid for a mixture of experts.
  int expert_parallel = 1;
  void validate() const;
};

// How the attention core's FLOPs are counted (model/flops.hpp): Causal (half the scores; MFU,
// HFU) or Full (every score; the published rows' count).
using tetrad::AttentionFlops;

// FLOPs of one optimizer step of the whole job (forward + backward; multiply-add = 2):
//   model FLOPs = tokens · (6·N_matmul + c·12·L·A·S)   with c = 1/2 (Causal) or 1 (Full; PaLM
//     appendix B, equal to Narayanan et al.'s 72·B·S·L·H²·(1 + S/(6H) + V/(12·L·H)) for GPT
//     blocks with FFN = 4H, and to the trainer's flops_per_token)
//   hardware FLOPs add what recomputation executes again: full: one more forward of every block
//     (2·N_block + c·4·L·A·S per token; Full gives 96·B·S·L·H²·(1 + S/(6H) + V/(16·L·H)));
//     selective: the attention core's forward (c·4·L·A·S per token).
double model_flops_per_step(const ModelConfig& m, int64_t sequences, int seq,
                            AttentionFlops a = AttentionFlops::Causal);
double hardware_flops_per_step(const ModelConfig& m, int64_t sequences, int seq, Recompute r,
                               AttentionFlops a = AttentionFlops::Causal);

// Pipeline bubble with p stages, m micro-batches and v chunks per stage, as a fraction of the
// ideal pipeline time: (p - 1) / m for 1F1B (v = 1), (p - 1) / (v m) interleaved (the trainer's
// schedules, parallel/pipeline_schedule.hpp).
double bubble_fraction(int p, int m, int v = 1);
// The layer split the trainer runs for this input on a grid with g.p() stages:
// parallel.pipeline_layers resolved by the trainer's own function (parallel/layer_split.hpp), with
// the plan's sequence length. Every place the planner needs stage layers goes through here.
parallel::LayerSplit layer_split_of(const PlanInput& in, const GridShape& g);
// Layers each stage (0..p-1) holds under `split` (the sum over its chunks); and the most of them.
std::vector<int> stage_layer_counts(const parallel::LayerSplit& split, int p);
int stage_layer_count(const parallel::LayerSplit& split, int p);
// The even split's fullest stage (stage 0: the first L % V virtual stages take a layer more).
int stage_layer_count(int n_layer, int p, int v = 1);

// One optimizer step's pipeline, given each op's duration on its stage: the trainer's schedule
// (parallel::pipeline_schedule) run by parallel::simulate_pipeline, so unequal stages (the head on
// the last, the embedding on the first, an uneven split) give the trainer's bubble. Plans with
// very many ops (p·(2·m·v·p) above 2^20: thousands of ranks) use the closed form instead:
// busiest stage x (1 + (p - 1)/(v m)), which is the simulation's result for equal stages.
struct PipelineTime {
  double makespan = 0;  // first forward to last backward
  double busiest = 0;   // the busiest stage's busy time (its compute and exposed communication)
  int busiest_stage = 0;
  bool simulated = false;
};
PipelineTime pipeline_time(parallel::PipelineSchedule s, int p, int m, int v,
                           const std::function<double(int stage, const parallel::PipeOp& op)>& op_seconds);

// Extra seconds a compute phase of `compute` seconds takes when a collective of `comm` seconds
// runs beside it holding a fraction f of the compute units (docs/planner.md, "Overlap
// contention"): while both run the compute proceeds at 1 - f of its rate; the pair takes
// comm if the slowed compute still fits inside it, else compute + f·comm; minus the
// uncontended max(comm, compute). 0 when f = 0 or either is 0.
double overlap_contention(double comm, double compute, double f);

// One layer's attention core on one rank for a micro-batch of T tokens per rank (heads split over
// Y, replicated over X), in seconds: its forward and its backward (docs/planner.md, "The attention
// kernel"; planner/attention.cpp). Fused: half of 4·T·S·A/Gy FLOPs forward (causal), twice that
// backward, at peak x attention_efficiency. Materialized: the GEMMs over every score at the
// roofline of one head's [S, S] x [S, d] product, and the softmax's and dropout's passes.
struct AttentionSeconds {
  double fwd = 0, bwd = 0;
};
AttentionSeconds attention_core_seconds(const PlanInput& in, const Machine& mach, double T, int gy);

// Where an axis's groups sit on nodes.
struct Placement {
  int group_size = 1;
  int nodes = 1;           // distinct nodes the group of rank 0 spans
  int per_node = 1;        // group members per node (group_size / nodes)
  double bandwidth = 0;    // bytes/s each ring edge gets
  double latency = 0;      // seconds per ring step
  double intra_latency = 0;  // seconds per step inside a node (the tree all-reduce's chain)
  // Above the node (machine.topology, network.hpp): groups the ring's members sit in, groups
  // the whole job fills, the fraction of the ring's inter-node edges that cross groups, and
  // whether the groups' egress, not the nodes' NICs, set `bandwidth`.
  int groups = 1, job_groups = 1;
  double cross_fraction = 0;
  bool topology_limited = false;
  // Measured per collective (machine file's [[network.measured]], groups inside one node):
  // index = Op (all-reduce, all-gather, reduce-scatter); 0 = use bandwidth/latency above.
  double op_bandwidth[3] = {0, 0, 0}, op_latency[3] = {0, 0, 0};
};
// Which pipeline op runs a per-micro-batch collective.
enum class MbAt { FirstFwd, LastFwd, LastBwd, EveryOp };
// Where the group over `axes` (one axis, or parallel::token_axes()) of rank 0 sits.
Placement place(const GridShape& g, AxisSet axes, const Machine& m);
// Where the group of these ranks sits (a group no AxisSet names: the expert-data group).
Placement place_ranks(const std::vector<int>& members, const GridShape& g, const Machine& m);

// Ring algorithms (n = bytes of the buffer per rank: the full buffer of an all-reduce, the
// output of an all-gather, the input of a reduce-scatter):
//   all-reduce      2(g-1)·α + 2(g-1)/g · n/β; across nodes the smaller of that and NCCL's
//                   tree (tree_allreduce_seconds, network.hpp: log2(nodes) latency)
//   all-gather      (g-1)·α + (g-1)/g · n/β      reduce-scatter the same
//   send/recv       α + n/β
//   all-to-all      priced by alltoall_seconds (below) (intra- and inter-node shares)
enum class Op { AllReduce, AllGather, ReduceScatter, SendRecv, AllToAll };
const char* op_name(Op op);
double collective_seconds(Op op, double bytes, const Placement& pl);

struct CollectiveCost {
  std::string what;      // "fwd all-reduce of qkv output"
  AxisSet axis = Axis::X;  // the group's axes (axis.name(): "x" ... "zd")
  std::string group;     // a group no AxisSet names (the expert axis: "e", "ed"); "" = axis.name()
  std::string group_name() const { return group.empty() ? axis.name() : group; }
  Op op = Op::AllReduce;
  double bytes = 0;      // per rank per call
  double calls = 0;      // per step, on the slowest stage
  double seconds = 0;    // per step: calls x one call's time
  double exposed = 0;    // per step, after overlap
  bool inter_node = false;
  int groups = 1;              // topology groups (dragonfly groups, fat-tree leaves) it spans
  bool topology_limited = false;  // its bandwidth set by the groups' egress (network.hpp)
};

// Bytes per rank (the fullest pipeline stage): what the model allocates there
// (parallel::model_memory, memory_model.hpp), grouped. weights: the fp32 parameters (the master
// copy in bf16) and the bf16 weight copy; grads: fp32; optimizer: Adam's two fp32 moments;
// gathered: the Z all-gather slots (fp32 and bf16); staging: gradient blocks, the reduce-scatter
// landing buffer, ZeRO's pieces, data-parallel buckets, sparse embedding rows; activations: the
// activation buffer (bf16 where bf16 activations are stored, recompute applied) and the
// pipeline's stashes of the micro-batches in flight.
struct MemoryBreakdown {
  double weights = 0, grads = 0, optimizer = 0, gathered = 0, staging = 0, activations = 0;
  double total() const { return weights + grads + optimizer + gathered + staging + activations; }
};

struct Estimate {
  GridShape grid;
  int expert_parallel = 1;  // E (a mixture of experts; 1 for a dense model)
  bool valid = false;
  std::string reject;      // why not valid: "does not divide: ..." / "does not fit: ..."
  bool trainable = false;  // the trainer can run this grid (Gp = 1 unless it takes a P axis)
  int64_t micro_batch = 0;   // sequences per micro-batch, whole job
  int64_t micro_batches = 0; // per step (train.grad_accum)
  int64_t tokens_per_rank = 0;  // per micro-batch (a sequence's S / Gc with a context axis)
  CpComm cp_comm = CpComm::Auto;  // C > 1: the exchange the estimate prices (never Auto)
  // per step, whole job, causal attention half (MFU, HFU); a mixture of experts' ACTIVE FLOPs
  // (the k experts a token is routed to and the router, not every expert's)
  double model_flops = 0, hardware_flops = 0;
  double model_flops_full = 0, hardware_flops_full = 0;  // the same with attention in full (the
                                                         // published rows' count, AttentionFlops::Full)
  double compute = 0;        // seconds per step on the slowest stage, no bubble
  double compute_gemm = 0, compute_attention = 0;  // of which GEMMs (all three passes), attention
  double contention = 0;     // seconds per step the overlapped collectives cost the compute
  double comm_total = 0;     // seconds per step of communication before overlap
  double comm_exposed = 0;
  double bubble = 0;
  double optimizer = 0;
  double step = 0;
  double tokens_per_s = 0, mfu = 0, hfu = 0;  // mfu/hfu against peak x ranks
  MemoryBreakdown memory;
  std::string dominant;      // "compute" | "bubble" | "comm x" | ...
  std::vector<CollectiveCost> collectives;
  nlohmann::json to_json() const;
};

// e's four FLOP counts for in (global batch, sequence, recomputation): causal and in full.
void set_flop_counts(Estimate& e, const PlanInput& in);

// Memory per rank for a grid with its expert fold E (g.e(), or in.expert_parallel where g has
// none; moe_plan.cpp): memory_of_grid on g at that E, so the experts' weights, gradients and
// optimizer states are 1/E of E = 1's, ZeRO over the expert-data group Gc Gd / E, with the expert
// exchange's scratch (its dropless worst case). What the trainer's memory check calls.
MemoryBreakdown memory_per_rank(const PlanInput& in, const GridShape& g);
// parallel::model_memory of the trainer's model on g as given (g.e() included) for this input
// (micro-batch, sequence, precision, recompute, ZeRO, schedule, overlap switches), the most of
// the first, the last and the fullest pipeline stage. Throws the model's Error where g does not
// divide the model. (MemoryModel::Reference: the textbook layout instead, every expert.)
MemoryBreakdown memory_of_grid(const PlanInput& in, const GridShape& g);
// The same from the model's own byte counts (one rank's parallel::ModelMemory), grouped as above.
MemoryBreakdown memory_breakdown(const parallel::ModelMemory& m);
// The ParallelOptions the trainer builds for this input (precision, recompute, ZeRO, stages,
// split, overlap switches): what the memory formula sizes.
parallel::ParallelOptions model_options(const PlanInput& in);
// Elements of the trainer's activation buffer for one micro-batch of `tokens` tokens on a rank
// of grid g, fp32, no recomputation: computed from the model's activation spec list
// (parallel/activation_layout.hpp: kLayerActs for each layer of the fullest stage, kGlobalActs),
// so on a grid without a pipeline axis it is what the model allocates.
int64_t trainer_activation_elements(const ModelConfig& m, const GridShape& g, int64_t tokens);
// One layer's elements of it that `mode` keeps per layer (the spec's ActKeep), fp32.
int64_t layer_activation_elements(const ModelConfig& m, const GridShape& g, int64_t tokens,
                                  Recompute mode);
// Parameters a rank stores (ShardPlan's local_total for Gp = 1), on the fullest stage.
int64_t local_parameters(const ModelConfig& m, const GridShape& g);

// Why g cannot run this model/batch ("" if it can): divisibility only.
std::string divisibility_problem(const PlanInput& in, const GridShape& g);
// One grid, fully costed. Invalid grids come back with valid = false and the reason.
Estimate estimate(const PlanInput& in, const GridShape& g, const Machine& m);
// The whole-job micro-batches a search tries on g (in.search_micro_batch), ascending:
// b x Gz x Gd for every b dividing global_batch / (Gz x Gd); empty when Gz x Gd does not divide
// the global batch.
std::vector<int64_t> micro_batch_candidates(const PlanInput& in, const GridShape& g);
// One grid at the fastest micro-batch among micro_batch_candidates: each estimated with that
// micro-batch fixed, ascending until one does not fit (memory grows with it), the fastest valid
// kept; when none is valid, the smallest candidate's reason. estimate() calls it when
// in.search_micro_batch.
Estimate estimate_searching_micro_batch(const PlanInput& in, const GridShape& g, const Machine& m);
// Every grid of in.ranks: valid ones by predicted step time (fastest first), then the rejected.
// A machine without a rate for in.precision throws require_rate's error (no grid could run).
std::vector<Estimate> plan(const PlanInput& in, const Machine& m);
// The machine has a compute rate for precision p, or Error naming the file, the key to add
// ([compute] peak_bf16_tflops / peak_fp32_tflops) and the command that measures it.
void require_rate(const Machine& m, Precision p);
std::string missing_rate_message(const Machine& m, Precision p);

// Whether the trainer accepts a pipeline axis (its grid parser takes "x,y,z,p,d").
bool trainer_supports_pipeline();
// The trainer's grid string for g: "x,y,z,d" (or "x,y,z,p,d" once the trainer takes P); the named
// form ("c=2,d=2,e=2") where g has a context axis or an expert fold.
std::string trainer_grid_string(const GridShape& g);

// ---- estimate's collectives (planner/collectives.cpp): each collective of a layer, of a
// micro-batch and of a step with its bytes, calls and per-call seconds on its placement, by the
// axis it runs over, and their seconds summed by class (what each class can hide behind).

// Parameters in the GEMMs of one block, and of the output head.
struct Sizes {
  double H, L, F, V, S_max, QKV, FW;
  // A mixture of experts: n_experts, experts_per_token (0, 0: dense) and the plan's E.
  double experts = 0, topk = 0, ep = 1;
  double A;   // the attention width: n_head * head_dim (H unless the family's heads are wider)
  double KV;  // one of k, v's width (GQA: kv heads x head_dim)
  double qk_norm_vectors = 0;  // per layer: q_norm and k_norm (2 head_dim, replicated), or 0
  // The family's vectors (model/family.hpp): a norm's (weight, or weight and bias), whether the
  // layers have biases (all of them; or only q|k|v's), whether positions are a learned table.
  int norm_vectors;
  bool biases, qkv_bias, learned_positions, tied;
  // A mixture of experts' shared expert (model.shared_expert_ffn; 0: none): a SwiGLU MLP of width
  // Fs every token goes through, and its sigmoid gate's [1, H] weight.
  double Fs = 0;
  double mlp() const { return FW * H + H * F; }  // the dense MLP's, or one expert's
  double shared() const { return Fs > 0 ? 3 * Fs * H + H : 0.0; }
  // What one token multiplies with in a block (a mixture of experts: its k experts, the router
  // and the shared expert).
  double block_matmul() const {
    return QKV * H + A * H + (experts > 0 ? topk * mlp() + experts * H + shared() : mlp());
  }
  // What a rank stores of a block before Z shards it (a mixture of experts: its 1/E of them; the
  // shared expert whole).
  double block_stored() const {
    return QKV * H + A * H + (experts > 0 ? experts / ep * mlp() + experts * H + shared() : mlp());
  }
  double head() const { return V * H; }
};
Sizes sizes(const ModelConfig& m, int ep = 1);  // planner/block_terms.cpp

// Seconds of one layer's GEMMs on one rank, by pass, and of the head's three GEMMs. The local
// weight shapes follow the trainer's layout: normal layers (q|k|v, MLP up with its gate) hold
// [n_out, k_in] = [N/Gy, H/Gx], transposed ones (attention output, MLP down) [H/Gx, N/Gy]; the
// head [V/Gy, H/Gx]. Each pass is the trainer's own call (parallel/parallel_linear.cpp): forward
// C[T, n_out] = A W^T (nt), input gradient C[T, k_in] = dY W (nn), weight gradient
// C[n_out, k_in] = dY^T A (tn, reduced over the T tokens), each at its variant's efficiency.
struct GemmTimes {
  double fwd = 0, din = 0, dw = 0, head_fwd = 0, head_bwd = 0;
};
GemmTimes block_gemm_times(const Sizes& s, const GridShape& g, double T, const Machine& mach, bool bf16);

// When a collective runs, which decides what it can hide behind.
enum CommKind { kExposed = 0, kZFwd = 1, kZBwd = 2, kDIn = 3, kData = 4, kRingFwd = 5, kRingBwd = 6 };

struct CommItem {
  CollectiveCost c;
  int kind;  // CommKind: 0 exposed always, 1 z-gather fwd, 2 z bwd, 3 dIn bwd, 4 data (per step),
             // 5, 6 the context ring's steps (hidden behind the attention's blocks, fwd / bwd)
  double per_layer;  // calls per layer per micro-batch (0: per micro-batch or per step)
  // Per-micro-batch items: which pipeline op runs it (the embedding's on the first virtual
  // stage's forward, the head's on the last's forward or backward, the point-to-point
  // transfers once per op).
  MbAt at = MbAt::LastFwd;
};

// The grid's collectives in the order the report lists them, each with its per-call seconds.
class Collectives {
 public:
  // Where each group sits: every axis, and the token-splitting axes together.
  Collectives(const GridShape& g, const Machine& mach) {
    for (AxisSet a : {AxisSet(Axis::X), AxisSet(Axis::Y), AxisSet(Axis::C), AxisSet(Axis::Z),
                      AxisSet(Axis::P), AxisSet(Axis::D), parallel::token_axes(), shard_axes(g, false),
                      shard_axes(g, true), grad_axes(g), replicated_axes(g)})
      pl_[a.bits()] = place(g, a, mach);
  }
  // An item costed by its caller (the expert axis's all-to-all, planner/moe_plan.cpp).
  void add_costed(const CommItem& it) { items_.push_back(it); }
  void add(const char* what, AxisSet axes, Op op, double bytes, double calls, int kind,
           bool per_layer, MbAt at = MbAt::LastFwd) {
    const Placement& pl = pl_.at(axes.bits());
    if (pl.group_size <= 1 || bytes <= 0 || calls <= 0) return;
    CommItem it;
    it.c.what = what;
    it.c.axis = axes;
    it.c.op = op;
    it.c.bytes = bytes;
    it.c.calls = calls;
    it.c.inter_node = pl.nodes > 1;
    it.c.groups = pl.groups;
    it.c.topology_limited = pl.topology_limited;
    it.c.seconds = collective_seconds(op, bytes, pl);  // per call for now
    it.kind = kind;
    it.per_layer = per_layer ? calls : 0;
    it.at = at;
    items_.push_back(it);
  }
  const std::vector<CommItem>& items() const { return items_; }
  // The groups a context axis changes (each the plain axis when Gc = 1, so its name and cost are
  // those of a grid without C): the weight shards' (Z, or Z x C with shard_over_context), the
  // Z shards' gradients' (D, or D x C: weights are replicated over C), the replicated vectors'
  // (Z x D, or Z x C x D).
  static AxisSet shard_axes(const GridShape& g, bool over_context) {
    return over_context && g.c() > 1 ? AxisSet{Axis::C, Axis::Z} : AxisSet(Axis::Z);
  }
  static AxisSet grad_axes(const GridShape& g) {
    return g.c() > 1 ? AxisSet{Axis::C, Axis::D} : AxisSet(Axis::D);
  }
  static AxisSet replicated_axes(const GridShape& g) {
    return g.c() > 1 ? parallel::token_axes() | Axis::C : parallel::token_axes();
  }

 private:
  std::vector<CommItem> items_;
  std::map<unsigned, Placement> pl_;  // by AxisSet::bits()
};

// Whether the X ranks share attention's sequences (the trainer's DenseBlock::sequence_share):
// each X rank runs its 1/Gx of a micro-batch's T / seq sequences and the rows are all-gathered
// over X, where Gx > 1 divides them and there is no context axis; else every X rank runs all.
bool x_shares_sequences(const PlanInput& in, const GridShape& g, double T);

// Tensor parallelism (X and Y): the layers' norms and linear layers, per layer.
void add_tensor_layer_comm(Collectives& c, const PlanInput& in, const GridShape& g, const Sizes& s, double T);

// Weight sharding (Z): the layer's blocks gathered before forward and again before backward;
// gradient blocks reduce-scattered after backward.
void add_sharded_layer_comm(Collectives& c, const PlanInput& in, const GridShape& g, const Sizes& s);

// Per micro-batch: embedding (fwd all-reduce over Y), head (fwd over X of the logits, bwd dIn
// over Y), cross-entropy (max and sums over Y), final norm, top blocks over Z.
void add_top_comm(Collectives& c, const PlanInput& in, const GridShape& g, const Sizes& s, double T);

// Pipeline (P): activations forward and their gradients back, [T, H/Gx] split over Y so each rank
// sends its 1/Gy (Megatron's scatter-gather). With v chunks per stage a micro-batch crosses every
// stage boundary v times each way.
void add_pipeline_comm(Collectives& c, const PlanInput& in, const GridShape& g, const Sizes& s, double T);

// Data parallelism (D, Z x D), per step: Z shards all-reduced over D (ZeRO 1/2: reduce-scatter +
// all-gather, same ring volume); replicated vectors over Z x D; with a context axis over D x C and
// Z x C x D (shard_over_context: the shards over D alone).
void add_data_comm(Collectives& c, const PlanInput& in, const GridShape& g, double matrices, double vectors);

// Context parallelism (C > 1, planner/context.cpp), per layer: keys and values of the rank's
// chunks exchanged over C by `method` (Ring or AllGather; T = tokens a rank holds, S / Gc of each
// of its sequences). Ring: Gc - 1 send/recv steps of the rank's K|V block forward (kRingFwd),
// of K|V and dK|dV backward (kRingBwd), each hidden behind the attention of one block. AllGather:
// K|V all-gathered before the attention (again in the recomputed forward), dK|dV reduce-scattered
// after the backward, exposed.
void add_context_layer_comm(Collectives& c, const PlanInput& in, const GridShape& g, const Sizes& s,
                            double T, CpComm method);
// The exposed seconds of a layer's ring steps (per micro-batch): each of the Gc - 1 steps of a
// pass hides behind the attention on one block (the pass's attention seconds / Gc).
double ring_exposed(double ring_fwd, double ring_bwd, double attn_fwd_s, double attn_bwd_s, int c);
// Bytes per rank the exchange holds beside the activations (C > 1), local_batch sequences of
// local_len tokens on a rank: the trainer's own buffers (parallel::context_exchange_bytes, what
// ContextAttention allocates and the memory formula counts) for in.cp_comm (Ring; else the
// all-gather's, as the trainer's formula takes an unset parallel.cp_comm).
double context_gather_bytes(const PlanInput& in, const GridShape& g, int64_t local_batch,
                            int64_t local_len);
// The grid as the parallel layer's functions (divisibility, memory) see it: C folded away (each
// rank runs its S / Gc tokens of a sequence; shard_over_context folds C into Z).
GridShape without_context(const GridShape& g, bool shard_over_context);

// Seconds of the collectives by class: per layer per micro-batch, per micro-batch, per step.
struct CommSums {
  double fwd_ar = 0, z_fwd = 0, z_bwd = 0, din = 0, per_mb_total = 0, step_comm = 0;
  double ring_fwd = 0, ring_bwd = 0;  // per layer per micro-batch (kRingFwd, kRingBwd)
  double mb_at[4] = {0, 0, 0, 0};  // per-micro-batch communication by MbAt
  double layer_total() const { return fwd_ar + z_fwd + z_bwd + din + ring_fwd + ring_bwd; }
};
CommSums comm_sums(const std::vector<CommItem>& items);

// ---- the mixture-of-experts terms (planner/moe_plan.cpp; issue 32; docs/planner.md, "Mixture of experts"):
// the expert-parallel axis E folded over the context and data ranks (Megatron-Core's parallel
// folding: rank j of a C x D group, c fastest, is expert rank j mod E of expert-data rank j / E),
// its all-to-all (dispatch and combine, forward and backward), the expert gradients' reduction
// over the expert-data group (Gc Gd / E ranks), the experts' memory per rank, and E in the grid
// search. FLOPs are the ACTIVE ones (Sizes::block_matmul: k experts and the router per token),
// so MFU is on active FLOPs.
//
// Not modelled: routing imbalance in time (every expert gets its average share of the tokens:
// T k / n_e rows each; a dropless run with uneven load is slower than predicted; the memory
// formula does size the exchange for the worst case), the capacity factor's drops, the experts'
// own X and Y all-reduces (k rows per token where the dense MLP's collectives count one; the
// experts' memory and GEMMs are divided by Gx Gy as the trainer splits them). The all-to-all is
// priced exposed: the trainer does not overlap it with computation yet.
// The plan's E on g: g.e() where the grid names one, else in.expert_parallel.
int expert_fold_of(const PlanInput& in, const GridShape& g);
// Why that E cannot run on g ("" if it can): a dense model has E = 1 only; for a mixture of
// experts E divides Gc x Gd and model.n_experts; g.e() and in.expert_parallel, both > 1, agree.
std::string expert_parallel_problem(const PlanInput& in, const GridShape& g);
// The E plan() tries on g: the run's own where it fixes one (g.e() or in.expert_parallel > 1);
// else {1} for a dense model and every E dividing both Gc x Gd and n_experts.
std::vector<int> expert_parallel_candidates(const PlanInput& in, const GridShape& g);
// g estimated at each candidate E (plan()'s search; each is a row of the ranking).
std::vector<Estimate> estimate_expert_axis(const PlanInput& in, const GridShape& g, const Machine& m);
// "1x1x2x1x4 e2": grid_label with E > 1 appended.
std::string plan_label(const Estimate& e);

// Ranks of rank 0's expert group (the first E members of its C x D group) and of its
// expert-data group (every E-th member).
std::vector<int> expert_group_ranks(const GridShape& g, int ep);
std::vector<int> expert_data_group_ranks(const GridShape& g, int ep);

// Seconds of one all-to-all in which each member sends `bytes` (its whole send buffer, 1/g of it
// to each member, itself included): the (g - 1)/g that leaves the rank, the share to members on
// its node at the node's per-rank bandwidth (a measured all-gather row of the machine file, same
// per-rank volume, where it has one) and the share to other nodes through the node's NICs, shared
// by every rank of the node (all of them are in some expert group at once); the two run at once,
// so the slower sets the time; plus (g - 1) message latencies, inter-node ones when it spans nodes.
double alltoall_seconds(double bytes, const std::vector<int>& members, int world, const Machine& m);

// Expert weights a rank stores for Ls layers: n_experts / E experts, split over X, Y and Z.
double expert_matrices(const Sizes& s, const GridShape& g, double Ls);

// Per layer per micro-batch: the rows' all-to-alls over E as the trainer runs them (forward:
// dispatch and combine; backward: the dispatch recomputed, the gradients' dispatch and combine;
// full recomputation: the forward's two again), T x k x H activations per rank each, and before
// each pass the exchange of row counts per expert; all exposed (not overlapped yet). Per step:
// the expert gradients all-reduced over the expert-data group (Gc Gd / E ranks; the dense
// gradients keep add_data_comm's group).
void add_moe_comm(Collectives& c, const PlanInput& in, const GridShape& g, const Sizes& s, double T,
                  double Ls, const Machine& m);

// The experts' bytes per rank at E in the textbook layout (MemoryModel::Reference; tetrad's is
// parallel::model_memory's): weights, gradients and optimizer states of n_experts / E experts
// (ZeRO over the expert-data group Gc Gd / E), the Z gather slots.
// memory_per_rank (Reference) = memory_of_grid + expert_memory(E) - expert_memory(1).
MemoryBreakdown expert_memory(const PlanInput& in, const GridShape& g, int ep);

}  // namespace tetrad::planner
