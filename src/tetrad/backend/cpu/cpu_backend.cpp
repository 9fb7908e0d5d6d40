#include "tetrad/backend/cpu/cpu_backend.hpp"

#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "tetrad/backend/cpu/attention.hpp"
#include "tetrad/backend/cpu/attention_bf16.hpp"
#include "tetrad/backend/cpu/attention_merge.hpp"
#include "tetrad/backend/cpu/head_norm.hpp"
#include "tetrad/backend/ceilings.hpp"
#include "tetrad/backend/machine_cache.hpp"
#include "tetrad/backend/cpu/moe_ops.hpp"
#include "tetrad/backend/cpu/ops.hpp"
#include "tetrad/backend/cpu/precision.hpp"
#include "tetrad/backend/cpu/precision_auto.hpp"
#include "tetrad/backend/cpu/split_ops.hpp"
#include "tetrad/core/cpu.hpp"
#include "tetrad/core/error.hpp"

namespace tetrad::backend::cpu {

namespace k = ::tetrad::kernels;

namespace {

// ---- the queue: inline execution -------------------------------------------------------------

class InlineQueue final : public Queue {
 public:
  explicit InlineQueue(Backend& b) : Queue(b) {}
  void copy_to_device(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy_on_device(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes) std::memset(dst, 0, bytes);
  }
  Event record() override { return Event(); }  // everything submitted has already run
  void wait(const Event& e) override { e.synchronize(); }
  void synchronize() override {}

