#include "tetrad/backend/cpu/precision.hpp"

#include <cstdlib>
#include <mutex>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "tetrad/core/cpu.hpp"
#include "tetrad/core/error.hpp"

namespace tetrad::kernels {

namespace {
Precision g_precision = Precision::FP32;

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
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c), eng);
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

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::FP32;
  if (name == "bf16") return Precision::BF16;
  fail("precision must be \"fp32\" or \"bf16\", got \"", name, "\"");
}

std::string precision_name(Precision p) { return p == Precision::BF16 ? "bf16" : "fp32"; }

namespace {
const char* auto_override() {
  const char* e = std::getenv("TETRAD_PRECISION_AUTO");
  return e && *e ? e : nullptr;
}
}  // namespace

Precision resolve_precision(const std::string& setting) {
  if (setting != "auto") {
    if (setting == "fp32" || setting == "bf16") return parse_precision(setting);
    fail("precision must be \"fp32\", \"bf16\" or \"auto\", got \"", setting, "\"");
  }
  if (const char* e = auto_override()) {
    const std::string v = e;
    if (v != "fp32" && v != "bf16")
      fail("TETRAD_PRECISION_AUTO = \"", v, "\": expected \"fp32\" or \"bf16\" (what precision "
           "\"auto\" resolves to)");
    return parse_precision(v);
  }
  return native_bf16_matmul() ? Precision::BF16 : Precision::FP32;
}

std::string auto_precision_reason() {
  if (const char* e = auto_override()) return std::string("forced by TETRAD_PRECISION_AUTO=") + e;
  return native_bf16_matmul() ? "bf16 GEMMs here: " + bf16_matmul_path()
                              : "bf16 would be " + bf16_matmul_path();
}

bool native_bf16_matmul() { return probed().native; }
std::string bf16_matmul_path() { return probed().path; }

void set_gemm_precision(Precision p) { g_precision = p; }
Precision gemm_precision() { return g_precision; }

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

void gemm_bf16_emulated(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                        const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                        float* C, int64_t ldc) {
  // Stored shapes: A is [M, K] (or [K, M] when transposed), B is [K, N] (or [N, K]).
  const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
  t_a32.resize(size_t(ar * ac));
  t_b32.resize(size_t(br * bc));
  round_matrix_to_bf16(A, lda, t_a32.data(), ac, ar, ac);
  round_matrix_to_bf16(B, ldb, t_b32.data(), bc, br, bc);
  const dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha,
                                      t_a32.data(), ac, t_b32.data(), bc, beta, C, ldc);
  TETRAD_CHECK(st == dnnl_success, "dnnl_sgemm failed with status ", int(st));
}

struct MatmulKey {
  bool ta, tb;
  int64_t M, N, K, ldc;
  float alpha, beta;
  bool operator==(const MatmulKey&) const = default;
};
struct MatmulKeyHash {
  size_t operator()(const MatmulKey& k) const {
    size_t h = std::hash<int64_t>()(k.M) ^ (std::hash<int64_t>()(k.N) << 1) ^
               (std::hash<int64_t>()(k.K) << 2) ^ (std::hash<int64_t>()(k.ldc) << 3);
    return h ^ (size_t(k.ta) << 60) ^ (size_t(k.tb) << 61) ^ std::hash<float>()(k.alpha) ^
           (std::hash<float>()(k.beta) << 4);
  }
};

// oneDNN matmul with bf16 inputs (converted into compact copies of the stored matrices, so the
// transposes become strides) and fp32 output; alpha as the output scale, beta as a sum post-op.
// Primitives are cached per shape: the model has a handful.
void gemm_bf16_native(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                      const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                      float* C, int64_t ldc) {
  using dnnl::memory;
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  thread_local dnnl::stream strm(eng);
  thread_local std::unordered_map<MatmulKey, dnnl::matmul, MatmulKeyHash> cache;
  const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
  const memory::desc a_md({M, K}, memory::data_type::bf16,
                          ta ? memory::dims{1, M} : memory::dims{K, 1});
  const memory::desc b_md({K, N}, memory::data_type::bf16,
                          tb ? memory::dims{1, K} : memory::dims{N, 1});
  const memory::desc c_md({M, N}, memory::data_type::f32, memory::dims{ldc, 1});
  const MatmulKey key{ta, tb, M, N, K, ldc, alpha, beta};
  auto it = cache.find(key);
  if (it == cache.end()) {
    dnnl::primitive_attr attr;
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
      dnnl::post_ops po;
      po.append_sum(beta);
      attr.set_post_ops(po);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, eng);
    it = cache.emplace(key, dnnl::matmul(pd)).first;
  }
  t_a16.resize(size_t(ar * ac));
  t_b16.resize(size_t(br * bc));
  convert_matrix_to_bf16(A, lda, t_a16.data(), ac, ar, ac);
  convert_matrix_to_bf16(B, ldb, t_b16.data(), bc, br, bc);
  memory a_mem(a_md, eng, t_a16.data()), b_mem(b_md, eng, t_b16.data()), c_mem(c_md, eng, C);
  it->second.execute(strm, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
  strm.wait();
}

}  // namespace

void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
               int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (native_bf16_matmul())
    gemm_bf16_native(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    gemm_bf16_emulated(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace tetrad::kernels
