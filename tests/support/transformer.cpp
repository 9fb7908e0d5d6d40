#include "support/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "tetrad/core/error.hpp"
#include "tetrad/core/rng.hpp"
#include "tetrad/backend/cpu/attention.hpp"
#include "tetrad/backend/cpu/ops.hpp"
#include "tetrad/backend/cpu/precision.hpp"

namespace tetrad {

namespace k = kernels;

namespace {
// The bf16 kernels exist for float only; a double model never runs in bf16 (bf16_ is false), so
// these shims' double branches are unreachable.
constexpr const char* kNoBf16 = "bf16 mode is for Transformer<float> only";
template <typename T>
void ln_fwd16(uint16_t* o, T* mean, T* rstd, const T* x, const T* w, const T* b, int64_t n,
              int64_t C, T eps) {
  if constexpr (std::is_same_v<T, float>) k::layernorm_forward_bf16(o, mean, rstd, x, w, b, n, C, eps);
  else TETRAD_CHECK(false, kNoBf16);
}
template <typename T>
void rms_fwd16(uint16_t* o, T* rstd, const T* x, const T* w, int64_t n, int64_t C, T eps) {
  if constexpr (std::is_same_v<T, float>) k::rmsnorm_forward_bf16(o, rstd, x, w, n, C, eps);
  else TETRAD_CHECK(false, kNoBf16);
}
template <typename T>
void lin_fwd16(T* out, const uint16_t* in, const uint16_t* W, const T* bias, int64_t n,
               int64_t IC, int64_t OC, bool accumulate = false) {
  if constexpr (std::is_same_v<T, float>) k::linear_forward_bf16(out, in, W, bias, n, IC, OC, accumulate);
  else TETRAD_CHECK(false, kNoBf16);
}
template <typename T>
void lin_bwd16(T* din, T* dW, T* dbias, const uint16_t* dout, const T* dout32, const uint16_t* in,
               const uint16_t* W, int64_t n, int64_t IC, int64_t OC) {
  if constexpr (std::is_same_v<T, float>) k::linear_backward_bf16(din, dW, dbias, dout, dout32, in, W, n, IC, OC);
  else TETRAD_CHECK(false, kNoBf16);
}
template <typename T>
void to16(const T* x, uint16_t* y, int64_t n) {
  if constexpr (std::is_same_v<T, float>) k::convert_to_bf16(x, y, n);
  else TETRAD_CHECK(false, kNoBf16);
}
template <typename T>
void gemm16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
            const uint16_t* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>)
    k::gemm_bf16(ta, tb, M, N, K, 1.0f, k::Bf16Operand::bf16_stored(A, lda),
                 k::Bf16Operand::bf16_stored(B, ldb), beta, C, ldc);
  else TETRAD_CHECK(false, kNoBf16);
}
}  // namespace

// Offsets of one block's tensors in the parameter (and gradient) buffer; -1 = absent.
template <typename T>
struct Transformer<T>::Layer {
  int64_t ln1_w = -1, ln1_b = -1, qkv_w = -1, qkv_b = -1, proj_w = -1, proj_b = -1;
  int64_t ln2_w = -1, ln2_b = -1, fc_w = -1, fc_b = -1, fcproj_w = -1, fcproj_b = -1;
};