 private:
  static void copy(void* dst, const void* src, size_t bytes) {
    if (bytes && dst != src) std::memmove(dst, src, bytes);
  }
};

// ---- the op table: thin adapters onto the kernels -------------------------------------------

k::AttentionDims dims(const AttentionArgs& a) {
  if (a.dtype != DType::F32)
    fail("cpu backend: attention on ", dtype_name(a.dtype), "-stored q/k/v is not implemented "
         "(fp32 storage; bf16 products: AttentionArgs::precision)");
  k::AttentionDims d{};
  d.B = a.B; d.Tq = a.Tq; d.Tk = a.Tk; d.n_head = a.n_head; d.n_kv_head = a.n_kv_head;
  d.head_dim = a.head_dim;
  d.q_stride = a.q_stride; d.kv_stride = a.kv_stride; d.out_stride = a.out_stride;
  d.q_batch_stride = a.q_batch_stride; d.kv_batch_stride = a.kv_batch_stride;
  d.out_batch_stride = a.out_batch_stride;
  d.doc_start = a.doc_start;  // positions counted as q_offset, k_offset are: the kernels count
  d.doc_batch_stride = a.doc_batch_stride;  // from key 0 of the block (doc_shift)
  d.doc_shift = a.k_offset;
  d.chunk_B = a.chunk_B;
  return d;
}

// A GEMM operand as gemm_bf16 takes it: bf16-stored operands are read in place through their
// strides (no widening pass: the native matmul reads bf16, the emulated path widens once).
k::Bf16Operand operand(const void* p, DType t, int64_t ld) {
  if (t == DType::F32) return k::Bf16Operand::fp32(static_cast<const float*>(p), ld);
  if (t != DType::BF16) fail("cpu backend: GEMM operand type ", dtype_name(t), " (F32 or BF16)");
  return k::Bf16Operand::bf16_stored(static_cast<const uint16_t*>(p), ld);
}

void op_gemm(Queue&, const GemmArgs& g) {
  if (g.M == 0 || g.N == 0) return;
  if (g.K == 0) {  // no products: C = beta C (oneDNN's sgemm would leave C as it is)
    for (int64_t i = 0; i < g.M; ++i)
      for (int64_t j = 0; j < g.N; ++j) {
        float& c = g.C[i * g.ldc + j];
        c = g.beta == 0.0f ? 0.0f : g.beta * c;
      }
    return;
  }
  // A bf16-stored operand makes the product a bf16 one whatever g.precision says.
  const bool stored16 = g.a_type != DType::F32 || g.b_type != DType::F32;
  if (g.precision == Precision::BF16 || stored16) {
    const k::GemmProductForm form = g.product == GemmProduct::Plain ? k::GemmProductForm::kPlain
                                    : g.product == GemmProduct::Transposed
                                        ? k::GemmProductForm::kTransposed
                                        : k::GemmProductForm::kPolicy;
    k::gemm_bf16(g.trans_a, g.trans_b, g.M, g.N, g.K, g.alpha, operand(g.A, g.a_type, g.lda),
                 operand(g.B, g.b_type, g.ldb), g.beta, g.C, g.ldc, form);
    return;
  }
  const float* A = static_cast<const float*>(g.A);
  const float* B = static_cast<const float*>(g.B);
  const dnnl_status_t st = dnnl_sgemm(g.trans_a ? 'T' : 'N', g.trans_b ? 'T' : 'N', g.M, g.N, g.K,
                                      g.alpha, A, g.lda, B, g.ldb, g.beta, g.C, g.ldc);
  TETRAD_CHECK(st == dnnl_success, "dnnl_sgemm failed with status ", int(st), " for M=", g.M,
               " N=", g.N, " K=", g.K);
}

// Each group through op_gemm: a group computes exactly what one gemm of its shape does (oneDNN
// threads inside each product; the experts' GEMMs are large enough to fill the cores one by one).
void op_grouped_gemm(Queue& q, const GroupedGemmArgs& a) {
  GemmArgs g;
  g.trans_a = a.trans_a; g.trans_b = a.trans_b;
  g.alpha = a.alpha; g.beta = a.beta;
  g.lda = a.lda; g.ldb = a.ldb; g.ldc = a.ldc;
  g.precision = a.precision; g.a_type = a.a_type; g.b_type = a.b_type; g.product = a.product;
  for (int64_t i = 0; i < a.groups; ++i) {
    g.M = a.M[i]; g.N = a.N[i]; g.K = a.K[i];
    g.A = a.A[i]; g.B = a.B[i]; g.C = a.C[i];
    op_gemm(q, g);
  }
}

OpTable make_table() {
  OpTable t;
  t.gemm = op_gemm;
  t.grouped_gemm = op_grouped_gemm;
  t.bias_add = [](Queue&, float* out, const float* b, int64_t N, int64_t n) { bias_add(out, b, N, n); };
  t.residual_add = [](Queue&, float* out, const float* r, const float* y, const float* b, int64_t N,
                      int64_t C) { residual_add(out, r, y, b, N, C); };
  t.add = [](Queue&, float* x, const float* y, int64_t n) { k::add_inplace(x, y, n); };
  t.bias_grad = [](Queue&, float* db, const float* d, int64_t N, int64_t n) { bias_grad(db, d, N, n); };
  t.norm_row_stats = [](Queue&, RowStat s, double* st, int64_t stride, const float* x,
                        const float* mean, int64_t N, int64_t C) {
    norm_row_stats(s, st, stride, x, mean, N, C);
  };
  t.norm_finish_stats = [](Queue&, StatFinish f, float* out, const double* st, int64_t N,
                           int64_t C, float eps) { norm_finish_stats(f, out, st, N, C, eps); };
  t.norm_apply = [](Queue&, float* out, const float* x, const float* mean, const float* rstd,
                    const float* w, const float* b, int64_t N, int64_t C) {
    norm_apply(out, x, mean, rstd, w, b, N, C);
  };
  t.norm_backward_partials = [](Queue&, double* p, const float* d, const float* x,
                                const float* mean, const float* rstd, const float* w, int64_t N,
                                int64_t C) { norm_backward_partials(p, d, x, mean, rstd, w, N, C); };
  t.norm_backward_apply = [](Queue&, float* dx, const float* d, const float* x, const float* mean,
                             const float* rstd, const float* w, const double* p, int64_t N,
                             int64_t C, int64_t Cf) {
    norm_backward_apply(dx, d, x, mean, rstd, w, p, N, C, Cf);
  };
  t.norm_param_grads = [](Queue&, float* dw, float* db, const float* d, const float* x,
                          const float* mean, const float* rstd, int64_t N, int64_t C) {
    norm_param_grads(dw, db, d, x, mean, rstd, N, C);
  };
  t.attention_forward = [](Queue&, const AttentionArgs& a, void* out, float* lse, const void* q,
                           const void* kp, const void* v) {
    if (a.precision == Precision::BF16) {
      k::attention_forward_bf16(static_cast<float*>(out), lse, static_cast<const float*>(q),
                                static_cast<const float*>(kp), static_cast<const float*>(v),
                                dims(a), a.relative_q_offset());
      return;
    }
    k::attention_forward<float>(static_cast<float*>(out), lse, static_cast<const float*>(q),
                                static_cast<const float*>(kp), static_cast<const float*>(v),
                                dims(a), a.relative_q_offset());
  };
  t.attention_backward = [](Queue&, const AttentionArgs& a, void* dq, void* dk, void* dv,
                            const void* dout, const void* q, const void* kp, const void* v,
                            const void* out, const float* lse) {
    if (a.saved_bf16) {
      if (a.precision != Precision::BF16)
        fail("cpu backend: attention backward on bf16 copies of q/k/v/out needs bf16 products "
             "(AttentionArgs::precision BF16)");
      k::attention_backward_bf16_saved(
          static_cast<float*>(dq), static_cast<float*>(dk), static_cast<float*>(dv),
          static_cast<const float*>(dout), static_cast<const uint16_t*>(q),
          static_cast<const uint16_t*>(kp), static_cast<const uint16_t*>(v),
          static_cast<const uint16_t*>(out), lse, dims(a), a.relative_q_offset());
      return;
    }
    if (a.precision == Precision::BF16) {
      k::attention_backward_bf16(static_cast<float*>(dq), static_cast<float*>(dk),
                                 static_cast<float*>(dv), static_cast<const float*>(dout),
                                 static_cast<const float*>(q), static_cast<const float*>(kp),
                                 static_cast<const float*>(v), static_cast<const float*>(out),
                                 lse, dims(a), a.relative_q_offset());
      return;
    }
    k::attention_backward<float>(static_cast<float*>(dq), static_cast<float*>(dk),
                                 static_cast<float*>(dv), static_cast<const float*>(dout),
                                 static_cast<const float*>(q), static_cast<const float*>(kp),
                                 static_cast<const float*>(v), static_cast<const float*>(out), lse,
                                 dims(a), a.relative_q_offset());
  };
  t.attention_merge = [](Queue&, const AttentionArgs& a, void* out, float* lse, const void* out_b,
                         const float* lse_b) {
    k::attention_merge<float>(static_cast<float*>(out), lse, static_cast<const float*>(out_b),
                              lse_b, dims(a));
  };
  t.rope_forward = [](Queue&, const RopeArgs& r) {
    k::rope_forward(r.x, r.N, r.T_seq, r.pos0, r.n_heads, r.head_dim, r.stride, r.cos, r.sin,
                    r.doc_start);
  };
  t.rope_backward = [](Queue&, const RopeArgs& r) {
    k::rope_backward(r.x, r.N, r.T_seq, r.pos0, r.n_heads, r.head_dim, r.stride, r.cos, r.sin,
                     r.doc_start);
  };
  t.head_norm_forward = [](Queue&, const HeadNormArgs& a) { head_norm_forward(a); };
  t.head_norm_backward = [](Queue&, const HeadNormArgs& a) { head_norm_backward(a); };
  t.gelu_forward = [](Queue&, float* out, const float* x, int64_t n) { k::gelu_forward(out, x, n); };
  t.gelu_backward = [](Queue&, float* dx, const float* d, const float* x, int64_t n) {
    k::gelu_backward(dx, d, x, n);
  };
  t.swiglu_forward = [](Queue&, float* out, const float* gu, int64_t N, int64_t F) {
    k::swiglu_forward(out, gu, N, F);
  };
  t.swiglu_backward = [](Queue&, float* dgu, const float* d, const float* gu, int64_t N,
                         int64_t F) { k::swiglu_backward(dgu, d, gu, N, F); };
  t.embedding_gather = [](Queue&, float* out, const int32_t* tok, const float* table, int64_t v0,
                          int64_t Vs, int64_t N, int64_t C) {
    embedding_gather(out, tok, table, v0, Vs, N, C);
  };
  t.position_add = [](Queue&, float* out, const float* pos, int64_t N, int64_t T, int64_t C) {
    position_add(out, pos, N, T, C);
  };
  t.embedding_scatter_add = [](Queue&, float* d, int64_t s0, int64_t s1, const float* dout,
                               const int32_t* tok, int64_t v0, int64_t Vs, int64_t N, int64_t C) {
    embedding_scatter_add(d, s0, s1, dout, tok, v0, Vs, N, C);
  };
  t.position_grad = [](Queue&, float* dpos, const float* d, int64_t N, int64_t T, int64_t C) {
    position_grad(dpos, d, N, T, C);
  };
  t.ce_row_max = [](Queue&, float* mx, const float* L, int64_t N, int64_t Vs) { ce_row_max(mx, L, N, Vs); };
  t.ce_sum_exp_target = [](Queue&, double* st, const float* L, const float* mx,
                           const int32_t* tg, int64_t v0, int64_t Vs, int64_t N) {
    ce_sum_exp_target(st, L, mx, tg, v0, Vs, N);
  };
  t.ce_loss = [](Queue&, float* losses, double* total, const double* st, const float* mx,
                 const int32_t* tg, int64_t N) { ce_loss(losses, total, st, mx, tg, N); };
  t.ce_grad = [](Queue&, float* L, const float* mx, const double* st, const int32_t* tg,
                 int64_t v0, int64_t Vs, int64_t N, float gs) { ce_grad(L, mx, st, tg, v0, Vs, N, gs); };
  t.row_argmax = [](Queue&, int32_t* idx, float* val, const float* L, int64_t N, int64_t Vs,
                    int64_t ld) { row_argmax(idx, val, L, N, Vs, ld); };
  t.sum_squares = [](Queue&, double* out, const float* x, int64_t n) { *out = k::sum_squares(x, n); };
  t.cast_f32_to_bf16 = [](Queue&, uint16_t* out, const float* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; ++i) out[i] = k::float_to_bf16(x[i]);
  };
  t.cast_bf16_to_f32 = [](Queue&, float* out, const uint16_t* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; ++i) out[i] = k::bf16_to_float(x[i]);
  };
  t.round_to_bf16 = [](Queue&, float* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; ++i) x[i] = k::round_to_bf16(x[i]);
  };
  t.adamw = [](Queue&, const AdamWArgs& a) {
    if (a.p16)
      k::adamw_update_bf16(a.p, a.p16, a.g, a.m, a.v, a.n, a.lr, a.beta1, a.beta2, a.eps,
                           a.weight_decay, a.grad_scale, a.step);
    else
      k::adamw_update<float>(a.p, a.g, a.m, a.v, a.n, a.lr, a.beta1, a.beta2, a.eps,
                             a.weight_decay, a.grad_scale, a.step);
  };
  t.moe_permute = [](Queue&, float* out, const float* x, const int32_t* s, int64_t N, int64_t k,
                     int64_t C) { k::moe_permute(out, x, s, N, k, C); };
  t.moe_permute_backward = [](Queue&, float* dx, const float* d, const int32_t* s, int64_t N,
                              int64_t k, int64_t C) { k::moe_permute_backward(dx, d, s, N, k, C); };
  t.moe_unpermute = [](Queue&, float* y, const float* e, const float* w, const int32_t* s,
                       int64_t N, int64_t k, int64_t C) { k::moe_unpermute(y, e, w, s, N, k, C); };
  t.moe_unpermute_backward = [](Queue&, float* de, float* dw, const float* dy, const float* e,
                                const float* w, const int32_t* s, int64_t N, int64_t k, int64_t C) {
    k::moe_unpermute_backward(de, dw, dy, e, w, s, N, k, C);
  };
  t.cross_entropy_fused = [](Queue&, float* L, float* losses, double* total, const int32_t* tg,
                             int64_t N, int64_t V, float gs) {
    *total = k::cross_entropy_fused<float>(L, losses, tg, N, V, gs);
  };
  t.norm_apply_bf16 = [](Queue&, uint16_t* out, const float* x, const float* mean,
                         const float* rstd, const float* w, const float* b, int64_t N, int64_t C) {
    norm_apply_bf16(out, x, mean, rstd, w, b, N, C);
  };
  t.gelu_forward_bf16 = [](Queue&, uint16_t* out, const float* x, int64_t n) {
    k::gelu_forward_bf16(out, x, n);
  };
  t.swiglu_forward_bf16 = [](Queue&, uint16_t* out, const float* gu, int64_t N, int64_t F) {
    k::swiglu_forward_bf16(out, gu, N, F);
  };
  t.gelu_forward_bf16_x = [](Queue&, uint16_t* out, uint16_t* x16, const float* x, int64_t n) {
    k::gelu_forward_bf16_x(out, x16, x, n);
  };
  t.swiglu_forward_bf16_x = [](Queue&, uint16_t* out, uint16_t* gu16, const float* gu, int64_t N,
                               int64_t F) { k::swiglu_forward_bf16_x(out, gu16, gu, N, F); };
  t.gelu_backward_x16 = [](Queue&, float* dx, const float* d, const uint16_t* x16, int64_t n) {
    k::gelu_backward_x16(dx, d, x16, n);
  };
  t.swiglu_backward_x16 = [](Queue&, float* dgu, const float* d, const uint16_t* gu16, int64_t N,
                             int64_t F) { k::swiglu_backward_x16(dgu, d, gu16, N, F); };
  t.cast_transpose_f32_to_bf16 = [](Queue&, uint16_t* out, uint16_t* out_t, const float* x,
                                    int64_t rows, int64_t cols) {
    cast_transpose_to_bf16(out, out_t, x, rows, cols);
  };
  t.ce_row_max_sum_exp_target = [](Queue&, float* mx, double* st, const float* L,
                                   const int32_t* tg, int64_t v0, int64_t Vs, int64_t N) {
    ce_row_max_sum_exp_target(mx, st, L, tg, v0, Vs, N);
  };
  t.ce_grad_bf16 = [](Queue&, uint16_t* out, uint16_t* out_t, const float* L, const float* mx,
                      const double* st, const int32_t* tg, int64_t v0, int64_t Vs, int64_t N,
                      float gs) { ce_grad_bf16(out, out_t, L, mx, st, tg, v0, Vs, N, gs); };
  return t;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

