// The settings of the parallel model (ParallelTransformer) that the trainer's config, the planner
// and the benchmark share: activation recomputation, the communication overlap switches and the
// rest of ParallelOptions. Plain values, no MPI: the planner costs exactly these types.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "tetrad/backend/ops.hpp"
#include "tetrad/parallel/gemm_layouts.hpp"

namespace tetrad::backend {
class Backend;
}

namespace tetrad::parallel {

// Activation recomputation (train.recompute): what the forward keeps for the backward.
//   None       every layer's activations are kept.
//   Selective  the attention internals (attention output and softmax log-sum-exp, per head) are
//              not kept: one layer's worth of scratch; the backward recomputes the attention from
//              the stored q|k|v (no communication, no GEMM: Megatron's "selective").
//   Full       per block only its input is kept (the previous block's output); the backward
//              recomputes the block's forward (GEMMs and their all-reduces included) into one
//              layer's scratch before its backward.
// Every mode gives bit-identical results: the recomputation repeats the same operations on the
// same inputs (deterministic kernels, static OpenMP schedules).
enum class Recompute { None, Selective, Full };
Recompute parse_recompute(const std::string& text);  // "none" | "selective" | "full"
const char* recompute_name(Recompute mode);

// How attention on the context axis (Gc > 1) reaches the other C ranks' keys and values
// (parallel/context_attention.hpp): AllGather (all-gathered keys and values, dK/dV
// reduce-scattered back) or Ring (blocks passed peer to peer around the C group, overlapped with
// the attention on the blocks already present and merged by their log-sum-exp; dK/dV travel the
// ring back to their owners). parallel.cp_comm = "allgather" | "ring".
enum class ContextComm { AllGather, Ring };

// Each switch only changes when a collective runs, never what it computes: the same messages
// with the same sizes and the same GEMMs, so results are bit-identical to all switches off
// (tests/mpi/test_overlap_mpi.cpp). forward_chunks is the exception: its GEMMs on row chunks
// round differently from one GEMM (oneDNN chooses kernels by shape), identical within fp32
// rounding only.
struct OverlapOptions {
  bool backward_allreduce = false;   // dIn all-reduce runs while the dW GEMM computes
  bool reduce_scatter = false;       // dW reduce-scatter over Z runs during earlier layers
  int prefetch_depth = 0;            // Z all-gathers issued this many layers ahead
  bool prefetch_across_steps = false;  // the next step's first gathers start during the optimizer
  bool cache_gathered_weights = false;  // every layer's gathered weights kept for the whole step
  bool dp_overlap = false;           // data-parallel buckets start during the last backward
  double dp_bucket_mb = 0;           // bucket size (0: one bucket per tensor, in place)
  int forward_chunks = 1;            // forward GEMM + all-reduce in this many row chunks
  bool progress_thread = false;      // a helper thread drives MPI progress during kernels