// Views into the activation buffer. N = max_batch * max_len tokens, C hidden, QKV = (nh+2nkv)hd,
// FW = width of the MLP up projection (F for GPT-2, 2F for SwiGLU's gate+up), F = MLP inner.
template <typename T>
struct Transformer<T>::Acts {
  struct PerLayer {
    T* ln1;        // (N, C)   normalised block input
    T* ln1_mean;   // (N)      LayerNorm only
    T* ln1_rstd;   // (N)
    T* qkv;        // (N, QKV) q | k | v of every head (after rotary for Llama)
    T* atty;       // (N, C)   attention output, heads concatenated
    T* lse;        // (B, nh, T) log-sum-exp of each attention row
    T* resid_mid;  // (N, C)   x + attention
    T* ln2;        // (N, C)
    T* ln2_mean;   // (N)
    T* ln2_rstd;   // (N)
    T* fc;         // (N, FW)  MLP up projection, before the activation
    T* fc_act;     // (N, F)
    T* resid_out;  // (N, C)   block output
    // bf16 mode: ln1, ln2 and fc_act are stored only in bf16 (they feed GEMMs only); the
    // attention output is kept in fp32 (its backward reads it) with a bf16 copy for the GEMMs.
    uint16_t *ln1_16 = nullptr, *atty16 = nullptr, *ln2_16 = nullptr, *fc_act16 = nullptr;
  };
  std::vector<PerLayer> layer;
  T* emb;        // (N, C)
  T* lnf;        // (N, C)
  T* lnf_mean;   // (N)
  T* lnf_rstd;   // (N)
  T* logits;     // (N, V)   overwritten with dlogits by the fused cross-entropy
  T* losses;     // (N)
  // backward scratch, reused by every layer
  T* dresid;     // (N, C)   gradient of the residual stream
  T* dln;        // (N, C)
  T* dqkv;       // (N, QKV)
  T* datty;      // (N, C)
  T* dfc;        // (N, FW)
  T* dfc_act;    // (N, F)
  // bf16 mode
  uint16_t* lnf16 = nullptr;      // (N, C)  replaces lnf
  uint16_t* dlogits16 = nullptr;  // (N, V)  the loss gradient the head's GEMMs read
  uint16_t* dresid16 = nullptr;   // (N, C)  dresid entering the projections' GEMMs
  uint16_t* dfc16 = nullptr;      // (N, FW) replaces dfc
  uint16_t* dqkv16 = nullptr;     // (N, QKV)
};

template <typename T>
struct Transformer<T>::Cache {
  int B = 0;
  int pos = 0;
  Buffer<T> k, v;  // (L, B, max_len, nkv*hd) each
};