const OpTable& op_table() {
  static const OpTable t = [] {
    OpTable table = make_table();
    check_op_table(table, "cpu");
    return table;
  }();
  return t;
}

CpuBackend::CpuBackend() : queue_(std::make_unique<InlineQueue>(*this)) {
  caps_.host_visible = true;
  caps_.dtype_f32 = caps_.dtype_bf16 = caps_.dtype_f64 = true;
  caps_.gemm_bf16 = true;  // native where the CPU has bf16 matrix units, emulated elsewhere
  caps_.gemm_bf16_native = k::native_bf16_matmul();
  caps_.gemm_bf16_storage = true;
  caps_.gemm_product_forms = true;  // GemmArgs::product: plain or transposed product (native bf16)
  caps_.adamw_bf16_copy = true;
  caps_.attention_bf16 = false;
  caps_.attention_bf16_products = true;  // native on bf16 matrix units, emulated elsewhere
  // Measured faster than the fp32 kernel only on AMX (docs/precision.md, "bf16 attention").
  caps_.attention_bf16_faster = k::attention_bf16_default_path() == k::AttentionBf16Path::kAmx;
  caps_.attention_any_q_offset = true;  // fp32 and bf16 kernels
  caps_.attention_document_mask = true;  // fp32 and bf16 kernels
  caps_.fused_cross_entropy = true;
  caps_.bf16_producers = true;
  caps_.bf16_stash_fused = true;
  caps_.attention_bf16_saved = caps_.attention_bf16_products;
  caps_.bf16_loss_grad = true;
  caps_.ce_row_stats_fused = true;
  caps_.gemm_bf16_path = k::bf16_matmul_path();
}

