#include "tetrad/backend/cpu/precision.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <mutex>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "tetrad/core/cpu.hpp"
#include "tetrad/core/error.hpp"

namespace tetrad::kernels {

namespace {
struct Bf16Probe {
  bool native = false;
  std::string path;
};

// oneDNN creates a bf16 matmul on any x86-64 CPU, but without AMX-BF16 or AVX512-BF16 it is a
// reference or up-converting implementation slower than sgemm; only hardware support counts.
Bf16Probe probe() {
  Bf16Probe p;
  const CpuFeatures& cpu = cpu_features();
  const char* env = std::getenv("TETRAD_BF16");
  if (env && std::string(env) == "emulate") {
    p.path = "emulated (TETRAD_BF16=emulate)";
    return p;
  }
  if (!cpu.use_amx_bf16() && !cpu.use_avx512_bf16()) {
    p.path = std::string("emulated (") +
             (cpu.capped() && (cpu.amx_bf16 || cpu.avx512_bf16)
                  ? std::string("TETRAD_MAX_CPU_ISA=") + isa_level_name(cpu.max_isa) +
                        " leaves neither AMX-BF16 nor AVX512-BF16"
                  : std::string("this CPU has neither AMX-BF16 nor AVX512-BF16")) +
             ": bf16 operands are rounded and multiplied in fp32, slower than fp32)";
    return p;
  }
  try {
    using dnnl::memory;
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    const memory::dims d = {64, 64};
    memory::desc a(d, memory::data_type::bf16, memory::format_tag::ab);
    memory::desc c(d, memory::data_type::f32, memory::format_tag::ab);
#if DNNL_VERSION_MAJOR >= 3
    dnnl::matmul::primitive_desc pd(eng, a, a, c);
#else
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c), eng);
#endif
    const std::string impl = pd.impl_info_str();
    if (impl.find("ref") != std::string::npos) {
      p.path = "emulated (oneDNN offers only '" + impl + "' for bf16 matmul here)";
      return p;
    }
    p.native = true;
    p.path = "native (oneDNN matmul '" + impl + "' on " + cpu.best_isa() + ")";
  } catch (const dnnl::error& e) {
    p.path = std::string("emulated (oneDNN could not build a bf16 matmul: ") + e.what() + ")";
  }
  return p;
}

const Bf16Probe& probed() {
  static const Bf16Probe p = probe();
  return p;
}
}  // namespace

static bool g_force_emulation = false;
void set_bf16_emulation_forced(bool on) { g_force_emulation = on; }
bool native_bf16_matmul() { return probed().native && !g_force_emulation; }
std::string bf16_matmul_path() { return probed().path; }

void round_matrix_to_bf16(const float* in, int64_t ldi, float* out, int64_t ldo, int64_t rows,
                          int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in + r * ldi;
    float* y = out + r * ldo;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) y[c] = round_to_bf16(x[c]);
  }
}

void convert_to_bf16(const float* in, uint16_t* out, int64_t n, bool parallel) {
  constexpr int64_t kChunk = 1 << 14;
#pragma omp parallel for schedule(static) if (parallel && n > 4 * kChunk)
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t i1 = std::min(n, i0 + kChunk);
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) out[i] = float_to_bf16(in[i]);
  }
}

void convert_from_bf16(const uint16_t* in, float* out, int64_t n, bool parallel) {
  constexpr int64_t kChunk = 1 << 14;
#pragma omp parallel for schedule(static) if (parallel && n > 4 * kChunk)
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t i1 = std::min(n, i0 + kChunk);
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) out[i] = bf16_to_float(in[i]);
  }
}

void convert_matrix_to_bf16(const float* in, int64_t ldi, uint16_t* out, int64_t ldo,
                            int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in + r * ldi;
    uint16_t* y = out + r * ldo;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) y[c] = float_to_bf16(x[c]);
  }
}