template <typename T>
Transformer<T>::Transformer(const ModelConfig& config, int max_batch, int max_len,
                            backend::Precision precision)
    : cfg_(config), max_batch_(max_batch), max_len_(max_len) {
  if (precision == backend::Precision::BF16 && !std::is_same_v<T, float>) fail(kNoBf16);
  cfg_.validate();
  if (max_batch <= 0) fail("micro-batch size must be positive, got ", max_batch);
  if (max_len <= 0 || max_len > cfg_.max_seq)
    fail("sequence length ", max_len, " is outside what the model supports (1..",
         cfg_.max_seq, " = model.max_seq)");
  table_ = build_param_table(cfg_);
  params_ = Buffer<T>(table_.total);
  grads_ = Buffer<T>(table_.total);

  const bool gpt2 = cfg_.family == Family::GPT2;
  auto off = [&](const std::string& name) -> int64_t {
    const ParamSpec* s = table_.try_find(name);
    return s ? s->offset : -1;
  };
  layers_.resize(cfg_.n_layer);
  for (int l = 0; l < cfg_.n_layer; ++l) {
    Layer& L = layers_[l];
    if (gpt2) {
      const std::string p = "transformer.h." + std::to_string(l) + ".";
      L.ln1_w = off(p + "ln_1.weight"); L.ln1_b = off(p + "ln_1.bias");
      L.qkv_w = off(p + "attn.c_attn.weight"); L.qkv_b = off(p + "attn.c_attn.bias");
      L.proj_w = off(p + "attn.c_proj.weight"); L.proj_b = off(p + "attn.c_proj.bias");
      L.ln2_w = off(p + "ln_2.weight"); L.ln2_b = off(p + "ln_2.bias");
      L.fc_w = off(p + "mlp.c_fc.weight"); L.fc_b = off(p + "mlp.c_fc.bias");
      L.fcproj_w = off(p + "mlp.c_proj.weight"); L.fcproj_b = off(p + "mlp.c_proj.bias");
    } else {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      L.ln1_w = off(p + "input_layernorm.weight");
      L.qkv_w = off(p + "self_attn.q_proj.weight");  // q, k, v adjacent: one matrix
      L.qkv_b = off(p + "self_attn.q_proj.bias");    // Qwen2: their biases adjacent, one vector
      L.proj_w = off(p + "self_attn.o_proj.weight");
      L.ln2_w = off(p + "post_attention_layernorm.weight");
      L.fc_w = off(p + "mlp.gate_proj.weight");  // gate, up adjacent: one matrix
      L.fcproj_w = off(p + "mlp.down_proj.weight");
    }
  }

  // Activations: one allocation per element type, carved into views. In bf16 mode the tensors
  // that only feed GEMMs are bf16 (see Acts); the fp32 ones they replace are not allocated.
  bf16_ = precision == backend::Precision::BF16;
  const int64_t N = int64_t(max_batch) * max_len, C = cfg_.n_embd, V = cfg_.vocab_size;
  const int64_t QKV = cfg_.qkv_dim(), F = cfg_.ffn, FW = gpt2 ? F : 2 * F;
  const int64_t h = bf16_ ? 0 : 1;  // 1 where an fp32 tensor exists only in fp32 mode
  const int64_t per_layer =
      N * (h * C + 1 + 1 + QKV + C + cfg_.n_head + C + h * C + 1 + 1 + FW + h * F + C);
  const int64_t global = N * (C + h * C + 1 + 1 + V + 1) + N * (C + C + QKV + C + h * FW + F);
  acts_ = Buffer<T>(per_layer * cfg_.n_layer + global);
  const int64_t per_layer16 = N * (C + C + C + F);
  const int64_t global16 = N * (C + V + C + FW + QKV);
  if (bf16_) acts16_ = Buffer<uint16_t>(per_layer16 * cfg_.n_layer + global16);
  a_ = std::make_unique<Acts>();
  T* cur = acts_.data();
  uint16_t* cur16 = acts16_.data();
  auto take = [&](int64_t n) { T* p = cur; cur += n; return p; };
  auto take32 = [&](int64_t n) -> T* { return bf16_ ? nullptr : take(n); };  // fp32 mode only
  auto take16 = [&](int64_t n) -> uint16_t* {
    if (!bf16_) return nullptr;
    uint16_t* p = cur16;
    cur16 += n;
    return p;
  };
  a_->layer.resize(cfg_.n_layer);
  for (auto& A : a_->layer) {
    A.ln1 = take32(N * C); A.ln1_mean = take(N); A.ln1_rstd = take(N);
    A.qkv = take(N * QKV); A.atty = take(N * C); A.lse = take(N * cfg_.n_head);
    A.resid_mid = take(N * C); A.ln2 = take32(N * C); A.ln2_mean = take(N); A.ln2_rstd = take(N);
    A.fc = take(N * FW); A.fc_act = take32(N * F); A.resid_out = take(N * C);
    A.ln1_16 = take16(N * C); A.atty16 = take16(N * C); A.ln2_16 = take16(N * C);
    A.fc_act16 = take16(N * F);
  }
  a_->emb = take(N * C); a_->lnf = take32(N * C); a_->lnf_mean = take(N); a_->lnf_rstd = take(N);
  a_->logits = take(N * V); a_->losses = take(N);
  a_->dresid = take(N * C); a_->dln = take(N * C); a_->dqkv = take(N * QKV);
  a_->datty = take(N * C); a_->dfc = take32(N * FW); a_->dfc_act = take(N * F);
  a_->lnf16 = take16(N * C); a_->dlogits16 = take16(N * V); a_->dresid16 = take16(N * C);
  a_->dfc16 = take16(N * FW); a_->dqkv16 = take16(N * QKV);
  TETRAD_CHECK(cur == acts_.data() + acts_.size());
  TETRAD_CHECK(cur16 == acts16_.data() + acts16_.size());
  if (bf16_) params16_ = Buffer<uint16_t>(table_.total);

  if (!gpt2) {
    const int64_t half = cfg_.head_dim() / 2;
    rope_cos_ = Buffer<T>(size_t(cfg_.max_seq) * half);
    rope_sin_ = Buffer<T>(size_t(cfg_.max_seq) * half);
    k::rope_tables(rope_cos_.data(), rope_sin_.data(), cfg_.max_seq, cfg_.head_dim(),
                   rope_frequencies(cfg_));
  }
}

template <typename T>
Transformer<T>::~Transformer() = default;

template <typename T>
void Transformer<T>::refresh_params_bf16() {
  if (!bf16_ || params16_current_) return;
  timed(Phase::Optimizer, [&] { to16(params_.data(), params16_.data(), table_.total); });
  params16_current_ = true;
}

