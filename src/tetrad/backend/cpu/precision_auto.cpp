#include "tetrad/backend/cpu/precision_auto.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.h>
#include <vector>

#include "tetrad/backend/cpu/precision.hpp"
#include "tetrad/backend/machine_cache.hpp"
#include "tetrad/core/error.hpp"

namespace tetrad::kernels {

namespace {

std::string fmt0(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.0f", v);
  return b;
}

struct ProbeShape {
  bool ta, tb;
  int64_t M, N, K;
};
// A GPT-2-small-sized layer's GEMMs on 1024 tokens in tetrad's three layouts: the forward of the
// QKV projection (NT), the input gradient of the second MLP linear (NN), the weight gradient of
// the first (TN).
constexpr ProbeShape kProbe[] = {
    {false, true, 1024, 2304, 768}, {false, false, 1024, 768, 3072}, {true, false, 768, 3072, 1024}};

std::string probe_names() {
  std::string s;
  for (const ProbeShape& p : kProbe) {
    if (!s.empty()) s += ", ";
    s += std::string(p.ta ? "T" : "N") + (p.tb ? "T" : "N") + " " + std::to_string(p.M) + "x" +
         std::to_string(p.N) + "x" + std::to_string(p.K);
  }
  return s;
}

// The fastest of a shape's runs: another process can only slow a GEMM down, so the fastest of
// the interleaved runs is the least disturbed (on a machine loaded 5x, the medians' ratio moved
// 0.81-0.88 between runs where the fastest runs' moved 0.67-0.88).
double fastest(const std::vector<double>& t) { return *std::min_element(t.begin(), t.end()); }

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%d %H:%M UTC", &tm);
  return b;
}

}  // namespace

backend::PrecisionChoice choose_precision(const PrecisionRates& r, double margin) {
  const std::string rates = "bf16 GEMMs " + fmt0(r.bf16) + " GFLOP/s";
  const std::string on = " on a transformer layer's GEMM shapes";
  if (!(r.fp32 > 0) || !(r.bf16 > 0))
    return {Precision::FP32, "fp32, the default: the GEMM rates could not be measured (fp32 " +
                                 fmt0(r.fp32) + ", bf16 " + fmt0(r.bf16) + " GFLOP/s)"};
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.2fx", r.bf16 / r.fp32);
  if (r.bf16 >= margin * r.fp32)
    return {Precision::BF16, rates + " >= " + fmt0(margin * 100) + "% of fp32's " + fmt0(r.fp32) +
                                 " (" + ratio + ")" + on};
  if (r.bf16 < r.fp32)
    return {Precision::FP32, rates + " < fp32 " + fmt0(r.fp32) + " (" + ratio + ")" + on};
  return {Precision::FP32, rates + " against fp32 " + fmt0(r.fp32) + " (" + ratio + "): within the " +
                               fmt0((margin - 1) * 100) +
                               "% margin bf16 must win by, so fp32, the default when they are "
                               "close" + on};
}

PrecisionRates measure_precision_rates(int threads, int reps) {
  TETRAD_CHECK(native_bf16_matmul(), "precision probe: bf16 GEMMs are not native here");
  if (reps < 1) reps = 1;
  const int prev = omp_get_max_threads();
  if (threads > 0) omp_set_num_threads(threads);
  uint64_t x = 0x9E3779B97F4A7C15ull;  // random operands: zeros run faster than real data
  auto next = [&] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return float(int64_t(x >> 40) - (1 << 23)) / float(1 << 23);
  };
  double t32 = 0, t16 = 0, flop = 0;  // FLOP-weighted: total FLOPs over each precision's time
  for (const ProbeShape& p : kProbe) {
    const int64_t a_rows = p.ta ? p.K : p.M, a_cols = p.ta ? p.M : p.K;
    const int64_t b_rows = p.tb ? p.N : p.K, b_cols = p.tb ? p.K : p.N;
    std::vector<float> a(size_t(a_rows * a_cols)), b(size_t(b_rows * b_cols)),
        c(size_t(p.M * p.N));
    for (float& v : a) v = next();
    for (float& v : b) v = next();
    std::vector<uint16_t> a16(a.size()), b16(b.size());
    convert_to_bf16(a.data(), a16.data(), int64_t(a.size()));
    convert_to_bf16(b.data(), b16.data(), int64_t(b.size()));
    auto fp32 = [&] {
      const dnnl_status_t st = dnnl_sgemm(p.ta ? 'T' : 'N', p.tb ? 'T' : 'N', p.M, p.N, p.K, 1.0f,
                                          a.data(), a_cols, b.data(), b_cols, 0.0f, c.data(), p.N);
      TETRAD_CHECK(st == dnnl_success, "precision probe: dnnl_sgemm failed with status ", int(st));
    };
    auto bf16 = [&] {
      gemm_bf16(p.ta, p.tb, p.M, p.N, p.K, 1.0f, Bf16Operand::bf16_stored(a16.data(), a_cols),
                Bf16Operand::bf16_stored(b16.data(), b_cols), 0.0f, c.data(), p.N,
                GemmProductForm::kPlain);
    };
    fp32(), bf16();  // warm-up: page-in, thread pool, kernel generation
    std::vector<double> s32, s16;
    for (int r = 0; r < reps; ++r) {  // interleaved: a disturbance hits both alike
      auto t0 = std::chrono::steady_clock::now();
      fp32();
      s32.push_back(seconds_since(t0));
      t0 = std::chrono::steady_clock::now();
      bf16();
      s16.push_back(seconds_since(t0));
    }
    flop += 2.0 * double(p.M) * double(p.N) * double(p.K);
    t32 += fastest(s32), t16 += fastest(s16);
  }
  omp_set_num_threads(prev);
  PrecisionRates r;
  r.fp32 = flop / t32 / 1e9;
  r.bf16 = flop / t16 / 1e9;
  r.shapes = probe_names();
  r.reps = reps;
  return r;
}