namespace {

// Scratch kept across calls (one per thread that calls gemm; the model calls from one).
thread_local std::vector<float> t_a32, t_b32;
thread_local std::vector<uint16_t> t_a16, t_b16;

// Stored extent of an operand: rows x cols of the matrix as laid out in memory.
struct Stored {
  int64_t rows, cols;
};
Stored stored_a(bool ta, int64_t M, int64_t K) { return ta ? Stored{K, M} : Stored{M, K}; }
Stored stored_b(bool tb, int64_t K, int64_t N) { return tb ? Stored{N, K} : Stored{K, N}; }

// The operand as fp32 with every element rounded to bf16 (emulated path): a bf16 operand is
// widened exactly, an fp32 one rounded; into a compact copy (leading dimension = cols).
const float* rounded_fp32(const Bf16Operand& x, Stored s, std::vector<float>& scratch) {
  scratch.resize(size_t(s.rows * s.cols));
  if (x.bf16) {
#pragma omp parallel for schedule(static) if (s.rows * s.cols > 32768)
    for (int64_t r = 0; r < s.rows; ++r)
      for (int64_t c = 0; c < s.cols; ++c)
        scratch[size_t(r * s.cols + c)] = bf16_to_float(x.bf16[r * x.ld + c]);
  } else {
    round_matrix_to_bf16(x.f32, x.ld, scratch.data(), s.cols, s.rows, s.cols);
  }
  return scratch.data();
}

void report(const std::string& line);

void gemm_bf16_emulated(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                        const Bf16Operand& A, const Bf16Operand& B, float beta, float* C,
                        int64_t ldc) {
  {  // the report names every shape whichever path ran it (once per shape and thread)
    thread_local std::vector<std::array<int64_t, 5>> seen;
    const std::array<int64_t, 5> key{int64_t(ta), int64_t(tb), M, N, K};
    if (std::find(seen.begin(), seen.end(), key) == seen.end()) {
      seen.push_back(key);
      report(std::string(ta ? "T" : "N") + (tb ? "T" : "N") + " " + std::to_string(M) + "x" +
             std::to_string(N) + "x" + std::to_string(K) +
             ": emulated (sgemm on bf16-rounded operands; layout choice is for native matmuls)");
    }
  }
  const Stored sa = stored_a(ta, M, K), sb = stored_b(tb, K, N);
  const float* a = rounded_fp32(A, sa, t_a32);
  const float* b = rounded_fp32(B, sb, t_b32);
  const dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, a, sa.cols,
                                      b, sb.cols, beta, C, ldc);
  TETRAD_CHECK(st == dnnl_success, "dnnl_sgemm failed with status ", int(st));
}

struct MatmulKey {
  bool ta, tb;
  int64_t M, N, K, lda, ldb, ldc;
  float alpha, beta;
  int policy;  // the GemmLayoutPolicy in force: a forced form must not reuse another's primitive
  bool operator==(const MatmulKey&) const = default;
};
struct MatmulKeyHash {
  size_t operator()(const MatmulKey& k) const {
    size_t h = 1469598103934665603ull;
    auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(uint64_t(k.ta) | uint64_t(k.tb) << 1 | uint64_t(k.policy) << 2);
    for (int64_t v : {k.M, k.N, k.K, k.lda, k.ldb, k.ldc}) mix(uint64_t(v));
    mix(std::hash<float>()(k.alpha));
    mix(std::hash<float>()(k.beta));
    return h;
  }
};

using dnnl::memory;

// A logical [rows, cols] matrix at the given element strides.
memory::desc strided(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride,
                     memory::data_type dt) {
  return memory::desc({rows, cols}, dt, memory::dims{row_stride, col_stride});
}

dnnl::engine& engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

// One matmul primitive: src [m, k] · weights [k, n] -> dst [m, n] with the strides of the
// chosen form, alpha as a scale of the source, beta as a sum post-op.
struct Matmul {
  dnnl::matmul prim;
  bool transposed = false;  // computes Cᵀ = op(B)ᵀ·op(A)ᵀ
  bool scaled = false;
  std::string impl;
  memory::desc src_md, wei_md, dst_md;
};

