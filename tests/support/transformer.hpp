// The serial test oracle: the decoder of every registered family as one class over flat
// buffers, forward and backward written out (tests/support, not part of tetrad_lib: every command
// runs parallel::ParallelTransformer, the one model). What a block is made of comes from the
// family's description (model/family.hpp: norm kind, MLP kind, positions) and each tensor's place
// from its role, so a new family is an entry there plus the parts its new kinds or roles need
// here, not a branch on the family.
//
// Parameters, gradients and activations each live in one Buffer; the ParamTable gives every
// tensor's (offset, size). The whole model reads top to bottom in transformer.cpp: forward() then
// backward() mirroring it line for line, straight onto the CPU kernels.
//
// Templated on the element type: double exists so the whole model's gradient can be checked
// against finite differences (test_model); float is the serial reference that the parallel model
// on every grid must follow (tests/mpi/contract.hpp), the bf16 precision checks
// (test_precision), decoding (test_decode) and extraction (support/extraction.hpp).
// Not thread-safe: one model object per training loop.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "tetrad/backend/cpu/precision.hpp"
#include "tetrad/core/buffer.hpp"
#include "tetrad/core/profile.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/model/params.hpp"

namespace tetrad {

template <typename T>
class Transformer {
 public:
  // Allocates parameters, gradients and activations for micro-batches of up to max_batch
  // sequences of up to max_len tokens (max_len <= config.max_seq). `precision` is the model's
  // GEMM precision for its lifetime (see bf16() below); BF16 is for Transformer<float> only.
  Transformer(const ModelConfig& config, int max_batch, int max_len,
              backend::Precision precision = backend::Precision::FP32);
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const ParamTable& table() const { return table_; }
  int max_batch() const { return max_batch_; }
  int max_len() const { return max_len_; }
  int64_t num_params() const { return table_.total; }
  // Non-const access may change the parameters: the bf16 weight copy is then refreshed from
  // them before the next forward (unless params_bf16_written() says the caller wrote it).
  T* params() {
    params16_current_ = false;
    return params_.data();
  }
  const T* params() const { return params_.data(); }
  T* grads() { return grads_.data(); }
  const T* grads() const { return grads_.data(); }
  T* param(const std::string& name) {
    params16_current_ = false;
    return params_.data() + table_.find(name).offset;
  }
  // Bytes of the activation buffers (fp32 and, in bf16 mode, bf16 ones).
  int64_t activation_bytes() const {
    return int64_t(acts_.size() * sizeof(T) + acts16_.size() * sizeof(uint16_t));
  }

  // bf16 mixed precision (docs/precision.md). A float model constructed with Precision::BF16
  // runs in bf16 for its lifetime: its GEMMs read a bf16 copy of the parameters and the
  // activations that only feed GEMMs (normalised inputs, the MLP activation, gradients entering
  // GEMMs) are stored in bf16 by the kernels that produce them. In FP32 every GEMM is fp32.
  bool bf16() const { return bf16_; }
  // The bf16 copy of the parameters, laid out like params() (nullptr unless bf16()). The optimizer
  // writes it in its update pass (AdamW::update with params_bf16) and then calls
  // params_bf16_written(); otherwise the model converts the parameters itself before the next
  // forward.
  uint16_t* params_bf16() { return bf16_ ? params16_.data() : nullptr; }
  void params_bf16_written() { params16_current_ = bf16_; }

  // The family's initialisation (GPT-2: N(0, 0.02), residual projections scaled by
  // 1/sqrt(2L), biases 0, norms 1; Llama: N(0, init_std), norms 1). Each tensor draws from its own
  // stream seeded by (seed, tensor index), so init does not depend on allocation order.
  void init_weights(uint64_t seed);
  void zero_grads() { grads_.zero(); }

  // Training: forward over B sequences of T tokens, loss, and backward of
  // grad_scale * Σ_t loss_t (targets < 0 are ignored); parameter gradients ACCUMULATE.
  // Returns Σ_t loss_t over the kept targets.
  double forward_backward(const int32_t* inputs, const int32_t* targets, int B, int Tq,
                          T grad_scale);
  // Evaluation: Σ_t loss_t over targets >= 0; logits() stay valid.
  double forward_loss(const int32_t* inputs, const int32_t* targets, int B, int Tq);
  // Logits [B*T, V] for the inputs; returns a pointer to them.
  const T* forward_logits(const int32_t* inputs, int B, int Tq);
  const T* logits() const;

