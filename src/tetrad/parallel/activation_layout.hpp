// The ParallelTransformer's activation buffer: one spec list of every tensor in it, from which
// both the sizes (activation_sizes: the activation term of the memory formula, model_memory in
// memory_model.hpp, which the planner, the memory fit check and bench read) and the model's views
// (lay_out_activations) are made, so the layout is written once. Pure arithmetic, no allocation.
#pragma once
#include <cstdint>
#include <iterator>
#include <vector>

#include "tetrad/parallel/local_dims.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/parallel/layer_split.hpp"
#include "tetrad/parallel/options.hpp"

namespace tetrad::parallel {

// Activation views, local sizes (LocalDims): N tokens of this rank, Cx = C/Gx hidden slice, QKVy =
// q|k|v of this rank's heads, Ay = n_head hd / Gy attention output slice, QKn / Nqk the q/k norm's
// saved input and statistics, FWy/Fy = MLP slices, Vy =
// vocabulary slice. With bf16 activations (ParallelOptions::bf16_activations) ln1, ln2, fc_act and
// lnf are stored in bf16 only (the *16 views; the fp32 ones are null); the other tensors a layer
// keeps for its backward inside the block (qkv, qk_in, atty, resid_mid, fc: ActStore::Bf16Stash)
// are kept in bf16 too (the *16 views), computed in fp32 in one layer's working copy in the
// shared scratch (the fp32 views) and cast back there before the layer's backward; dout16 / dout16_t hold
// the bf16 copy of the gradient entering a linear layer's backward, as stored and transposed
// ([N, n_out] and [n_out, N], n_out up to the largest layer output; in a mixture of experts at
// least k Cx: the experts' backward keeps its rows' bf16 gradient copies there, expert_mlp.hpp).
// A mixture of experts has no dense MLP: fc, fc_act, dfc and dfc_act take no memory there.
// The work buffers' owners (each uses its own within one call): tmp, dout16 and dout16_t are the
// parallel linear layers' scratch (ParallelOps, parallel_ops.hpp; the loss may leave the head's
// dY there for its backward: VocabParallel) and the MoE block's experts' between them
// (moe_block.hpp), dfc_act the block's (dense_block.hpp); dln, dqkv,
// datty and dfc hold nothing between calls; dresid carries the gradient from part to part.
struct ParallelActivations {
  struct PerLayer {
    float *ln1 = nullptr, *ln1_mean = nullptr, *ln1_rstd = nullptr, *qkv = nullptr,
          *qk_in = nullptr, *qk_rstd = nullptr, *atty = nullptr, *lse = nullptr, *resid_mid = nullptr, *ln2 = nullptr,
          *ln2_mean = nullptr, *ln2_rstd = nullptr, *fc = nullptr, *fc_act = nullptr,
          *resid_out = nullptr;
    uint16_t *ln1_16 = nullptr, *ln2_16 = nullptr, *fc_act16 = nullptr;
    // The bf16 copies of the stashed tensors (ActStore::Bf16Stash; null unless kept in bf16).
    uint16_t *qkv16 = nullptr, *qk_in16 = nullptr, *atty16 = nullptr, *resid_mid16 = nullptr,
             *fc16 = nullptr;
    // A mixture of experts (moe_block.hpp; empty for a dense model): the router's logits
    // [N, E]; the tokens' rows in expert order [N k, C], their gate|up [N k, 2F], SwiGLU
    // [N k, F] and the experts' outputs [N k, C] (up to N k rows: dropless routing fills all).
    // With bf16 activations the SwiGLU is stored in bf16 only (moe_act16, what the experts'
    // down GEMMs read) and ln2 stays fp32 (the router's input: an fp32 router).
    float *router_logits = nullptr, *moe_in = nullptr, *moe_gu = nullptr, *moe_act = nullptr,
          *moe_out = nullptr;
    uint16_t* moe_act16 = nullptr;
    // Its shared expert (model.shared_expert_ffn; empty without): gate|up [N, 2Fs], SwiGLU
    // [N, Fs], output [N, C] and the sigmoid gate's logit [N].
    float *shared_gu = nullptr, *shared_act = nullptr, *shared_out = nullptr,
          *shared_glogit = nullptr;
  };
  std::vector<PerLayer> layer;
  float *emb = nullptr, *lnf = nullptr, *lnf_mean = nullptr, *lnf_rstd = nullptr,
        *logits = nullptr, *losses = nullptr, *tmp = nullptr;
  float *dresid = nullptr, *dln = nullptr, *dqkv = nullptr, *datty = nullptr, *dfc = nullptr,
        *dfc_act = nullptr;
  // With sequence sharding (ParallelOptions::sequence_shard): the residual stream's gradient
  // all-gathered over Y (the input of a transposed layer's backward and of the embedding's), and
  // the landing buffer of a normal layer's input-gradient reduce-scatter; null otherwise.
  float* dfull = nullptr;
  // The mixture of experts' backward work buffers (moe_block.hpp): the gradient of the experts'
  // rows [N k, C] (outputs, then inputs), of their gate|up [N k, 2F] and activation [N k, F].
  float *dmoe_rows = nullptr, *dmoe_gu = nullptr, *dmoe_act = nullptr;
  // ... and of the shared expert's gate|up [N, 2Fs] and activation [N, Fs].
  float *dshared_gu = nullptr, *dshared_act = nullptr;
  uint16_t *lnf16 = nullptr, *dout16 = nullptr, *dout16_t = nullptr;
  int64_t dout16_floats = 0;  // each bf16 gradient copy's size in floats (0 without bf16 acts)