namespace {
std::mutex g_mu;
std::map<int, MeasuredChoice> g_done;  // per thread count, for this process
}  // namespace

void forget_measured_precision() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_done.clear();
}

std::string precision_cache_entry(int threads) {
  return "precision auto v1 | " + backend::machine_key(threads);
}

MeasuredChoice measured_precision(bool remeasure) {
  if (const char* e = std::getenv("TETRAD_PRECISION_AUTO"); e && std::string(e) == "measure")
    remeasure = true;
  const int threads = omp_get_max_threads();
  std::lock_guard<std::mutex> lock(g_mu);
  auto& done = g_done;
  if (!remeasure) {
    if (auto it = done.find(threads); it != done.end()) return it->second;
  }
  std::string off;
  const std::string path = backend::machine_cache_path(&off);
  MeasuredChoice out;
  bool measured = false;
  std::string note;
  const nlohmann::json v = backend::machine_cache_update(
      path, precision_cache_entry(threads),
      [&](const nlohmann::json& cached) -> nlohmann::json {
        if (!remeasure && cached.is_object() && cached.value("fp32", 0.0) > 0 &&
            cached.value("bf16", 0.0) > 0)
          return nullptr;  // keep the cached figures
        const PrecisionRates r = measure_precision_rates(threads);
        measured = true;
        return {{"fp32", r.fp32}, {"bf16", r.bf16}, {"shapes", r.shapes}, {"reps", r.reps},
                {"measured", utc_now()}};
      },
      &note);
  out.rates.fp32 = v.value("fp32", 0.0);
  out.rates.bf16 = v.value("bf16", 0.0);
  out.rates.shapes = v.value("shapes", std::string());
  out.rates.reps = v.value("reps", 0);
  out.choice = choose_precision(out.rates);
  if (path.empty())
    out.source = "measured now; not cached (" + off + ")";
  else if (measured)
    out.source = "measured now (" + std::to_string(threads) + " thread(s)), cached in " + path;
  else
    out.source = "cached in " + path + " (measured " + v.value("measured", std::string("?")) +
                 ", " + std::to_string(threads) + " thread(s))";
  if (!note.empty()) out.source += "; " + note;
  out.choice.why += " (" + out.source + ")";
  done[threads] = out;
  return out;
}

namespace {
// TETRAD_PRECISION_AUTO = fp32 | bf16 forces the choice; "measure" only re-measures
// (precision_auto.hpp) and is no override.
const char* auto_override() {
  const char* e = std::getenv("TETRAD_PRECISION_AUTO");
  return e && *e && std::string(e) != "measure" ? e : nullptr;
}
}  // namespace

Precision auto_precision() {
  if (const char* e = auto_override()) {
    const std::string v = e;
    if (v != "fp32" && v != "bf16")
      fail("TETRAD_PRECISION_AUTO = \"", v, "\": expected \"fp32\" or \"bf16\" (what precision "
           "\"auto\" resolves to) or \"measure\" (measure it again)");
    return backend::parse_precision(v);
  }
  return native_bf16_matmul() ? measured_precision().choice.precision : Precision::FP32;
}

std::string auto_precision_reason() {
  if (const char* e = auto_override()) return std::string("forced by TETRAD_PRECISION_AUTO=") + e;
  return native_bf16_matmul() ? measured_precision().choice.why
                              : "bf16 would be " + bf16_matmul_path();
}

}  // namespace tetrad::kernels