  static OverlapOptions all_off() { return {}; }
  std::string summary() const;
};

// ZeRO over the data axis (parallel.zero), on top of whatever Z already shards:
//   0  every D replica keeps the whole local shard of parameters, gradients and Adam moments;
//      gradients are all-reduced over D.
//   1  the Adam moments are sharded over D: each tensor's local shard is cut into Gd pieces
//      (rank d owns piece d, ceil(n / Gd) elements, the last one shorter); gradients are
//      reduce-scattered over D at the end of the step, each D rank updates its piece, and the
//      updated pieces are all-gathered over D.
//   2  as 1, and the gradients too: only the piece is kept (grads() has optimizer_state_size()
//      elements); each layer's gradient is reduce-scattered over Z then D as soon as its
//      backward is done, every micro-batch.
//
// overlap: the communication overlap switches (OverlapOptions above). dp_overlap is turned off with
// ZeRO >= 1 and with Gp > 1 (see the constructor): their gradients are reduced in
// reduce_gradients() (ZeRO 2: per layer) instead of in data-parallel buckets.
struct ParallelOptions {
  Recompute recompute = Recompute::None;
  int zero = 0;
  int virtual_stages = 1;  // pipeline chunks per stage (interleaved schedule; Gp > 1 only)
  // With Z > 1: the token embedding's gradient is exchanged as the rows the micro-batch touched
  // (an all-gather of N x C/Gx values and N ids over Z) instead of a reduce-scatter of the whole
  // V/Gy x C/Gx block, when that moves less (Gz N < V/Gy); the head's dense part (tied) starts
  // its reduce-scatter right after the head's backward. Gp = 1 and ZeRO < 2 only.
  bool sparse_embedding_grad = true;
  OverlapOptions overlap = OverlapOptions::all_off();
  // Largest message of one ZeRO reduce-scatter over D (larger ones go in chunks): bounds Open
  // MPI's temporary, twice the message per call (docs/parallel.md, "Memory per rank"). Results
  // do not depend on it; tests make it tiny to run many chunks.
  int64_t reduce_scatter_chunk_bytes = int64_t(4) << 20;
  // parallel.pipeline_layers: how the layers split into the Gp x virtual_stages virtual stages
  // ("even", "balanced" or a comma list; layer_split.hpp). Gp > 1 only.
  std::string pipeline_layers = "even";
  // parallel.cp_comm: the context axis's exchange of keys and values (ContextComm above).
  ContextComm cp_comm = ContextComm::AllGather;
  // With the ring and a document mask: skip the (query chunk, key chunk) pairs the mask hides
  // wholly (context_ring.cpp; the same bits either way). Off only to compare.
  bool cp_skip_masked_pairs = true;
  // (Last, so the positional initialisers {recompute, zero, virtual_stages} keep working.)
  // Where the model computes (its memory, queue and op table); null: the CPU backend.
  backend::Backend* device = nullptr;
  // GEMM precision of this model (docs/precision.md), passed to every GEMM it calls
  // (GemmArgs::precision): there is no process-wide setting. The trainer, the benchmark and the
  // inference commands set it from their configurations.
  backend::Precision precision = backend::Precision::FP32;
  // Arithmetic of attention's products (QKᵀ, PV and the backward's): FP32, or BF16 (bf16
  // operands, fp32 accumulation and softmax statistics; Capabilities::attention_bf16_products).
  // Unset: it follows `precision` where bf16 attention is the faster one on the backend
  // (Capabilities::attention_bf16_faster: CPUs with AMX), else FP32 (docs/precision.md, "bf16
  // attention"); set, it is forced (BF16 refused where the backend has no bf16 products).
  std::optional<backend::Precision> attention_precision;
  // With precision BF16: the GEMMs read the weights from a bf16 copy of the parameters (written
  // by the optimizer's fused AdamW pass, or cast once after any other change), gathered over Z
  // in bf16 (half the bytes), instead of rounding the fp32 weights at every GEMM call. The same
  // bits either way (rounding a shard then gathering is gathering then rounding); off only to
  // compare the two. Needs Capabilities::gemm_bf16_storage (refused without it).
  bool bf16_weight_copy = true;
  // With precision BF16: the activations that only feed GEMMs (norm outputs, the MLP activation)
  // are written in bf16 by their producers (no fp32 tensor: half their memory), and each
  // gradient entering a linear layer's backward is cast to bf16 once for its two GEMMs. The
  // same bits as rounding at every GEMM (the producers round their fp32 result). Off only to
  // compare.
  bool bf16_activations = true;
  // With bf16_activations, in a dense model: the tensors a block keeps for its backward inside
  // the block (q|k|v, the q/k norms' input, the attention output, the mid-block residual sum,
  // the MLP input projection: ActStore::Bf16Stash, activation_layout.hpp) are kept in bf16 (half
  // their memory; Megatron's and TorchTitan's bf16 runs keep them so), and the backward reads
  // them rounded to bf16. false keeps them in fp32 (as before issue 28's stash): the backward
  // reads the fp32 values, the same bits as rounding at every GEMM. The forward is the same
  // either way.
  bool bf16_stash = true;
  // With bf16_activations: the weight gradient dW = dYᵀ·X runs as an NN product on a transposed
  // bf16 copy of dY (written in the same pass as the plain one, OpTable::
  // cast_transpose_f32_to_bf16) instead of the TN product oneDNN runs slowest (docs/precision.md
  // has the measurements). Sums in another order than TN: equal within fp32 rounding.
  bool bf16_weight_grad_nn = true;
  // With precision BF16: the GEMM layout of each site (gemm_layouts.hpp): Rule (the fixed
  // defaults above: forward NT, dx NN, dw NN on dY16ᵀ) or Tune (timed once at construction on
  // this rank's shapes, rank 0's choice broadcast over the world; collective). Callers resolve
  // train.gemm_layouts = auto with resolve_gemm_layouts; Tune where it cannot apply (fp32,
  // emulated bf16, a backend without GemmArgs::product) runs Rule.
  GemmLayouts gemm_layouts = GemmLayouts::Rule;
  // A plan to run instead (GemmLayoutPlan::to_string's form, sizes may be "*"; tests force every
  // form with it): overrides gemm_layouts; refused where its forms cannot run.
  std::string gemm_layout_plan;
  // train.grad_comm_precision = "bf16": the gradient reduce-scatters over Z, the ZeRO
  // reduce-scatters over D and the data-parallel bucket all-reduces move bf16 (half the bytes);
  // every rank's contribution is rounded to bf16 once and the sums are accumulated in fp32
  // (parallel/bf16_grad_comm.hpp). The gradients stay fp32. Independent of `precision`.
  // Blocking (no overlap for these collectives); refused on NCCL. The small replicated tensors'
  // sums over Z (ZeRO) and the top-level sums over P stay fp32 (docs/precision.md).
  bool grad_comm_bf16 = false;
  // parallel.sequence_shard (Megatron's sequence parallelism in the 3D algorithm's terms,
  // 4d-parallelism.md): the residual stream [N, C/Gx], replicated over Y without it, is split
  // along the tokens over Y (N/Gy rows per rank): the norms and residual adds run on the rank's
  // rows only, and the stored block outputs (what full recomputation keeps, and a pipeline
  // stage's stash) take 1/Gy of the memory. A transposed layer's forward all-reduce over Y
  // becomes a reduce-scatter over Y and the norm's output is all-gathered over Y before the next
  // normal layer; in the backward a normal layer's dIn all-reduce over Y becomes a
  // reduce-scatter and the stream's gradient is all-gathered before a transposed layer's
  // backward: the same bytes. The norm weights' gradients (partial over the rank's rows) are
  // summed over Y. Changes fp32 results at rounding level (the norm weights' gradient sums in
  // another order; a reduce-scatter may sum in another order than the all-reduce for Gy > 2):
  // off by default (docs/parallel.md, "Sequence sharding"). Gy = 1: nothing to shard.
  bool sequence_shard = false;
  // data.document_mask: attention stays inside each document of a packed sequence (block-
  // diagonal causal); data.document_positions: positions (rotary or learned) restart at 0 at
  // each document's first token. Either needs the documents of every batch the model runs
  // (ParallelTransformer::set_documents); the mask needs Capabilities::attention_document_mask.
  bool document_mask = false;
  bool document_positions = false;
};

}  // namespace tetrad::parallel