template <typename T>
void Transformer<T>::init_weights(uint64_t seed) {
  params16_current_ = false;
  for (size_t i = 0; i < table_.specs.size(); ++i)
    init_parameter(cfg_, table_.specs[i], i, seed, params_.data() + table_.specs[i].offset);
}

template <typename T>
void Transformer<T>::forward(const int32_t* inputs, int B, int Tq, int pos0, bool use_cache) {
  if (B <= 0 || B > max_batch_)
    fail("micro-batch of ", B, " sequences; this model was set up for 1..", max_batch_);
  if (Tq <= 0 || pos0 + Tq > max_len_)
    fail("sequence of ", pos0 + Tq, " tokens is longer than the model's maximum of ", max_len_,
         " (model.max_seq / train.seq_len)");
  const bool gpt2 = cfg_.family == Family::GPT2;
  const int64_t N = int64_t(B) * Tq, C = cfg_.n_embd, V = cfg_.vocab_size;
  const int64_t nh = cfg_.n_head, nkv = cfg_.n_kv_head, hd = cfg_.head_dim();
  const int64_t QKV = cfg_.qkv_dim(), F = cfg_.ffn, FW = gpt2 ? F : 2 * F;
  const T eps = T(cfg_.norm_eps);
  refresh_params_bf16();
  T* P = params_.data();
  auto p = [&](int64_t o) -> const T* { return o < 0 ? nullptr : P + o; };
  const uint16_t* P16 = params16_.data();
  auto p16 = [&](int64_t o) -> const uint16_t* { return P16 + o; };
  Acts& a = *a_;

  const ParamSpec& wte = table_.specs[0];
  const T* wpe = gpt2 ? P + table_.specs[1].offset + int64_t(pos0) * C : nullptr;
  timed(Phase::Embedding, [&] { k::embedding_forward(a.emb, inputs, P + wte.offset, wpe, N, Tq, C, V); });

  const T* x = a.emb;
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const Layer& L = layers_[l];
    auto& A = a.layer[l];
    if (bf16_) {
      if (gpt2) timed(Phase::Norm, [&] { ln_fwd16(A.ln1_16, A.ln1_mean, A.ln1_rstd, x, p(L.ln1_w), p(L.ln1_b), N, C, eps); });
      else timed(Phase::Norm, [&] { rms_fwd16(A.ln1_16, A.ln1_rstd, x, p(L.ln1_w), N, C, eps); });
      timed(Phase::Gemm, [&] { lin_fwd16(A.qkv, A.ln1_16, p16(L.qkv_w), p(L.qkv_b), N, C, QKV); });
    } else {
      if (gpt2) timed(Phase::Norm, [&] { k::layernorm_forward(A.ln1, A.ln1_mean, A.ln1_rstd, x, p(L.ln1_w), p(L.ln1_b), N, C, eps); });
      else timed(Phase::Norm, [&] { k::rmsnorm_forward(A.ln1, A.ln1_rstd, x, p(L.ln1_w), N, C, eps); });
      timed(Phase::Gemm, [&] { k::linear_forward(A.qkv, A.ln1, p(L.qkv_w), p(L.qkv_b), N, C, QKV); });
    }
    if (!gpt2)
      timed(Phase::Attention, [&] { k::rope_forward(A.qkv, N, Tq, pos0, nh + nkv, hd, QKV, rope_cos_.data(), rope_sin_.data()); });

    k::AttentionDims d{};
    d.B = B; d.Tq = Tq; d.n_head = int(nh); d.n_kv_head = int(nkv); d.head_dim = int(hd);
    d.q_stride = QKV; d.q_batch_stride = Tq * QKV;
    d.out_stride = C; d.out_batch_stride = Tq * C;
    const T* q = A.qkv;
    const T *kp = A.qkv + nh * hd, *vp = A.qkv + (nh + nkv) * hd;
    if (use_cache) {
      // Append this step's keys and values, then attend over everything cached so far.
      const int64_t KW = nkv * hd;
      T* kc = cache_->k.data() + int64_t(l) * cache_->B * max_len_ * KW;
      T* vc = cache_->v.data() + int64_t(l) * cache_->B * max_len_ * KW;
      for (int b = 0; b < B; ++b)
        for (int i = 0; i < Tq; ++i) {
          const T* row = A.qkv + (int64_t(b) * Tq + i) * QKV;
          const int64_t dst = (int64_t(b) * max_len_ + pos0 + i) * KW;
          std::memcpy(kc + dst, row + nh * hd, KW * sizeof(T));
          std::memcpy(vc + dst, row + (nh + nkv) * hd, KW * sizeof(T));
        }
      kp = kc; vp = vc;
      d.Tk = pos0 + Tq; d.kv_stride = KW; d.kv_batch_stride = int64_t(max_len_) * KW;
      timed(Phase::Attention, [&] { k::attention_forward<T>(A.atty, nullptr, q, kp, vp, d); });
    } else {
      d.Tk = Tq; d.kv_stride = QKV; d.kv_batch_stride = Tq * QKV;
      timed(Phase::Attention, [&] { k::attention_forward<T>(A.atty, A.lse, q, kp, vp, d); });
    }

    timed(Phase::Residual, [&] { std::memcpy(A.resid_mid, x, N * C * sizeof(T)); });
    if (bf16_) {
      timed(Phase::Attention, [&] { to16(A.atty, A.atty16, N * C); });
      timed(Phase::Gemm, [&] { lin_fwd16(A.resid_mid, A.atty16, p16(L.proj_w), p(L.proj_b), N, C, C, /*accumulate=*/true); });
      if (gpt2) timed(Phase::Norm, [&] { ln_fwd16(A.ln2_16, A.ln2_mean, A.ln2_rstd, A.resid_mid, p(L.ln2_w), p(L.ln2_b), N, C, eps); });
      else timed(Phase::Norm, [&] { rms_fwd16(A.ln2_16, A.ln2_rstd, A.resid_mid, p(L.ln2_w), N, C, eps); });
      timed(Phase::Gemm, [&] { lin_fwd16(A.fc, A.ln2_16, p16(L.fc_w), p(L.fc_b), N, C, FW); });
      if constexpr (std::is_same_v<T, float>) {
        if (gpt2) timed(Phase::Activation, [&] { k::gelu_forward_bf16(A.fc_act16, A.fc, N * F); });
        else timed(Phase::Activation, [&] { k::swiglu_forward_bf16(A.fc_act16, A.fc, N, F); });
      }
      timed(Phase::Residual, [&] { std::memcpy(A.resid_out, A.resid_mid, N * C * sizeof(T)); });
      timed(Phase::Gemm, [&] { lin_fwd16(A.resid_out, A.fc_act16, p16(L.fcproj_w), p(L.fcproj_b), N, F, C, /*accumulate=*/true); });
    } else {
      timed(Phase::Gemm, [&] { k::linear_forward(A.resid_mid, A.atty, p(L.proj_w), p(L.proj_b), N, C, C, /*accumulate=*/true); });
      if (gpt2) timed(Phase::Norm, [&] { k::layernorm_forward(A.ln2, A.ln2_mean, A.ln2_rstd, A.resid_mid, p(L.ln2_w), p(L.ln2_b), N, C, eps); });
      else timed(Phase::Norm, [&] { k::rmsnorm_forward(A.ln2, A.ln2_rstd, A.resid_mid, p(L.ln2_w), N, C, eps); });
      timed(Phase::Gemm, [&] { k::linear_forward(A.fc, A.ln2, p(L.fc_w), p(L.fc_b), N, C, FW); });
      if (gpt2) timed(Phase::Activation, [&] { k::gelu_forward(A.fc_act, A.fc, N * F); });
      else timed(Phase::Activation, [&] { k::swiglu_forward(A.fc_act, A.fc, N, F); });
      timed(Phase::Residual, [&] { std::memcpy(A.resid_out, A.resid_mid, N * C * sizeof(T)); });
      timed(Phase::Gemm, [&] { k::linear_forward(A.resid_out, A.fc_act, p(L.fcproj_w), p(L.fcproj_b), N, F, C, /*accumulate=*/true); });
    }
    x = A.resid_out;
  }

  if (bf16_) {
    if (gpt2)
      timed(Phase::Norm, [&] { ln_fwd16(a.lnf16, a.lnf_mean, a.lnf_rstd, x, P + table_.find("transformer.ln_f.weight").offset,
                                        P + table_.find("transformer.ln_f.bias").offset, N, C, eps); });
    else
      timed(Phase::Norm, [&] { rms_fwd16(a.lnf16, a.lnf_rstd, x, P + table_.find("model.norm.weight").offset, N, C, eps); });
  } else if (gpt2) {
    timed(Phase::Norm, [&] { k::layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, x, P + table_.find("transformer.ln_f.weight").offset,
                         P + table_.find("transformer.ln_f.bias").offset, N, C, eps); });
  } else {
    timed(Phase::Norm, [&] { k::rmsnorm_forward(a.lnf, a.lnf_rstd, x, P + table_.find("model.norm.weight").offset, N, C, eps); });
  }
}