Matmul make_matmul(const MatmulKey& k, bool transposed) {
  using dt = memory::data_type;
  // op(A) [M, K] at (row, col) strides; op(B) [K, N] likewise.
  const int64_t a_rs = k.ta ? 1 : k.lda, a_cs = k.ta ? k.lda : 1;
  const int64_t b_rs = k.tb ? 1 : k.ldb, b_cs = k.tb ? k.ldb : 1;
  memory::desc src, wei, dst;
  if (!transposed) {
    src = strided(k.M, k.K, a_rs, a_cs, dt::bf16);
    wei = strided(k.K, k.N, b_rs, b_cs, dt::bf16);
    dst = strided(k.M, k.N, k.ldc, 1, dt::f32);
  } else {
    // op(B)ᵀ [N, K], op(A)ᵀ [K, M] (transposing swaps the stride pairs), into a compact Cᵀ
    // [N, M] scratch that execute() adds into C transposed: oneDNN has only its reference
    // kernel for a column-major destination (measured: "ref:any" in 2.6 and 3.2).
    src = strided(k.N, k.K, b_cs, b_rs, dt::bf16);
    wei = strided(k.K, k.M, a_cs, a_rs, dt::bf16);
    dst = strided(k.N, k.M, k.M, 1, dt::f32);
  }
  dnnl::primitive_attr attr;
  Matmul m;
  m.transposed = transposed;
  if (k.alpha != 1.0f) {
#if DNNL_VERSION_MAJOR >= 3
    attr.set_scales_mask(DNNL_ARG_SRC, 0);
    m.scaled = true;
#else
    attr.set_output_scales(0, {k.alpha});
#endif
  }
  if (k.beta != 0.0f && !transposed) {  // transposed: beta applied when adding the scratch
    dnnl::post_ops po;
    po.append_sum(k.beta);
    attr.set_post_ops(po);
  }
#if DNNL_VERSION_MAJOR >= 3
  dnnl::matmul::primitive_desc pd(engine(), src, wei, dst, attr);
#else
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wei, dst), attr, engine());
#endif
  m.impl = pd.impl_info_str();
  m.prim = dnnl::matmul(pd);
  m.src_md = src, m.wei_md = wei, m.dst_md = dst;
  return m;
}

void execute(const Matmul& m, const MatmulKey& k, const uint16_t* a, const uint16_t* b,
             float* c) {
  using dt = memory::data_type;
  thread_local dnnl::stream strm(engine());
  const uint16_t* src = m.transposed ? b : a;
  const uint16_t* wei = m.transposed ? a : b;
  memory src_m(m.src_md, engine(), const_cast<uint16_t*>(src));
  memory wei_m(m.wei_md, engine(), const_cast<uint16_t*>(wei));
  thread_local std::vector<float> ct;  // Cᵀ of the transposed form
  if (m.transposed) ct.resize(size_t(k.M * k.N));
  memory dst_m(m.dst_md, engine(), m.transposed ? ct.data() : c);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, src_m}, {DNNL_ARG_WEIGHTS, wei_m}, {DNNL_ARG_DST, dst_m}};
#if DNNL_VERSION_MAJOR >= 3
  float alpha = k.alpha;  // oneDNN 3 takes scales at run time
  if (m.scaled)
    args.emplace(DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC,
                 memory(memory::desc({1}, dt::f32, memory::format_tag::a), engine(), &alpha));
#else
  (void)k;
  (void)dt::f32;
#endif
  m.prim.execute(strm, args);
  strm.wait();
  if (m.transposed) {  // C = beta C + (Cᵀ)ᵀ, in 32x32 blocks
    constexpr int64_t kB = 32;
    const float beta = k.beta;
    // The calling thread's scratch: `ct` named inside the parallel region would be each OpenMP
    // worker's own (empty) thread_local vector.
    const float* ctp = ct.data();
#pragma omp parallel for collapse(2) schedule(static) if (k.M * k.N > 32768)
    for (int64_t i0 = 0; i0 < k.M; i0 += kB)
      for (int64_t j0 = 0; j0 < k.N; j0 += kB)
        for (int64_t i = i0; i < std::min(k.M, i0 + kB); ++i)
          for (int64_t j = j0; j < std::min(k.N, j0 + kB); ++j) {
            const float v = ctp[size_t(j * k.M + i)];
            float& o = c[i * k.ldc + j];
            o = beta == 0.0f ? v : beta * o + v;
          }
  }
}

