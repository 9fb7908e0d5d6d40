// The CUDA backend (cuda_backend.hpp): queue, memory, capabilities, ceilings and the op table as
// thin adapters onto kernels.hpp and gemm.hpp.
#include "tetrad/backend/cuda/cuda_backend.hpp"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "tetrad/backend/cuda/gemm.hpp"
#include "tetrad/backend/cuda/gemm_mapping.hpp"
#include "tetrad/backend/cuda/moe_kernels.hpp"
#include "tetrad/backend/cuda/gpu_api.hpp"
#include "tetrad/backend/cuda/kernels.hpp"
#include "tetrad/backend/gpu_parts.hpp"
#include "tetrad/core/error.hpp"

namespace tetrad::backend::cuda {

namespace g = ::tetrad::gpu;

namespace {

std::atomic<int> g_attention_bf16{-1};  // -1: not decided yet (read the environment once)

bool attention_bf16_from_env() {
  const char* v = std::getenv("TETRAD_CUDA_ATTENTION");
  if (!v || std::strcmp(v, "fp32") == 0) return false;
  if (std::strcmp(v, "bf16") == 0) return true;
  fail("TETRAD_CUDA_ATTENTION='", v, "' is not 'fp32' or 'bf16'");
}

// ---- events and queues -----------------------------------------------------------------------

class CudaEvent final : public Event::Impl {
 public:
  CudaEvent() { GPU_CHECK(g::gpuEventCreate(&e_, false)); }
  ~CudaEvent() override {
    if (e_) g::gpuEventDestroy(e_);
  }
  bool query() override {
    const g::gpuError_t r = g::gpuEventQuery(e_);
    if (r == g::gpuSuccess) return true;
    if (r == g::gpuErrorNotReady) return false;
    g::gpu_fail("cudaEventQuery", __FILE__, __LINE__, r);
  }
  void synchronize() override { GPU_CHECK(g::gpuEventSynchronize(e_)); }
  NativeEvent native() const override { return {NativeEvent::Kind::CudaEvent, e_}; }
  g::gpuEvent_t handle() const { return e_; }

 private:
  g::gpuEvent_t e_ = nullptr;
};

class CudaBackend;

class CudaQueue final : public Queue {
 public:
  CudaQueue(Backend& b, int device) : Queue(b), device_(device) {
    GPU_CHECK(g::gpuSetDevice(device_));
    GPU_CHECK(g::gpuStreamCreate(&s_));
  }
  ~CudaQueue() override {
    if (s_) {
      g::gpuStreamSynchronize(s_);
      gemm_.reset();
      if (work_) g::gpuFree(work_);
      g::gpuStreamDestroy(s_);
    }
  }
  g::gpuStream_t stream() const { return s_; }

  // Per queue, so that ops on different streams never share scratch: the cuBLASLt plans and
  // workspace, and the reduction scratch (grows during the first step only; a resize waits for
  // this stream's earlier work, which may still read the old buffer).
  g::Gemm& gemm() {
    if (!gemm_) {
      GPU_CHECK(g::gpuSetDevice(device_));  // the handle and workspace belong to this device
      gemm_ = std::make_unique<g::Gemm>();
    }
    return *gemm_;
  }
  void* workspace(size_t bytes) {
    if (bytes <= work_bytes_) return work_;
    GPU_CHECK(g::gpuStreamSynchronize(s_));
    if (work_) GPU_CHECK(g::gpuFree(work_));
    work_ = nullptr;
    const size_t want = std::max(bytes, work_bytes_ * 2);
    const g::gpuError_t e = g::gpuMalloc(&work_, want);
    if (e != g::gpuSuccess) {
      work_bytes_ = 0;
      fail("cuda backend: cannot allocate ", want, " bytes of scratch on device ", device_, ": ",
           g::gpu_error_string(e));
    }
    work_bytes_ = want;
    return work_;
  }

  void copy_to_device(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy_on_device(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy_rows_on_device(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                           size_t row_bytes, size_t rows) override {  // one call, not one a row
    if (row_bytes && rows)
      GPU_CHECK(g::gpuMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, s_));
  }
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes) GPU_CHECK(g::gpuMemsetAsync(dst, 0, bytes, s_));
  }
  Event record() override {
    auto e = std::make_shared<CudaEvent>();
    GPU_CHECK(g::gpuEventRecord(e->handle(), s_));
    return Event(e);
  }
  void wait(const Event& e) override {
    if (!e.impl()) return;  // a complete event
    const NativeEvent n = e.native();
    if (n.kind != NativeEvent::Kind::CudaEvent) {
      // An event of another kind (the CPU's are always complete; an MPI request): the host waits.
      e.synchronize();
      return;
    }
    // A CUDA event of any stream: this queue's, another queue's, an NCCL communicator's.
    GPU_CHECK(g::gpuStreamWaitEvent(s_, static_cast<g::gpuEvent_t>(n.handle)));
  }
  void synchronize() override { GPU_CHECK(g::gpuStreamSynchronize(s_)); }