// The output head's weight: the token embedding when tied.
#define HEAD_OFFSET() \
  (cfg_.tie_embeddings ? table_.specs[0].offset : table_.find("lm_head.weight").offset)

template <typename T>
const T* Transformer<T>::forward_logits(const int32_t* inputs, int B, int Tq) {
  forward(inputs, B, Tq, 0, false);
  const int64_t N = int64_t(B) * Tq, C = cfg_.n_embd, V = cfg_.vocab_size;
  if (bf16_)
    timed(Phase::Gemm, [&] { gemm16(false, true, N, V, C, a_->lnf16, C, params16_.data() + HEAD_OFFSET(), C, T(0), a_->logits, V); });
  else
    timed(Phase::Gemm, [&] { k::gemm<T>(false, true, N, V, C, T(1), a_->lnf, C, params_.data() + HEAD_OFFSET(), C, T(0),
               a_->logits, V); });
  return a_->logits;
}

template <typename T>
const T* Transformer<T>::logits() const { return a_->logits; }

template <typename T>
double Transformer<T>::forward_loss(const int32_t* inputs, const int32_t* targets, int B, int Tq) {
  forward_logits(inputs, B, Tq);
  ScopedPhase sp(prof_, Phase::Loss);
  return k::cross_entropy_forward(a_->losses, a_->logits, targets, int64_t(B) * Tq,
                                  int64_t(cfg_.vocab_size));
}