GemmLayoutPolicy policy_from_env() {
  const char* e = std::getenv("TETRAD_GEMM_LAYOUT");
  if (!e || !*e) return GemmLayoutPolicy::kRule;
  const std::string v(e);
  if (v == "rule") return GemmLayoutPolicy::kRule;
  if (v == "tune") return GemmLayoutPolicy::kTune;
  if (v == "plain") return GemmLayoutPolicy::kPlain;
  if (v == "transposed") return GemmLayoutPolicy::kTransposed;
  fail("TETRAD_GEMM_LAYOUT must be rule, tune, plain or transposed, got \"", v, "\"");
}
GemmLayoutPolicy g_layout_policy = policy_from_env();

// The report keeps its first kReportLines shapes and counts the rest: a mixture of experts
// multiplies a new row count almost every step, and the report must not grow with the run.
constexpr size_t kReportLines = 1024;
std::mutex g_report_mu;
std::vector<std::string> g_report;
size_t g_report_more = 0;
void report(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_report_mu);
  if (std::find(g_report.begin(), g_report.end(), line) != g_report.end()) return;
  if (g_report.size() < kReportLines) g_report.push_back(line);
  else ++g_report_more;
}

std::string shape_name(const MatmulKey& k) {
  return std::string(k.ta ? "T" : "N") + (k.tb ? "T" : "N") + " " + std::to_string(k.M) + "x" +
         std::to_string(k.N) + "x" + std::to_string(k.K);
}

// Best of 3 runs of each form on random bf16 operands of the key's shape (zeros run faster
// than real data, machine-notes.md); returns the faster form.
Matmul tune(const MatmulKey& k) {
  const Stored sa = stored_a(k.ta, k.M, k.K), sb = stored_b(k.tb, k.K, k.N);
  std::vector<uint16_t> a(size_t(sa.rows * k.lda)), b(size_t(sb.rows * k.ldb));
  std::vector<float> c(size_t(k.M * k.ldc));
  uint64_t x = 0x9E3779B97F4A7C15ull;
  auto next = [&] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return float(int64_t(x >> 40) - (1 << 23)) / float(1 << 23);
  };
  for (auto& v : a) v = float_to_bf16(next());
  for (auto& v : b) v = float_to_bf16(next());
  for (auto& v : c) v = next();
  Matmul best;
  double best_t = 1e30, times[2] = {0, 0};
  for (int form = 0; form < 2; ++form) {
    Matmul m = make_matmul(k, form == 1);
    execute(m, k, a.data(), b.data(), c.data());
    double t = 1e30;
    for (int r = 0; r < 3; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      execute(m, k, a.data(), b.data(), c.data());
      t = std::min(t, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    times[form] = t;
    if (t < best_t) best_t = t, best = std::move(m);
  }
  const double flop = 2.0 * double(k.M) * double(k.N) * double(k.K);
  char buf[160];
  std::snprintf(buf, sizeof buf, ": %s (plain %.0f, transposed %.0f GFLOP/s, tuned)",
                best.transposed ? "transposed" : "plain", flop / times[0] / 1e9,
                flop / times[1] / 1e9);
  report(shape_name(k) + buf);
  return best;
}

// The primitives of one thread, by shape and layout, the least recently used dropped beyond
// kCachedMatmuls. A dense model has a handful of shapes; a mixture of experts a new row count
// per expert almost every step, which an unbounded cache turned into memory growing with the
// run (1.7 -> 2.4 GB over 150 bf16 steps of mixtral-small).
constexpr size_t kCachedMatmuls = 256;
struct MatmulCache {
  using Order = std::list<MatmulKey>;
  std::unordered_map<MatmulKey, std::pair<Matmul, Order::iterator>, MatmulKeyHash> map;
  Order order;  // most recently used first

  Matmul* find(const MatmulKey& k) {
    auto it = map.find(k);
    if (it == map.end()) return nullptr;
    order.splice(order.begin(), order, it->second.second);
    return &it->second.first;
  }
  Matmul* insert(const MatmulKey& k, Matmul m) {
    if (map.size() >= kCachedMatmuls) {
      map.erase(order.back());
      order.pop_back();
    }
    order.push_front(k);
    return &map.emplace(k, std::make_pair(std::move(m), order.begin())).first->second.first;
  }
};
thread_local MatmulCache t_matmuls;

// oneDNN matmul with bf16 inputs and fp32 output. fp32 operands are converted into compact bf16
// copies first; bf16 ones are read in place through their strides. Primitives are cached per
// shape and layout (MatmulCache).
void gemm_bf16_native(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                      const Bf16Operand& A, const Bf16Operand& B, float beta, float* C,
                      int64_t ldc, GemmProductForm form) {
  const Stored sa = stored_a(ta, M, K), sb = stored_b(tb, K, N);
  const uint16_t* a = A.bf16;
  const uint16_t* b = B.bf16;
  int64_t lda = A.ld, ldb = B.ld;
  if (!a) {
    t_a16.resize(size_t(sa.rows * sa.cols));
    convert_matrix_to_bf16(A.f32, A.ld, t_a16.data(), sa.cols, sa.rows, sa.cols);
    a = t_a16.data(), lda = sa.cols;
  }
  if (!b) {
    t_b16.resize(size_t(sb.rows * sb.cols));
    convert_matrix_to_bf16(B.f32, B.ld, t_b16.data(), sb.cols, sb.rows, sb.cols);
    b = t_b16.data(), ldb = sb.cols;
  }
  // A form chosen by the caller is keyed like the forced policies (the same primitive).
  const GemmLayoutPolicy policy = form == GemmProductForm::kPlain ? GemmLayoutPolicy::kPlain
                                  : form == GemmProductForm::kTransposed
                                      ? GemmLayoutPolicy::kTransposed
                                      : g_layout_policy;
  const MatmulKey key{ta, tb, M, N, K, lda, ldb, ldc, alpha, beta, int(policy)};
  Matmul* cached = t_matmuls.find(key);
  if (!cached) {
    Matmul m;
    // Forms the caller chose are its plan's to report (the model's "gemm layouts" line).
    const bool own = form == GemmProductForm::kPolicy;
    switch (policy) {
      case GemmLayoutPolicy::kTune: m = tune(key); break;
      case GemmLayoutPolicy::kPlain:
        m = make_matmul(key, false);
        if (own) report(shape_name(key) + ": plain (forced)");
        break;
      case GemmLayoutPolicy::kTransposed:
        m = make_matmul(key, true);
        if (own) report(shape_name(key) + ": transposed (forced)");
        break;
      case GemmLayoutPolicy::kRule:
        m = make_matmul(key, gemm_layout_rule(ta, tb, M, N, K));
        report(shape_name(key) + ": " + (m.transposed ? "transposed" : "plain") + " (rule)");
        break;
    }
    cached = t_matmuls.insert(key, std::move(m));
  }
  execute(*cached, key, a, b, C);
}

}  // namespace