 private:
  void copy(void* dst, const void* src, size_t bytes) {
    if (bytes && dst != src) GPU_CHECK(g::gpuMemcpyAsync(dst, src, bytes, s_));
  }
  int device_;
  g::gpuStream_t s_ = nullptr;
  std::unique_ptr<g::Gemm> gemm_;
  void* work_ = nullptr;
  size_t work_bytes_ = 0;
};

// ---- the backend -----------------------------------------------------------------------------

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    GPU_CHECK(g::gpuSetDevice(device_));
    info_ = g::device_info(device_);
    if (info_.cc_major < 8)
      fail("cuda backend: device ", device_, " (", info_.name, ") has compute capability ",
           info_.cc_major, ".", info_.cc_minor, "; tetrad's CUDA kernels need 8.0 or newer");
    queue_ = std::make_unique<CudaQueue>(*this, device_);
    caps_.host_visible = false;
    caps_.dtype_f32 = true;
    caps_.dtype_bf16 = true;
    caps_.dtype_f64 = true;
    caps_.gemm_bf16 = true;
    caps_.gemm_bf16_native = true;
    caps_.gemm_bf16_storage = true;
    caps_.attention_bf16 = false;  // bf16 *storage* of q/k/v: not yet (the arithmetic: see header)
    caps_.attention_bf16_products = true;
    // Not the default of bf16 runs until measured on a GPU against the fp32 path (docs/gpu.md):
    // train.attention_precision = "bf16" or TETRAD_CUDA_ATTENTION=bf16 choose it.
    caps_.attention_bf16_faster = false;
    caps_.attention_any_q_offset = true;
    caps_.attention_document_mask = true;
    caps_.fused_cross_entropy = true;
    // Not yet: norm / activation kernels writing bf16 and the cast-transpose (the model casts
    // fp32 outputs with cast_f32_to_bf16 instead).
    caps_.bf16_producers = false;
    caps_.adamw_bf16_copy = true;  // AdamWArgs::p16 written in the update's pass
    caps_.gemm_bf16_path = "cuBLASLt bf16 tensor cores, fp32 accumulation";
    if (g_attention_bf16.load() < 0) g_attention_bf16 = attention_bf16_from_env() ? 1 : 0;
  }
  ~CudaBackend() override {
    if (queue_) queue_->synchronize();
  }

  std::string name() const override { return "cuda:" + std::to_string(device_); }
  std::string description() const override {
    return detail::concat(info_.name, ", compute capability ", info_.cc_major, ".", info_.cc_minor,
                          ", ", info_.sms, " SMs, ", info_.total_bytes >> 20, " MiB; cuBLASLt");
  }
  const Capabilities& capabilities() const override { return caps_; }
  const OpTable& ops() const override;
  Queue& queue() override { return *queue_; }
  std::unique_ptr<Queue> new_queue() override { return std::make_unique<CudaQueue>(*this, device_); }
  DeviceCeilings ceilings(int threads, bool quick) override;
  DevicePeak peak(Precision p, int threads) override;
  bool host_readable(const void* p) const override { return g::gpuHostReadable(p); }
  // The device's free memory now (cudaMemGetInfo: the context's own reserve is already taken).
  MemoryAvailable memory_available() const override {
    GPU_CHECK(g::gpuSetDevice(device_));
    size_t free_b = 0, total_b = 0;
    GPU_CHECK(g::gpuMemGetInfo(&free_b, &total_b));
    MemoryAvailable m;
    m.available = free_b;
    m.total = total_b;
    m.source = "cudaMemGetInfo";
    m.host_shared = false;
    m.devices = std::max(1, g::device_count(nullptr));
    m.index = device_;
    return m;
  }

  const g::DeviceInfo& info() const { return info_; }

 protected:
  void* allocate(size_t bytes, MemoryKind kind) override {
    GPU_CHECK(g::gpuSetDevice(device_));
    const size_t rounded = (bytes + 255) / 256 * 256;
    void* p = nullptr;
    if (kind == MemoryKind::HostStaging) {
      const g::gpuError_t e = g::gpuMallocHost(&p, rounded);
      if (e != g::gpuSuccess)
        fail("cuda backend: cannot allocate ", bytes, " bytes of pinned host staging memory: ",
             g::gpu_error_string(e));
      std::memset(p, 0, rounded);
      return p;
    }
    const g::gpuError_t e = g::gpuMalloc(&p, rounded);
    if (e != g::gpuSuccess) {
      size_t free_b = 0, total_b = 0;
      g::gpuMemGetInfo(&free_b, &total_b);
      fail("cuda backend: cannot allocate ", bytes, " bytes on ", name(), " (", info_.name,
           "): ", g::gpu_error_string(e), "; ", free_b >> 20, " MiB free of ", total_b >> 20,
           " MiB");
    }
    GPU_CHECK(g::gpuMemsetAsync(p, 0, rounded, queue_->stream()));
    GPU_CHECK(g::gpuStreamSynchronize(queue_->stream()));  // zero before any other queue uses it
    return p;
  }
  void deallocate(void* p, size_t, MemoryKind kind) noexcept override {
    if (kind == MemoryKind::HostStaging) g::gpuFreeHost(p);
    else g::gpuFree(p);
  }

 private:
  int device_;
  g::DeviceInfo info_;
  Capabilities caps_;
  std::unique_ptr<CudaQueue> queue_;
};