  // Incremental decoding with a key/value cache (generation). start_cache(B) resets the cache for
  // B sequences; decode() appends Tq tokens per sequence at the current position and returns the
  // logits of each sequence's LAST new token, [B, V].
  void start_cache(int B);
  const T* decode(const int32_t* tokens, int B, int Tq);
  int cache_position() const;

  // A mixture of experts' router losses of the last forward, weighted as the backward weights
  // them: N tokens x (router_aux_loss_coef x the layers' mean auxiliary loss + router_z_loss_coef
  // x their mean z-loss); 0 for a dense model. forward_loss + this is the function whose
  // gradient forward_backward computes (with grad_scale 1).
  double router_loss() const { return router_loss_; }
  // The last forward's mean over the layers of the auxiliary loss E Σ_e f_e P_e (without its
  // coefficient), and the rows each expert computed, summed over the layers.
  double mean_aux_loss() const { return mean_aux_; }
  const std::vector<int64_t>& expert_rows() const { return expert_rows_; }
  // The last forward's choices routed to each expert of each layer (before any drop), layer l's
  // at l * E: the load the expert bias's update reads.
  const std::vector<int64_t>& expert_load() const { return expert_load_; }

  // Accumulate per-phase wall time of every following call into `p` (nullptr: off).
  void set_profile(StepProfile* p) { prof_ = p; }

 private:
  template <typename F>
  void timed(Phase ph, F&& f) {
    ScopedPhase s(prof_, ph);
    f();
  }
  struct Layer;    // per-block parameter views
  struct Acts;     // activation views
  struct Cache;
  void forward(const int32_t* inputs, int B, int Tq, int pos0, bool use_cache);
  void backward(const int32_t* inputs, int B, int Tq);
  void bind_tensors();
  // The parts, each by the family's kind (norm, MLP) and the precision; tensors by offset.
  void norm_forward(T* out, uint16_t* out16, T* mean, T* rstd, const T* x, int64_t w, int64_t b,
                    int64_t N);
  void norm_backward(T* dx, const T* dout, const T* x, int64_t w, int64_t b, const T* mean,
                     const T* rstd, int64_t N);
  void linear_forward(T* out, const T* in, const uint16_t* in16, int64_t w, int64_t b, int64_t N,
                      int64_t IC, int64_t OC, bool accumulate = false);
  void linear_backward(T* din, const T* dout, const uint16_t* dout16, const T* in,
                       const uint16_t* in16, int64_t w, int64_t b, int64_t N, int64_t IC,
                       int64_t OC);
  void mlp_activation(T* act, uint16_t* act16, const T* fc, int64_t N);
  void mlp_activation_backward(T* dfc, uint16_t* dfc16, const T* dact, const T* fc, int64_t N);
  void head_logits(int64_t rows, int64_t first, int64_t stride);
  // The mixture of experts in place of the MLP: resid_out = resid_mid + Σ_j w_j expert_j(ln2),
  // token by token; its backward from a.dresid into a.dln (transformer_moe.cpp).
  void moe_forward(int l, int64_t N);
  void moe_backward(int l, int64_t N);
  struct MoeLayer;
  std::vector<MoeLayer> moe_;
  double router_loss_ = 0, mean_aux_ = 0;
  std::vector<int64_t> expert_rows_, expert_load_;
  T grad_scale_ = T(1);

  ModelConfig cfg_;
  const FamilyDesc& fam_;  // what the blocks are made of (model/family.hpp)
  ParamTable table_;
  int max_batch_, max_len_;
  void refresh_params_bf16();
  Buffer<T> params_, grads_, acts_, rope_cos_, rope_sin_;
  bool bf16_ = false;
  bool params16_current_ = false;
  Buffer<uint16_t> params16_, acts16_;
  std::vector<Layer> layers_;
  // Offsets of the tensors outside the blocks (-1: absent); head_ is wte_ when tied.
  int64_t wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1, head_ = -1;
  std::unique_ptr<Acts> a_;
  std::unique_ptr<Cache> cache_;
  StepProfile* prof_ = nullptr;
};

extern template class Transformer<float>;
extern template class Transformer<double>;

}  // namespace tetrad