CpuBackend::~CpuBackend() = default;

std::string CpuBackend::description() const {
  return "cpu: " + cpu_features().summary() + "; bf16 GEMMs " + caps_.gemm_bf16_path +
         "; bf16 attention " + k::attention_bf16_path();
}

std::unique_ptr<Queue> CpuBackend::new_queue() { return std::make_unique<InlineQueue>(*this); }

void* CpuBackend::allocate(size_t bytes, MemoryKind) {
  const size_t rounded = ((bytes + 63) / 64) * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) fail("cpu backend: out of host memory allocating ", bytes, " bytes");
  std::memset(p, 0, rounded);
  return p;
}

void CpuBackend::deallocate(void* p, size_t, MemoryKind) noexcept { std::free(p); }

// The MFU baseline: the register-only peak of the arithmetic the GEMMs use (ceilings.hpp),
// the best measured on this machine: this run's and the best earlier run's (machine_cache.hpp).
// A register loop can only be slowed by other work, never sped up, so the largest figure is the
// truest: one start-up measurement disturbed by another process made a bf16 run read "MFU
// 146.0%" (issue 29).
DevicePeak CpuBackend::peak(Precision p, int threads) {
  const bool bf16 = p == Precision::BF16;
  if (threads <= 0) threads = omp_get_max_threads();
  const Measurement m = bf16 ? measure_bf16_peak(threads) : measure_fma_peak(threads);
  std::string off, note;
  const std::string path = machine_cache_path(&off);
  double cached = 0;
  const nlohmann::json v = machine_cache_update(
      path, std::string("peak ") + (bf16 ? "bf16" : "fp32") + " v1 | " + m.basis + " | " +
                machine_key(threads),
      [&](const nlohmann::json& c) -> nlohmann::json {
        cached = c.is_object() ? c.value("gflops", 0.0) : 0.0;
        if (cached >= m.value) return nullptr;
        return {{"gflops", m.value}};
      },
      &note);
  const double best = std::max(m.value, cached);
  std::string how = m.basis + ", ";
  auto g = [](double x) { return std::to_string(int64_t(x + 0.5)); };
  if (path.empty()) how += "measured now (not cached: " + off + ")";
  else if (cached > m.value) how += "best measured on this machine (now " + g(m.value) + ")";
  else how += "best measured on this machine: now";
  if (!note.empty()) how += "; " + note;
  return {best, std::string(bf16 ? "bf16 matrix peak" : "fp32 FMA peak") + " (" + how + ")"};
}