g::gpuStream_t stream_of(Queue& q) { return static_cast<CudaQueue&>(q).stream(); }
CudaQueue& queue_of(Queue& q) { return static_cast<CudaQueue&>(q); }

// ---- op adapters -------------------------------------------------------------------------------

void op_gemm(Queue& q, const GemmArgs& a) {
  g::GemmCall c;
  c.trans_a = a.trans_a;
  c.trans_b = a.trans_b;
  c.M = a.M;
  c.N = a.N;
  c.K = a.K;
  c.alpha = a.alpha;
  c.beta = a.beta;
  c.A = a.A;
  c.lda = a.lda;
  c.B = a.B;
  c.ldb = a.ldb;
  c.C = a.C;
  c.ldc = a.ldc;
  auto type = [](DType t, const char* which) {
    if (t == DType::F32) return g::GemmType::F32;
    if (t == DType::BF16) return g::GemmType::BF16;
    fail("cuda backend: GEMM operand ", which, " in ", dtype_name(t), " (f32 or bf16 only)");
  };
  c.a_type = type(a.a_type, "A");
  c.b_type = type(a.b_type, "B");
  // A bf16-stored operand makes the product a bf16 one whatever a.precision says (as the CPU).
  const bool any_bf16 = c.a_type == g::GemmType::BF16 || c.b_type == g::GemmType::BF16;
  c.math = a.precision == Precision::BF16 || any_bf16 ? g::GemmMath::BF16 : g::GemmMath::FP32;
  if (c.math == g::GemmMath::BF16 && a.K > 0 && a.M > 0 && a.N > 0) {
    // bf16 math rounds every fp32-stored operand to bf16 (nearest even, the CPU's rounding) into
    // scratch, then runs bf16 x bf16 with fp32 accumulation (gemm.hpp). One workspace request
    // for both, so the second cannot move the first.
    const g::GemmCasts casts =
        g::plan_gemm_casts(a.trans_a, a.trans_b, a.M, a.N, a.K, a.lda, a.ldb,
                           c.a_type == g::GemmType::F32, c.b_type == g::GemmType::F32);
    if (casts.bytes > 0) {
      auto* base = static_cast<unsigned char*>(queue_of(q).workspace(casts.bytes));
      for (const g::GemmCasts::Operand& o : {casts.a, casts.b}) {
        if (!o.cast) continue;
        auto* tmp = reinterpret_cast<uint16_t*>(base + o.offset);
        g::cast_f32_to_bf16(tmp, o.cols, static_cast<const float*>(o.is_a ? a.A : a.B), o.ld,
                            o.rows, o.cols, stream_of(q));
        if (o.is_a) {
          c.A = tmp;
          c.lda = o.cols;
          c.a_type = g::GemmType::BF16;
        } else {
          c.B = tmp;
          c.ldb = o.cols;
          c.b_type = g::GemmType::BF16;
        }
      }
    }
  }
  queue_of(q).gemm().run(c, stream_of(q));
}