template <typename T>
double Transformer<T>::forward_backward(const int32_t* inputs, const int32_t* targets, int B,
                                        int Tq, T grad_scale) {
  forward_logits(inputs, B, Tq);
  double loss_sum = 0;
  timed(Phase::Loss, [&] {
    if constexpr (std::is_same_v<T, float>) {
      if (bf16_) {
        loss_sum = k::cross_entropy_fused_bf16(a_->logits, a_->dlogits16, a_->losses, targets,
                                               int64_t(B) * Tq, int64_t(cfg_.vocab_size), grad_scale);
        return;
      }
    }
    loss_sum = k::cross_entropy_fused(a_->logits, a_->losses, targets, int64_t(B) * Tq,
                                      int64_t(cfg_.vocab_size), grad_scale);
  });
  backward(inputs, B, Tq);
  return loss_sum;
}

template <typename T>
void Transformer<T>::backward(const int32_t* inputs, int B, int Tq) {
  const bool gpt2 = cfg_.family == Family::GPT2;
  const int64_t N = int64_t(B) * Tq, C = cfg_.n_embd, V = cfg_.vocab_size;
  const int64_t nh = cfg_.n_head, nkv = cfg_.n_kv_head, hd = cfg_.head_dim();
  const int64_t QKV = cfg_.qkv_dim(), F = cfg_.ffn, FW = gpt2 ? F : 2 * F;
  T* P = params_.data();
  T* G = grads_.data();
  auto p = [&](int64_t o) -> const T* { return o < 0 ? nullptr : P + o; };
  auto g = [&](int64_t o) -> T* { return o < 0 ? nullptr : G + o; };
  const uint16_t* P16 = params16_.data();
  auto p16 = [&](int64_t o) -> const uint16_t* { return P16 + o; };
  Acts& a = *a_;
  const T* x_last = cfg_.n_layer > 0 ? a.layer.back().resid_out : a.emb;

  // Output head (dlogits already in a.logits) and the final norm.
  const int64_t head = HEAD_OFFSET();
  if (bf16_)
    timed(Phase::Gemm, [&] { lin_bwd16(a.dln, G + head, static_cast<T*>(nullptr), a.dlogits16, static_cast<const T*>(nullptr), a.lnf16, p16(head), N, C, V); });
  else
    timed(Phase::Gemm, [&] { k::linear_backward(a.dln, G + head, static_cast<T*>(nullptr), a.logits, a.lnf, P + head, N, C, V); });
  timed(Phase::Residual, [&] { std::fill(a.dresid, a.dresid + N * C, T(0)); });
  if (gpt2) {
    const int64_t w = table_.find("transformer.ln_f.weight").offset;
    const int64_t b = table_.find("transformer.ln_f.bias").offset;
    timed(Phase::Norm, [&] { k::layernorm_backward(a.dresid, G + w, G + b, a.dln, x_last, P + w, a.lnf_mean, a.lnf_rstd, N, C); });
  } else {
    const int64_t w = table_.find("model.norm.weight").offset;
    timed(Phase::Norm, [&] { k::rmsnorm_backward(a.dresid, G + w, a.dln, x_last, P + w, a.lnf_rstd, N, C); });
  }

  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    const Layer& L = layers_[l];
    auto& A = a.layer[l];
    const T* x_in = l == 0 ? a.emb : a.layer[l - 1].resid_out;

    // resid_out = resid_mid + fcproj(act(fc(norm2(resid_mid))))
    if (bf16_) {
      timed(Phase::Norm, [&] { to16(a.dresid, a.dresid16, N * C); });
      timed(Phase::Gemm, [&] { lin_bwd16(a.dfc_act, g(L.fcproj_w), g(L.fcproj_b), a.dresid16, a.dresid, A.fc_act16, p16(L.fcproj_w), N, F, C); });
      if constexpr (std::is_same_v<T, float>) {
        if (gpt2) timed(Phase::Activation, [&] { k::gelu_backward_bf16(a.dfc16, a.dfc_act, A.fc, N * F); });
        else timed(Phase::Activation, [&] { k::swiglu_backward_bf16(a.dfc16, a.dfc_act, A.fc, N, F); });
      }
      timed(Phase::Gemm, [&] { lin_bwd16(a.dln, g(L.fc_w), g(L.fc_b), a.dfc16, static_cast<const T*>(nullptr), A.ln2_16, p16(L.fc_w), N, C, FW); });
    } else {
      timed(Phase::Gemm, [&] { k::linear_backward(a.dfc_act, g(L.fcproj_w), g(L.fcproj_b), a.dresid, A.fc_act, p(L.fcproj_w), N, F, C); });
      if (gpt2) timed(Phase::Activation, [&] { k::gelu_backward(a.dfc, a.dfc_act, A.fc, N * F); });
      else timed(Phase::Activation, [&] { k::swiglu_backward(a.dfc, a.dfc_act, A.fc, N, F); });
      timed(Phase::Gemm, [&] { k::linear_backward(a.dln, g(L.fc_w), g(L.fc_b), a.dfc, A.ln2, p(L.fc_w), N, C, FW); });
    }
    if (gpt2) timed(Phase::Norm, [&] { k::layernorm_backward(a.dresid, g(L.ln2_w), g(L.ln2_b), a.dln, A.resid_mid, p(L.ln2_w), A.ln2_mean, A.ln2_rstd, N, C); });
    else timed(Phase::Norm, [&] { k::rmsnorm_backward(a.dresid, g(L.ln2_w), a.dln, A.resid_mid, p(L.ln2_w), A.ln2_rstd, N, C); });

    // resid_mid = x_in + proj(attention(rope(qkv(norm1(x_in)))))
    if (bf16_) {
      timed(Phase::Norm, [&] { to16(a.dresid, a.dresid16, N * C); });
      timed(Phase::Gemm, [&] { lin_bwd16(a.datty, g(L.proj_w), g(L.proj_b), a.dresid16, a.dresid, A.atty16, p16(L.proj_w), N, C, C); });
    } else {
      timed(Phase::Gemm, [&] { k::linear_backward(a.datty, g(L.proj_w), g(L.proj_b), a.dresid, A.atty, p(L.proj_w), N, C, C); });
    }
    k::AttentionDims d{};
    d.B = B; d.Tq = Tq; d.Tk = Tq; d.n_head = int(nh); d.n_kv_head = int(nkv); d.head_dim = int(hd);
    d.q_stride = d.kv_stride = QKV; d.q_batch_stride = d.kv_batch_stride = Tq * QKV;
    d.out_stride = C; d.out_batch_stride = Tq * C;
    timed(Phase::Attention, [&] { k::attention_backward<T>(a.dqkv, a.dqkv + nh * hd, a.dqkv + (nh + nkv) * hd, a.datty, A.qkv,
                             A.qkv + nh * hd, A.qkv + (nh + nkv) * hd, A.atty, A.lse, d); });
    if (!gpt2)
      timed(Phase::Attention, [&] { k::rope_backward(a.dqkv, N, Tq, 0, nh + nkv, hd, QKV, rope_cos_.data(), rope_sin_.data()); });
    if (bf16_) {
      timed(Phase::Attention, [&] { to16(a.dqkv, a.dqkv16, N * QKV); });
      timed(Phase::Gemm, [&] { lin_bwd16(a.dln, g(L.qkv_w), g(L.qkv_b), a.dqkv16, a.dqkv, A.ln1_16, p16(L.qkv_w), N, C, QKV); });
    } else {
      timed(Phase::Gemm, [&] { k::linear_backward(a.dln, g(L.qkv_w), g(L.qkv_b), a.dqkv, A.ln1, p(L.qkv_w), N, C, QKV); });
    }
    if (gpt2) timed(Phase::Norm, [&] { k::layernorm_backward(a.dresid, g(L.ln1_w), g(L.ln1_b), a.dln, x_in, p(L.ln1_w), A.ln1_mean, A.ln1_rstd, N, C); });
    else timed(Phase::Norm, [&] { k::rmsnorm_backward(a.dresid, g(L.ln1_w), a.dln, x_in, p(L.ln1_w), A.ln1_rstd, N, C); });
  }

  T* dwpe = gpt2 ? G + table_.specs[1].offset : nullptr;
  timed(Phase::Embedding, [&] { k::embedding_backward(G + table_.specs[0].offset, dwpe, a.dresid, inputs, N, Tq, C); });
}