  // Where the regions a pipeline chunk stashes lie (pipeline_chunks.cpp): each layer's slots
  // begin at layer_begin[l] (layer_begin[n_layer]: the end of the layers), and the top-level
  // tensors of the embedding's and the head's ends are each one contiguous range.
  std::vector<float*> layer_begin;
  struct Range {
    float* begin = nullptr;
    int64_t floats = 0;
  };
  Range embedding_end, head_end;
};

// A tensor's row width: floats per token of this rank (LocalDims), One for row statistics.
enum class ActWidth : unsigned char {
  One, Cx, Ay, QKVy, Nhy, Nqk, QKn, FWy, Fy, Vy, MaxLinearOut, E, kC, kFW, kF, sFW, sF, sC, sG
};
// How it is stored: in fp32; in bf16 with bf16 activations (ceil(N n / 2) floats, the bf16 view
// only), else fp32; the same in a dense model but always fp32 in a mixture of experts (ln2, the
// router's input: the router runs in fp32); or only with bf16 activations (absent otherwise); or,
// Bf16Stash, where a layer of a dense model keeps it with bf16 activations (and
// ParallelOptions::bf16_stash), in bf16 in the
// layer's slots (the bf16 view) beside an fp32 working copy in the shared scratch (the fp32 view:
// the block computes and reads it there in the forward, the bf16 copy is cast back into it before
// the layer's backward), else fp32 (the bf16 stored block tensors of Megatron's and TorchTitan's
// bf16 runs; the residual stream's block outputs stay fp32).
enum class ActStore : unsigned char { F32, Bf16WithActs, Bf16WithActsDense, OnlyBf16, Bf16Stash };
// Which layer tensors have memory of their own in every layer (else they share one layer's
// recompute scratch): all but under full recomputation, all but under any recomputation, or
// always, as the block's output (the next block's input; a pipeline chunk's input slot).
enum class ActKeep : unsigned char { UnlessFull, UnlessRecompute, Output };
// Of the top-level tensors: the embedding's output, the head's saved tensors (a chunk with the
// embedding or the head stashes them), or work buffers that hold nothing between calls.
enum class ActPart : unsigned char { Embedding, Head, Work };

using LayerActs = ParallelActivations::PerLayer;
struct LayerActSpec {
  const char* name;
  float* LayerActs::*f32;      // the fp32 view (null with ActStore::OnlyBf16)
  uint16_t* LayerActs::*bf16;  // the bf16 view (ActStore other than F32)
  ActWidth width;
  ActStore store;
  ActKeep keep;
};
struct GlobalActSpec {
  const char* name;
  float* ParallelActivations::*f32;
  uint16_t* ParallelActivations::*bf16;
  ActWidth width;
  ActStore store;
  ActPart part;
};

// One layer's tensors, in buffer order (the kept ones in each layer's slots, the others in the
// shared scratch), as the block computes them.
inline constexpr LayerActSpec kLayerActs[] = {
    {"ln1", &LayerActs::ln1, &LayerActs::ln1_16, ActWidth::Cx, ActStore::Bf16WithActs, ActKeep::UnlessFull},
    {"ln1_mean", &LayerActs::ln1_mean, nullptr, ActWidth::One, ActStore::F32, ActKeep::UnlessFull},
    {"ln1_rstd", &LayerActs::ln1_rstd, nullptr, ActWidth::One, ActStore::F32, ActKeep::UnlessFull},
    {"qkv", &LayerActs::qkv, &LayerActs::qkv16, ActWidth::QKVy, ActStore::Bf16Stash, ActKeep::UnlessFull},
    // The per-head q/k norm's input and statistics (QkNorm; width 0 in other families).
    {"qk_in", &LayerActs::qk_in, &LayerActs::qk_in16, ActWidth::QKn, ActStore::Bf16Stash, ActKeep::UnlessFull},
    {"qk_rstd", &LayerActs::qk_rstd, nullptr, ActWidth::Nqk, ActStore::F32, ActKeep::UnlessFull},
    {"atty", &LayerActs::atty, &LayerActs::atty16, ActWidth::Ay, ActStore::Bf16Stash, ActKeep::UnlessRecompute},
    {"lse", &LayerActs::lse, nullptr, ActWidth::Nhy, ActStore::F32, ActKeep::UnlessRecompute},
    {"resid_mid", &LayerActs::resid_mid, &LayerActs::resid_mid16, ActWidth::Cx, ActStore::Bf16Stash, ActKeep::UnlessFull},
    {"ln2", &LayerActs::ln2, &LayerActs::ln2_16, ActWidth::Cx, ActStore::Bf16WithActsDense, ActKeep::UnlessFull},
    {"ln2_mean", &LayerActs::ln2_mean, nullptr, ActWidth::One, ActStore::F32, ActKeep::UnlessFull},
    {"ln2_rstd", &LayerActs::ln2_rstd, nullptr, ActWidth::One, ActStore::F32, ActKeep::UnlessFull},
    {"fc", &LayerActs::fc, &LayerActs::fc16, ActWidth::FWy, ActStore::Bf16Stash, ActKeep::UnlessFull},
    {"fc_act", &LayerActs::fc_act, &LayerActs::fc_act16, ActWidth::Fy, ActStore::Bf16WithActs, ActKeep::UnlessFull},
    {"router_logits", &LayerActs::router_logits, nullptr, ActWidth::E, ActStore::F32, ActKeep::UnlessFull},
    {"moe_in", &LayerActs::moe_in, nullptr, ActWidth::kC, ActStore::F32, ActKeep::UnlessFull},
    {"moe_gu", &LayerActs::moe_gu, nullptr, ActWidth::kFW, ActStore::F32, ActKeep::UnlessFull},
    {"moe_act", &LayerActs::moe_act, &LayerActs::moe_act16, ActWidth::kF, ActStore::Bf16WithActs, ActKeep::UnlessFull},
    {"moe_out", &LayerActs::moe_out, nullptr, ActWidth::kC, ActStore::F32, ActKeep::UnlessFull},
    {"shared_gu", &LayerActs::shared_gu, nullptr, ActWidth::sFW, ActStore::F32, ActKeep::UnlessFull},
    {"shared_act", &LayerActs::shared_act, nullptr, ActWidth::sF, ActStore::F32, ActKeep::UnlessFull},
    {"shared_out", &LayerActs::shared_out, nullptr, ActWidth::sC, ActStore::F32, ActKeep::UnlessFull},
    {"shared_glogit", &LayerActs::shared_glogit, nullptr, ActWidth::sG, ActStore::F32, ActKeep::UnlessFull},
    {"resid_out", &LayerActs::resid_out, nullptr, ActWidth::Cx, ActStore::F32, ActKeep::Output},
};

// The top-level tensors after the layers, in buffer order; each part's tensors are adjacent.
inline constexpr GlobalActSpec kGlobalActs[] = {
    {"emb", &ParallelActivations::emb, nullptr, ActWidth::Cx, ActStore::F32, ActPart::Embedding},
    {"lnf", &ParallelActivations::lnf, &ParallelActivations::lnf16, ActWidth::Cx, ActStore::Bf16WithActs, ActPart::Head},
    {"lnf_mean", &ParallelActivations::lnf_mean, nullptr, ActWidth::One, ActStore::F32, ActPart::Head},
    {"lnf_rstd", &ParallelActivations::lnf_rstd, nullptr, ActWidth::One, ActStore::F32, ActPart::Head},
    {"logits", &ParallelActivations::logits, nullptr, ActWidth::Vy, ActStore::F32, ActPart::Head},
    {"losses", &ParallelActivations::losses, nullptr, ActWidth::One, ActStore::F32, ActPart::Head},
    {"tmp", &ParallelActivations::tmp, nullptr, ActWidth::Cx, ActStore::F32, ActPart::Work},
    {"dresid", &ParallelActivations::dresid, nullptr, ActWidth::Cx, ActStore::F32, ActPart::Work},
    {"dln", &ParallelActivations::dln, nullptr, ActWidth::Cx, ActStore::F32, ActPart::Work},
    {"dqkv", &ParallelActivations::dqkv, nullptr, ActWidth::QKVy, ActStore::F32, ActPart::Work},
    {"datty", &ParallelActivations::datty, nullptr, ActWidth::Ay, ActStore::F32, ActPart::Work},
    {"dfc", &ParallelActivations::dfc, nullptr, ActWidth::FWy, ActStore::F32, ActPart::Work},
    {"dfc_act", &ParallelActivations::dfc_act, nullptr, ActWidth::Fy, ActStore::F32, ActPart::Work},
    {"dmoe_rows", &ParallelActivations::dmoe_rows, nullptr, ActWidth::kC, ActStore::F32, ActPart::Work},
    {"dmoe_gu", &ParallelActivations::dmoe_gu, nullptr, ActWidth::kFW, ActStore::F32, ActPart::Work},
    {"dmoe_act", &ParallelActivations::dmoe_act, nullptr, ActWidth::kF, ActStore::F32, ActPart::Work},
    {"dshared_gu", &ParallelActivations::dshared_gu, nullptr, ActWidth::sFW, ActStore::F32, ActPart::Work},
    {"dshared_act", &ParallelActivations::dshared_act, nullptr, ActWidth::sF, ActStore::F32, ActPart::Work},
    {"dout16", nullptr, &ParallelActivations::dout16, ActWidth::MaxLinearOut, ActStore::OnlyBf16, ActPart::Work},
    {"dout16_t", nullptr, &ParallelActivations::dout16_t, ActWidth::MaxLinearOut, ActStore::OnlyBf16, ActPart::Work},
    {"dfull", &ParallelActivations::dfull, nullptr, ActWidth::Cx, ActStore::F32, ActPart::Work},
};

// Sequence sharding over Y (ParallelOptions::sequence_shard, Megatron's sequence parallelism in
// the 3D algorithm's terms): the residual stream, replicated over Y without it, is split along
// the tokens over Y: each Y rank holds rows [y N/Gy, (y+1) N/Gy) of it. These tensors have
// N/Gy rows then (the block outputs, the residual sums, the norms' row statistics, the
// embedding's output and the stream's gradient); "dfull" exists only then; every other tensor
// keeps N rows (the norm outputs are all-gathered over Y before the GEMMs that read them).
enum class ActRows : unsigned char { All, SeqShard, OnlySeqShard };
inline constexpr float* LayerActs::*kSeqShardedLayerActs[] = {
    &LayerActs::ln1_mean, &LayerActs::ln1_rstd, &LayerActs::resid_mid,
    &LayerActs::ln2_mean, &LayerActs::ln2_rstd, &LayerActs::resid_out};
inline constexpr float* ParallelActivations::*kSeqShardedGlobalActs[] = {
    &ParallelActivations::emb, &ParallelActivations::lnf_mean, &ParallelActivations::lnf_rstd,
    &ParallelActivations::dresid};
ActRows act_rows(const LayerActSpec& t);
ActRows act_rows(const GlobalActSpec& t);

// The floats of the activation buffer by tensor (one layer's, the top-level ones), the recompute
// scratch and the whole buffer under a recompute mode, as the model lays it out: the sums of the
// spec list above, from which the model's views are made too. A bf16 tensor of n elements takes
// ceil(n / 2) floats.
struct ActivationSizes {
  struct Tensor {
    bool kept = true;    // own memory per layer (else in the shared recompute scratch)
    int64_t floats = 0;
    bool bf16 = false;   // stored in bf16 (act_in_bf16)
    int64_t work = 0;    // a Bf16Stash tensor kept in bf16: its fp32 working copy in the scratch
  };
  std::vector<Tensor> layer;     // one layer's tensors, in the order of kLayerActs
  std::vector<int64_t> globals;  // the top-level tensors' floats, in the order of kGlobalActs
  int64_t scratch = 0, total = 0;
  int64_t layer_kept = 0;  // floats each layer this stage runs keeps (kept tensors and output)
  int64_t input_slot = 0;  // floats of a layer output slot alone (N x C/Gx)
  int64_t full_layers = 0, input_layers = 0;  // layers with all their slots / only the output
  int64_t global = 0;      // the embedding output, final norm, logits and the work buffers
  int64_t embedding_out = 0;  // of `global`: the embedding's output (N x C/Gx)
  int64_t head_kept = 0;      // of `global`: the final norm, its statistics, logits and losses
};

// Which activation slots a rank allocates for each layer: every layer's on one stage (Gp = 1);
// on a pipeline stage, those of the layers it runs (Full) and the output slot of the layer before
// each of its chunks (Input: where the chunk's input is received), none for the other layers.
enum class LayerSlots : unsigned char { None, Input, Full };
std::vector<LayerSlots> layer_slots(int n_layer, const LayerSplit& split, int p, int stage);

// The activation buffer of a model of `cfg` on `shape` with `local_batch` sequences of up to
// `max_len` tokens per micro-batch, with `slots` per layer (layer_slots); bf16_activations:
// precision bf16 with ParallelOptions::bf16_activations (ln1, ln2, the final norm and the MLP
// activation in bf16, and the two bf16 copies of the gradient entering a linear layer's
// backward); seq_shard: the residual stream's tensors (ActRows::SeqShard) have N / seq_shard rows
// (Gy with ParallelOptions::sequence_shard, else 1; it must divide the tokens); bf16_stash
// (ParallelOptions::bf16_stash, with bf16_activations): the ActStore::Bf16Stash tensors a layer
// keeps are bf16 (else fp32, as ActStore::F32).
ActivationSizes activation_sizes(const ModelConfig& cfg, const GridShape& shape, int64_t local_batch,
                                 int max_len, bool bf16_activations, Recompute mode,
                                 const std::vector<LayerSlots>& slots, int seq_shard = 1,
                                 bool bf16_stash = true);

// How many ways the residual stream is split along the tokens: Gy with sequence_shard, else 1.
inline int seq_shard_ways(const ParallelOptions& o, const GridShape& g) {
  return o.sequence_shard ? g.y() : 1;
}

// Refuses sequence sharding where the tokens of a micro-batch do not split evenly over Y, and
// with forward_chunks > 1 (not implemented with it), naming the numbers.
void check_sequence_shard(const ParallelOptions& o, const GridShape& g, int64_t tokens);

int64_t act_width(ActWidth w, const LocalDims& d);
// Whether a tensor stored as `s` is in bf16 (a dense model or a mixture of experts: d.E).
bool act_in_bf16(ActStore s, const LocalDims& d, bool bf16_activations);
// Floats of the buffer a tensor of N rows of `w` stored as `s` takes.
int64_t act_floats(int64_t N, ActWidth w, ActStore s, const LocalDims& d, bool bf16_activations);
// The rows of a tensor of `rows` kind for N tokens with the stream split seq_shard ways.
int64_t act_rows_of(int64_t N, ActRows rows, int seq_shard);
bool act_kept(ActKeep k, Recompute mode);

// The stashed tensors of a layer's views (ActStore::Bf16Stash kept in bf16): the fp32 working
// copy, the bf16 copy and the elements, for N tokens with the stream split seq_shard ways. The
// block casts each into its bf16 copy after its forward and back before its backward.
struct StashedTensor {
  float* f32;
  uint16_t* bf16;
  int64_t n;
};
std::vector<StashedTensor> stashed_tensors(const LayerActs& A, int64_t N, const LocalDims& d,
                                           int seq_shard);

// The views into `base` (sizes.total floats), from the spec list and the sizes it gave
// (activation_sizes with the same slots and bf16 setting).
ParallelActivations lay_out_activations(float* base, const ActivationSizes& sizes,
                                        const std::vector<LayerSlots>& slots, bool bf16_activations);

}  // namespace tetrad::parallel