// A loop of op_gemm on the queue's stream: each group is exactly one cuBLASLt product of its
// shape (bf16 casts included), so a group gives what a dense layer of that shape gives.
// cublasGemmGroupedBatchedEx would save launches but takes no bf16-rounded fp32 operands.
void op_grouped_gemm(Queue& q, const GroupedGemmArgs& a) {
  GemmArgs g;
  g.trans_a = a.trans_a;
  g.trans_b = a.trans_b;
  g.alpha = a.alpha;
  g.beta = a.beta;
  g.lda = a.lda;
  g.ldb = a.ldb;
  g.ldc = a.ldc;
  g.precision = a.precision;
  g.a_type = a.a_type;
  g.b_type = a.b_type;
  g.product = a.product;
  for (int64_t i = 0; i < a.groups; ++i) {
    g.M = a.M[i];
    g.N = a.N[i];
    g.K = a.K[i];
    g.A = a.A[i];
    g.B = a.B[i];
    g.C = a.C[i];
    if (g.M == 0 || g.N == 0) continue;
    op_gemm(q, g);
  }
}

g::AttnDims attn_dims(const AttentionArgs& a) {
  if (a.dtype != DType::F32)
    fail("cuda backend: attention on ", dtype_name(a.dtype), "-stored q/k/v is not implemented "
         "(fp32 storage; bf16 arithmetic with TETRAD_CUDA_ATTENTION=bf16)");
  if (a.saved_bf16)
    fail("cuda backend: attention backward on bf16 copies of q/k/v/out (AttentionArgs::saved_bf16) "
         "is not implemented (Capabilities::attention_bf16_saved)");
  g::AttnDims d{};
  d.B = a.B;
  d.Tq = a.Tq;
  d.Tk = a.Tk;
  d.n_head = a.n_head;
  d.n_kv_head = a.n_kv_head;
  d.head_dim = a.head_dim;
  d.q_offset = a.relative_q_offset();
  d.q_stride = a.q_stride;
  d.kv_stride = a.kv_stride;
  d.out_stride = a.out_stride;
  d.q_batch_stride = a.q_batch_stride;
  d.kv_batch_stride = a.kv_batch_stride;
  d.out_batch_stride = a.out_batch_stride;
  d.doc_start = a.doc_start;  // positions counted as q_offset, k_offset are: the kernels count
  d.doc_batch_stride = a.doc_batch_stride;  // from key 0 of the block (doc_shift)
  d.doc_shift = a.k_offset;
  return d;
}
// bf16 tensor cores when the call asks for bf16 products or the process chose them (header).
g::AttnPath attn_path(const AttentionArgs& a) {
  return a.precision == Precision::BF16 || g_attention_bf16.load() == 1 ? g::AttnPath::kBf16
                                                                        : g::AttnPath::kF32;
}

// The fused cross-entropy's target check, as the CPU's (kernels::check_targets): an Error naming
// the first target >= V, before the op writes anything. One small read back and a wait on the
// stream: the op is for one rank holding the whole vocabulary, and the host reads its total next.
void check_targets_below(int64_t* first_dev, const int32_t* targets, int64_t N, int64_t V,
                         g::gpuStream_t s) {
  g::first_target_at_or_above(first_dev, targets, N, V, s);
  int64_t first = N;
  GPU_CHECK(g::gpuMemcpyAsync(&first, first_dev, sizeof(first), s));
  GPU_CHECK(g::gpuStreamSynchronize(s));
  if (first >= N) return;
  int32_t id = 0;
  GPU_CHECK(g::gpuMemcpyAsync(&id, targets + first, sizeof(id), s));
  GPU_CHECK(g::gpuStreamSynchronize(s));
  fail("target token id ", id, " at position ", first, " is outside the model's vocabulary [0, ",
       V, ")");
}