PrecisionChoice CpuBackend::auto_precision() const {
  return {k::auto_precision(), k::auto_precision_reason()};
}

Bf16Status CpuBackend::bf16_status() const {
  return {caps_.gemm_bf16_native && k::native_bf16_matmul(), k::bf16_matmul_path(),
          k::attention_bf16_path(), k::gemm_layout_report()};
}

// A quick ceiling: the best of a few fp32 (and, when native, bf16) GEMMs on a square and a large
// copy. backend/ceilings measures the same with more detail (FMA peak, the model's own shapes).
DeviceCeilings CpuBackend::ceilings(int threads, bool quick) {
  DeviceCeilings c;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads > 0 ? threads : num_cores());
  const int64_t n = quick ? 512 : 2048;
  const int reps = quick ? 2 : 4;
  std::vector<float> a(size_t(n * n), 0.5f), b(size_t(n * n), 0.25f), out(size_t(n * n));
  auto best_gflops = [&](Precision p) {
    double best = 0;
    GemmArgs g;
    g.M = g.N = g.K = n; g.A = a.data(); g.B = b.data(); g.C = out.data();
    g.lda = g.ldb = g.ldc = n; g.precision = p;
    op_gemm(*queue_, g);  // warm-up
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      op_gemm(*queue_, g);
      best = std::max(best, 2.0 * double(n) * n * n / seconds_since(t0) / 1e9);
    }
    return best;
  };
  c.gemm_fp32_gflops = best_gflops(Precision::FP32);
  if (caps_.gemm_bf16_native) c.gemm_bf16_gflops = best_gflops(Precision::BF16);
  else c.skipped = "bf16: " + caps_.gemm_bf16_path;
  const size_t bytes = size_t(quick ? 32 : 256) << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  double best_bw = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    best_bw = std::max(best_bw, 2.0 * double(bytes) / seconds_since(t0) / 1e9);
  }
  c.memory_gbs = best_bw;
  c.measured = true;
  c.method = "best of " + std::to_string(reps) + " " + std::to_string(n) + "^3 GEMMs (oneDNN), " +
             "memcpy of " + std::to_string(bytes >> 20) + " MiB (read + write counted)";
  omp_set_num_threads(saved);
  return c;
}

}  // namespace tetrad::backend::cpu