void set_gemm_layout_policy(GemmLayoutPolicy p) { g_layout_policy = p; }
GemmLayoutPolicy gemm_layout_policy() { return g_layout_policy; }

bool gemm_layout_rule(bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
  (void)ta, (void)tb, (void)M, (void)N, (void)K;
  return false;
}

std::string gemm_layout_report() {
  std::lock_guard<std::mutex> lock(g_report_mu);
  std::string s;
  for (const auto& l : g_report) s += l + "\n";
  if (g_report_more > 0) s += "... and " + std::to_string(g_report_more) + " more shapes\n";
  return s;
}

size_t gemm_bf16_cached_primitives() { return t_matmuls.map.size(); }

void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, Bf16Operand A,
               Bf16Operand B, float beta, float* C, int64_t ldc, GemmProductForm form) {
  if (M == 0 || N == 0) return;
  TETRAD_CHECK((A.f32 != nullptr) != (A.bf16 != nullptr) && (B.f32 != nullptr) != (B.bf16 != nullptr),
               "gemm_bf16: each operand needs exactly one of an fp32 or a bf16 pointer");
  if (K == 0) {  // nothing to multiply: C = beta * C
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0 ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  if (native_bf16_matmul())
    gemm_bf16_native(ta, tb, M, N, K, alpha, A, B, beta, C, ldc, form);
  else
    gemm_bf16_emulated(ta, tb, M, N, K, alpha, A, B, beta, C, ldc);
}

void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
               int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_bf16(ta, tb, M, N, K, alpha, Bf16Operand::fp32(A, lda), Bf16Operand::fp32(B, ldb), beta, C,
            ldc);
}

}  // namespace tetrad::kernels