OpTable make_table() {
  OpTable t;
  t.gemm = op_gemm;
  t.grouped_gemm = op_grouped_gemm;
  t.bias_add = [](Queue& q, float* out, const float* b, int64_t N, int64_t n) {
    g::add_bias(out, b, N, n, n, stream_of(q));
  };
  t.residual_add = [](Queue& q, float* out, const float* r, const float* y, const float* b,
                      int64_t N, int64_t C) { g::residual_add(out, r, y, b, N, C, stream_of(q)); };
  t.add = [](Queue& q, float* x, const float* y, int64_t n) { g::add_inplace(x, y, n, stream_of(q)); };
  t.bias_grad = [](Queue& q, float* db, const float* dout, int64_t N, int64_t n) {
    float* scratch = static_cast<float*>(
        queue_of(q).workspace(size_t(g::column_sum_scratch(N, n)) * sizeof(float)));
    g::bias_backward(db, dout, N, n, n, scratch, stream_of(q));
  };
  t.norm_row_stats = [](Queue& q, RowStat stat, double* stats, int64_t stride, const float* x,
                        const float* mean, int64_t N, int64_t C) {
    if (stat == RowStat::CenteredSquares && !mean)
      fail("cuda backend: norm_row_stats(CenteredSquares) needs the mean");
    g::norm_row_sums(stats, stride, x, stat == RowStat::CenteredSquares ? mean : nullptr,
                     stat == RowStat::Squares, N, C, stream_of(q));
  };
  t.norm_finish_stats = [](Queue& q, StatFinish f, float* out, const double* stats, int64_t N,
                           int64_t C_full, float eps) {
    if (f == StatFinish::Mean) g::norm_finish_mean(out, stats, N, C_full, stream_of(q));
    else g::norm_finish_rstd(out, stats, N, C_full, eps, stream_of(q));
  };
  t.norm_apply = [](Queue& q, float* out, const float* x, const float* mean, const float* rstd,
                    const float* w, const float* b, int64_t N, int64_t C) {
    g::norm_apply(out, x, mean, rstd, w, b, N, C, stream_of(q));
  };
  t.norm_backward_partials = [](Queue& q, double* p, const float* dout, const float* x,
                                const float* mean, const float* rstd, const float* w, int64_t N,
                                int64_t C) {
    g::norm_backward_partials(p, dout, x, mean, rstd, w, N, C, stream_of(q));
  };
  t.norm_backward_apply = [](Queue& q, float* dx, const float* dout, const float* x,
                             const float* mean, const float* rstd, const float* w,
                             const double* p, int64_t N, int64_t C, int64_t C_full) {
    g::norm_backward_apply(dx, dout, x, mean, rstd, w, p, N, C, C_full, stream_of(q));
  };
  t.norm_param_grads = [](Queue& q, float* dw, float* db, const float* dout, const float* x,
                          const float* mean, const float* rstd, int64_t N, int64_t C) {
    float* scratch = static_cast<float*>(
        queue_of(q).workspace(2 * size_t(g::column_sum_scratch(N, C)) * sizeof(float)));
    g::norm_weight_grad(dw, db, dout, x, mean, rstd, N, C, scratch, stream_of(q));
  };
  t.attention_forward = [](Queue& q, const AttentionArgs& d, void* out, float* lse,
                           const void* qp, const void* kp, const void* vp) {
    g::attention_forward(static_cast<float*>(out), lse, static_cast<const float*>(qp),
                         static_cast<const float*>(kp), static_cast<const float*>(vp),
                         attn_dims(d), attn_path(d), stream_of(q));
  };
  t.attention_merge = [](Queue& q, const AttentionArgs& d, void* out, float* lse,
                         const void* out_b, const float* lse_b) {
    g::attention_merge(static_cast<float*>(out), lse, static_cast<const float*>(out_b), lse_b,
                       attn_dims(d), stream_of(q));
  };
  t.attention_backward = [](Queue& q, const AttentionArgs& d, void* dq, void* dk, void* dv,
                            const void* dout, const void* qp, const void* kp, const void* vp,
                            const void* out, const float* lse) {
    g::attention_backward(static_cast<float*>(dq), static_cast<float*>(dk),
                          static_cast<float*>(dv), static_cast<const float*>(dout),
                          static_cast<const float*>(qp), static_cast<const float*>(kp),
                          static_cast<const float*>(vp), static_cast<const float*>(out), lse,
                          attn_dims(d), attn_path(d), stream_of(q));
  };
  t.rope_forward = [](Queue& q, const RopeArgs& r) {
    g::rope_forward(r.x, r.N, r.T_seq, r.pos0, r.n_heads, r.head_dim, r.stride, r.cos, r.sin,
                    r.doc_start, stream_of(q));
  };
  t.rope_backward = [](Queue& q, const RopeArgs& r) {
    g::rope_backward(r.x, r.N, r.T_seq, r.pos0, r.n_heads, r.head_dim, r.stride, r.cos, r.sin,
                     r.doc_start, stream_of(q));
  };
  t.head_norm_forward = [](Queue& q, const HeadNormArgs& a) {
    g::head_norm_forward(a.x, a.rstd, a.saved, a.w, a.N, a.n_heads, a.head_dim, a.stride, a.eps,
                         stream_of(q));
  };
  t.head_norm_backward = [](Queue& q, const HeadNormArgs& a) {
    if (!a.saved || !a.dw)
      fail("head_norm_backward: needs the forward's saved input and a weight gradient (saved, dw "
           "not null)");
    g::head_norm_backward(a.x, a.dw, a.saved, a.rstd, a.w, a.N, a.n_heads, a.head_dim, a.stride,
                          stream_of(q));
  };
  t.gelu_forward = [](Queue& q, float* out, const float* x, int64_t n) {
    g::gelu_forward(out, x, n, stream_of(q));
  };
  t.gelu_backward = [](Queue& q, float* dx, const float* dout, const float* x, int64_t n) {
    g::gelu_backward(dx, dout, x, n, stream_of(q));
  };
  t.swiglu_forward = [](Queue& q, float* out, const float* gu, int64_t N, int64_t F) {
    g::swiglu_forward(out, gu, N, F, stream_of(q));
  };
  t.swiglu_backward = [](Queue& q, float* dgu, const float* dout, const float* gu, int64_t N,
                         int64_t F) { g::swiglu_backward(dgu, dout, gu, N, F, stream_of(q)); };
  t.embedding_gather = [](Queue& q, float* out, const int32_t* tokens, const float* table,
                          int64_t v0, int64_t Vs, int64_t N, int64_t C) {
    // Tokens were validated by the caller (the table's contract): no device-side flag.
    g::embedding_forward(out, tokens, table, nullptr, N, 1, C, v0, Vs, INT64_MAX, nullptr,
                         stream_of(q));
  };
  t.position_add = [](Queue& q, float* out, const float* pos, int64_t N, int64_t T, int64_t C) {
    g::position_add(out, pos, N, T, C, stream_of(q));
  };
  t.embedding_scatter_add = [](Queue& q, float* d, int64_t s0, int64_t s1, const float* dout,
                               const int32_t* tok, int64_t v0, int64_t Vs, int64_t N, int64_t C) {
    g::embedding_scatter_add(d, s0, s1, dout, tok, v0, Vs, N, C, stream_of(q));
  };
  t.position_grad = [](Queue& q, float* dpos, const float* dout, int64_t N, int64_t T, int64_t C) {
    g::position_grad(dpos, dout, N, T, C, stream_of(q));
  };
  t.ce_row_max = [](Queue& q, float* mx, const float* L, int64_t N, int64_t Vs) {
    g::ce_row_max(mx, L, Vs, N, Vs, stream_of(q));
  };
  t.ce_sum_exp_target = [](Queue& q, double* st, const float* L, const float* mx,
                           const int32_t* tg, int64_t v0, int64_t Vs, int64_t N) {
    g::ce_sum_exp_target(st, L, mx, tg, v0, Vs, N, stream_of(q));
  };
  t.ce_loss = [](Queue& q, float* losses, double* total, const double* st, const float* mx,
                 const int32_t* tg, int64_t N) { g::ce_loss(losses, total, st, mx, tg, N, stream_of(q)); };
  t.ce_grad = [](Queue& q, float* L, const float* mx, const double* st, const int32_t* tg,
                 int64_t v0, int64_t Vs, int64_t N, float gs) {
    g::ce_grad(L, mx, st, tg, v0, Vs, N, gs, stream_of(q));
  };
  t.row_argmax = [](Queue& q, int32_t* idx, float* val, const float* L, int64_t N, int64_t Vs,
                    int64_t ld) { g::row_argmax(idx, val, L, N, Vs, ld, stream_of(q)); };
  t.sum_squares = [](Queue& q, double* out, const float* x, int64_t n) {
    double* scratch = static_cast<double*>(
        queue_of(q).workspace(size_t(g::sum_squares_scratch(n) + 1) * sizeof(double)));
    g::sum_squares(out, x, n, scratch, stream_of(q));
  };
  t.cast_f32_to_bf16 = [](Queue& q, uint16_t* out, const float* x, int64_t n) {
    g::cast_f32_to_bf16(out, n, x, n, 1, n, stream_of(q));
  };
  t.cast_bf16_to_f32 = [](Queue& q, float* out, const uint16_t* x, int64_t n) {
    g::cast_bf16_to_f32(out, n, x, n, 1, n, stream_of(q));
  };
  t.round_to_bf16 = [](Queue& q, float* x, int64_t n) { g::round_to_bf16(x, n, stream_of(q)); };
  t.adamw = [](Queue& q, const AdamWArgs& a) {
    // p16: the bf16 weight copy written in the same pass (Capabilities::adamw_bf16_copy).
    g::TensorSpan sp{a.p, a.g, a.m, a.v, a.p16, a.n, a.weight_decay};
    g::adamw(sp, a.lr, a.beta1, a.beta2, a.eps, a.grad_scale, a.step, stream_of(q));
  };
  // One rank with the whole vocabulary: one read of the logits forward (online max and Σ exp),
  // one read + write backward, no second copy of the softmax.
  t.cross_entropy_fused = [](Queue& q, float* logits, float* losses, double* total,
                             const int32_t* targets, int64_t N, int64_t V, float grad_scale) {
    // Scratch: the first bad target's position (int64), then mx, Σ exp, target logit (N each).
    auto* base = static_cast<unsigned char*>(
        queue_of(q).workspace(256 + size_t(3 * N) * sizeof(float)));
    auto* first_bad = reinterpret_cast<int64_t*>(base);
    float* st = reinterpret_cast<float*>(base + 256);
    float *mx = st, *sum = st + N, *tgt = st + 2 * N;
    const g::gpuStream_t s = stream_of(q);
    if (N > 0) check_targets_below(first_bad, targets, N, V, s);  // as the CPU: refuse first
    g::xent_partials(mx, sum, tgt, logits, V, targets, N, 0, V, s);
    g::xent_losses(losses, nullptr, mx, sum, tgt, targets, N, V, nullptr, s);
    if (total) {
      // The op table's order: rows in order (as ce_loss).
      g::ce_loss_total_in_order(total, losses, N, s);
    }
    g::xent_backward(logits, V, mx, sum, targets, N, 0, V, grad_scale, s);
  };
  t.moe_permute = [](Queue& q, float* out, const float* x, const int32_t* s, int64_t N,
                     int64_t k, int64_t C) { g::moe_permute(out, x, s, N, k, C, stream_of(q)); };
  t.moe_permute_backward = [](Queue& q, float* dx, const float* d, const int32_t* s, int64_t N,
                              int64_t k, int64_t C) {
    g::moe_permute_backward(dx, d, s, N, k, C, stream_of(q));
  };
  t.moe_unpermute = [](Queue& q, float* y, const float* e, const float* w, const int32_t* s,
                       int64_t N, int64_t k, int64_t C) {
    g::moe_unpermute(y, e, w, s, N, k, C, stream_of(q));
  };
  t.moe_unpermute_backward = [](Queue& q, float* de, float* dw, const float* dy, const float* e,
                                const float* w, const int32_t* s, int64_t N, int64_t k,
                                int64_t C) {
    g::moe_unpermute_backward(de, dw, dy, e, w, s, N, k, C, stream_of(q));
  };
  return t;
}

}  // namespace