template <typename T>
void Transformer<T>::start_cache(int B) {
  if (B <= 0 || B > max_batch_)
    fail("generation batch of ", B, " sequences; this model was set up for 1..", max_batch_);
  if (!cache_ || cache_->B != B) {
    cache_ = std::make_unique<Cache>();
    cache_->B = B;
    const size_t n = size_t(cfg_.n_layer) * B * max_len_ * cfg_.n_kv_head * cfg_.head_dim();
    cache_->k = Buffer<T>(n);
    cache_->v = Buffer<T>(n);
  }
  cache_->pos = 0;
}

template <typename T>
int Transformer<T>::cache_position() const { return cache_ ? cache_->pos : 0; }

template <typename T>
const T* Transformer<T>::decode(const int32_t* tokens, int B, int Tq) {
  TETRAD_CHECK(cache_ && cache_->B == B, "start_cache(B) must precede decode");
  forward(tokens, B, Tq, cache_->pos, true);
  cache_->pos += Tq;
  // Logits of the last new token of each sequence only: rows (b*Tq + Tq-1) of lnf.
  const int64_t C = cfg_.n_embd, V = cfg_.vocab_size;
  if (bf16_)
    timed(Phase::Gemm, [&] { gemm16(false, true, B, V, C, a_->lnf16 + int64_t(Tq - 1) * C, int64_t(Tq) * C,
                                    params16_.data() + HEAD_OFFSET(), C, T(0), a_->logits, V); });
  else
    timed(Phase::Gemm, [&] { k::gemm<T>(false, true, B, V, C, T(1), a_->lnf + int64_t(Tq - 1) * C, int64_t(Tq) * C,
               params_.data() + HEAD_OFFSET(), C, T(0), a_->logits, V); });
  return a_->logits;
}

template class Transformer<float>;
template class Transformer<double>;

}  // namespace tetrad