const OpTable& CudaBackend::ops() const {
  static const OpTable table = [] {
    OpTable t = make_table();
    check_op_table(t, "cuda");
    return t;
  }();
  return table;
}

// Ceilings measured on this device: a large bf16 and an fp32 GEMM through the same cuBLASLt path
// the model uses, on random data (never zeros: they run faster, docs/gpu.md), and a device-to-
// device copy counting bytes read plus written. Median of a few timed repeats after a warm-up.
DeviceCeilings CudaBackend::ceilings(int, bool quick) {
  DeviceCeilings c;
  c.measured = true;
  const int64_t n = quick ? 4096 : 8192;
  const int reps = quick ? 5 : 10;
  g::gpuStream_t s = queue_->stream();
  DeviceBuffer a = alloc(size_t(n * n) * 4), b = alloc(size_t(n * n) * 4), out = alloc(size_t(n * n) * 4);
  DeviceBuffer a16 = alloc(size_t(n * n) * 2), b16 = alloc(size_t(n * n) * 2);
  {
    // Random fill on the host once (a few hundred MB at most), converted on the device.
    std::vector<float> h(size_t(n * n));
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (float& v : h) {
      x ^= x << 13; x ^= x >> 7; x ^= x << 17;
      v = float(int64_t(x >> 40) - (int64_t(1) << 23)) / float(1 << 23);
    }
    queue_->copy_to_device(a.data(), h.data(), h.size() * 4);
    queue_->copy_to_device(b.data(), h.data(), h.size() * 4);
    g::cast_f32_to_bf16(a16.as<uint16_t>(), n, a.as<float>(), n, n, n, s);
    g::cast_f32_to_bf16(b16.as<uint16_t>(), n, b.as<float>(), n, n, n, s);
  }
  g::gpuEvent_t e0, e1;
  GPU_CHECK(g::gpuEventCreate(&e0, true));
  GPU_CHECK(g::gpuEventCreate(&e1, true));
  auto time_ms = [&](auto&& fn) {
    fn();  // warm-up (plan, heuristic, clocks)
    std::vector<float> ms;
    for (int r = 0; r < reps; ++r) {
      GPU_CHECK(g::gpuEventRecord(e0, s));
      fn();
      GPU_CHECK(g::gpuEventRecord(e1, s));
      GPU_CHECK(g::gpuEventSynchronize(e1));
      float t = 0;
      GPU_CHECK(g::gpuEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return double(ms[ms.size() / 2]);
  };
  auto gemm = [&](bool bf16) {
    g::GemmCall call;
    call.M = call.N = call.K = n;
    call.lda = call.ldb = call.ldc = n;
    call.A = bf16 ? a16.data() : a.data();
    call.B = bf16 ? b16.data() : b.data();
    call.a_type = call.b_type = bf16 ? g::GemmType::BF16 : g::GemmType::F32;
    call.math = bf16 ? g::GemmMath::BF16 : g::GemmMath::FP32;
    call.C = out.as<float>();
    queue_->gemm().run(call, s);
  };
  const double flop = 2.0 * double(n) * n * n;
  c.gemm_bf16_gflops = flop / (time_ms([&] { gemm(true); }) * 1e-3) / 1e9;
  c.gemm_fp32_gflops = flop / (time_ms([&] { gemm(false); }) * 1e-3) / 1e9;
  const size_t bytes = size_t(n * n) * 4;
  c.memory_gbs = 2.0 * double(bytes) /
                 (time_ms([&] { GPU_CHECK(g::gpuMemcpyAsync(out.data(), a.data(), bytes, s)); }) * 1e-3) / 1e9;
  g::gpuEventDestroy(e0);
  g::gpuEventDestroy(e1);
  c.method = detail::concat("cuBLASLt ", n, "^3 GEMMs on random data (bf16 operands / fp32), ",
                            "median of ", reps, " after a warm-up; device-to-device copy of ",
                            bytes >> 20, " MiB counting read + write");
  return c;
}

// The part's datasheet dense peak (backend/gpu_parts.hpp); a part the table does not know: the
// GEMM ceiling measured on a large square (quick), and the name says so.
DevicePeak CudaBackend::peak(Precision p, int threads) {
  const bool bf16 = p == Precision::BF16;
  const GpuPart part = gpu_part(info_.name);
  if (part.bf16_tflops > 0)
    return {1000 * (bf16 ? part.bf16_tflops : part.fp32_tflops),
            part.part + (bf16 ? " bf16 dense peak" : " fp32 peak") + " (datasheet)"};
  const DeviceCeilings c = ceilings(threads, true);
  return {bf16 ? c.gemm_bf16_gflops : c.gemm_fp32_gflops,
          "measured GEMM ceiling (no datasheet peak for this GPU in backend/gpu_parts)"};
}

void set_attention_bf16(bool on) { g_attention_bf16 = on ? 1 : 0; }
bool attention_bf16() {
  if (g_attention_bf16.load() < 0) g_attention_bf16 = attention_bf16_from_env() ? 1 : 0;
  return g_attention_bf16.load() == 1;
}

std::unique_ptr<Backend> create_cuda_backend(int device) {
  return std::make_unique<CudaBackend>(device);
}

BackendInfo backend_info() {
  BackendInfo info;
  info.name = "cuda";
  std::string why;
  const int n = g::device_count(&why);
  info.available = n > 0;
  if (!info.available) info.why_not = why.empty() ? "no CUDA device" : why;
  info.create = [](const std::string& name) {
    std::string why_inner;
    const int count = g::device_count(&why_inner);
    if (count <= 0) fail("cuda backend: no device (", why_inner, ")");
    int dev = parse_device_index(name, "cuda");
    if (dev < 0) dev = device_for_local_rank(local_rank_from_environment(), count);
    if (dev >= count)
      fail("cuda backend: device ", dev, " asked for, but ", count, " device(s) are visible");
    return create_cuda_backend(dev);
  };
  return info;
}

}  // namespace tetrad::backend::cuda
