// precision "auto" by measurement (issue 29): the rule on fake rates (no timing), the per-machine
// cache (backend/machine_cache.hpp) read, written, locked and recovered, the choice taken from a
// cached entry, and auto on this machine agreeing with its own measurement. tests/CMakeLists.txt
// also runs this binary under TETRAD_MAX_CPU_ISA caps (CpuBranch.*), where bf16 GEMMs may be
// emulated (auto is then fp32 without measuring).
#include <gtest/gtest.h>

#include <omp.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tetrad/backend/backend.hpp"
#include "tetrad/backend/cpu/precision.hpp"
#include "tetrad/backend/cpu/precision_auto.hpp"
#include "tetrad/backend/machine_cache.hpp"

using namespace tetrad;
using namespace tetrad::kernels;
namespace fs = std::filesystem;

namespace {

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// An environment variable set for a scope, restored after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) saved_ = v, had_ = true;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) ::setenv(name_, saved_.c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::string saved_;
  bool had_ = false;
};

// A fresh cache directory for one test.
struct TempCache {
  fs::path dir;
  TempCache() {
    char tmpl[] = "/tmp/tetrad_cache_XXXXXX";
    dir = ::mkdtemp(tmpl);
  }
  ~TempCache() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

}  // namespace

// The machines: AMX (bf16 matmul ~4x sgemm) picks bf16; AVX512-BF16 without AMX (bf16
// ~190 against sgemm ~360) picks fp32; close rates keep fp32, the default, and say so.
TEST(PrecisionAuto, RuleOnFakeRates) {
  PrecisionRates amx{402, 1790, "probe", 5};
  backend::PrecisionChoice c = choose_precision(amx);
  EXPECT_EQ(c.precision, Precision::BF16);
  EXPECT_TRUE(has(c.why, "bf16 GEMMs 1790 GFLOP/s >= 120% of fp32's 402 (4.45x)")) << c.why;

  PrecisionRates no_amx{362, 186, "probe", 5};
  c = choose_precision(no_amx);
  EXPECT_EQ(c.precision, Precision::FP32);
  EXPECT_TRUE(has(c.why, "bf16 GEMMs 186 GFLOP/s < fp32 362 (0.51x)")) << c.why;

  PrecisionRates close{400, 440, "probe", 5};  // 1.10x: inside the margin
  c = choose_precision(close);
  EXPECT_EQ(c.precision, Precision::FP32);
  EXPECT_TRUE(has(c.why, "within the 20% margin")) << c.why;
  EXPECT_TRUE(has(c.why, "default")) << c.why;
  EXPECT_EQ(choose_precision(PrecisionRates{400, 480, "", 5}).precision, Precision::BF16);  // 1.2x
  EXPECT_EQ(choose_precision(close, 1.05).precision, Precision::BF16);

  // Nothing measured: fp32, saying so (never a division by zero or NaN).
  c = choose_precision(PrecisionRates{});
  EXPECT_EQ(c.precision, Precision::FP32);
  EXPECT_TRUE(has(c.why, "could not be measured")) << c.why;
}

// The cache: where it lives, an entry written and read back, a garbage file recovered, "off".
TEST(PrecisionAuto, MachineCacheReadsWritesAndRecovers) {
  TempCache tmp;
  {
    ScopedEnv e("TETRAD_CACHE_DIR", tmp.dir.c_str());
    EXPECT_EQ(backend::machine_cache_path(), (tmp.dir / "machine.json").string());
  }
  {
    ScopedEnv e("TETRAD_CACHE_DIR", "off");
    std::string why;
    EXPECT_EQ(backend::machine_cache_path(&why), "");
    EXPECT_TRUE(has(why, "TETRAD_CACHE_DIR=off")) << why;
    int calls = 0;  // no cache: the update always runs
    const nlohmann::json v = backend::machine_cache_update(
        "", "e", [&](const nlohmann::json& c) -> nlohmann::json {
          EXPECT_TRUE(c.is_null());
          ++calls;
          return 7;
        });
    EXPECT_EQ(v, 7);
    EXPECT_EQ(calls, 1);
  }
  {
    ScopedEnv a("TETRAD_CACHE_DIR", nullptr), b("XDG_CACHE_HOME", "/x/y");
    EXPECT_EQ(backend::machine_cache_path(), "/x/y/tetrad/machine.json");
  }
  const std::string path = (tmp.dir / "sub" / "machine.json").string();  // made on first write
  auto put = [&](const std::string& entry, int value) {
    return backend::machine_cache_update(path, entry,
                                         [&](const nlohmann::json&) -> nlohmann::json { return value; });
  };
  auto get = [&](const std::string& entry) {
    nlohmann::json seen;
    backend::machine_cache_update(path, entry, [&](const nlohmann::json& c) -> nlohmann::json {
      seen = c;
      return nullptr;  // keep
    });
    return seen;
  };
  EXPECT_TRUE(get("a").is_null());
  EXPECT_EQ(put("a", 1), 1);
  EXPECT_EQ(put("b", 2), 2);
  EXPECT_EQ(get("a"), 1);  // another entry written after it is kept beside it
  EXPECT_EQ(get("b"), 2);
  std::ofstream(path, std::ios::trunc) << "{ not json";
  EXPECT_TRUE(get("a").is_null());  // unreadable: treated as empty...
  EXPECT_EQ(put("a", 3), 3);        // ...and rewritten
  EXPECT_EQ(get("a"), 3);
  // The key names the machine: the thread count is part of it.
  EXPECT_NE(backend::machine_key(1), backend::machine_key(2));
  EXPECT_TRUE(has(backend::machine_key(2), "oneDNN")) << backend::machine_key(2);
}

// Concurrent writers (ranks of one job on one node) each see the others' entries: the
// read-update-write holds the lock, so no update is lost.
TEST(PrecisionAuto, MachineCacheUpdatesUnderTheLock) {
  TempCache tmp;
  const std::string path = (tmp.dir / "machine.json").string();
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 25; ++i)
        backend::machine_cache_update(path, "n", [](const nlohmann::json& c) -> nlohmann::json {
          return c.is_null() ? 1 : c.get<int>() + 1;
        });
    });
  for (auto& t : ts) t.join();
  nlohmann::json seen;
  backend::machine_cache_update(path, "n", [&](const nlohmann::json& c) -> nlohmann::json {
    seen = c;
    return nullptr;
  });
  EXPECT_EQ(seen, 100);
}

// measured_precision takes a cached entry as it is (no timing): fake rates of either kind decide.
TEST(PrecisionAuto, ChoiceFromTheCachedMeasurement) {
  TempCache tmp;
  ScopedEnv e("TETRAD_CACHE_DIR", tmp.dir.c_str());
  ScopedEnv f("TETRAD_PRECISION_AUTO", nullptr);
  const std::string path = backend::machine_cache_path();
  const std::string entry = precision_cache_entry(omp_get_max_threads());
  for (const auto& [fp32, bf16, want] :
       {std::tuple{402.0, 1790.0, Precision::BF16}, std::tuple{362.0, 186.0, Precision::FP32}}) {
    backend::machine_cache_update(path, entry, [&](const nlohmann::json&) -> nlohmann::json {
      return {{"fp32", fp32}, {"bf16", bf16}, {"shapes", "fake"}, {"reps", 5},
              {"measured", "2026-12-05 00:00 UTC"}};
    });
    forget_measured_precision();
    const MeasuredChoice m = measured_precision();
    EXPECT_EQ(m.choice.precision, want);
    EXPECT_EQ(m.rates.fp32, fp32);
    EXPECT_EQ(m.rates.bf16, bf16);
    EXPECT_TRUE(has(m.source, "cached in " + path)) << m.source;
    EXPECT_TRUE(has(m.choice.why, "measured 2026-12-05 00:00 UTC")) << m.choice.why;
    if (native_bf16_matmul()) {  // auto itself follows the cached measurement
      EXPECT_EQ(auto_precision(), want);
      EXPECT_EQ(backend::resolve_precision("auto", backend::cpu_backend()).precision, want);
    }
  }
  forget_measured_precision();
}

// On this machine: where bf16 GEMMs would be emulated, fp32 without a measurement; where they
// are native, auto is what the measurement (cached or fresh) says, and the reason gives both
// rates. A measurement is made here only where bf16 is native and nothing is cached.
TEST(PrecisionAuto, AutoOnThisMachineFollowsItsMeasurement) {
  ScopedEnv f("TETRAD_PRECISION_AUTO", nullptr);
  TempCache tmp;
  ScopedEnv e("TETRAD_CACHE_DIR", tmp.dir.c_str());
  forget_measured_precision();
  const backend::PrecisionChoice c = backend::cpu_backend().auto_precision();
  if (!native_bf16_matmul()) {
    EXPECT_EQ(c.precision, Precision::FP32);
    EXPECT_TRUE(has(c.why, "bf16 would be emulated")) << c.why;
    EXPECT_FALSE(fs::exists(tmp.dir / "machine.json"));  // nothing measured
    return;
  }
  const MeasuredChoice m = measured_precision();
  EXPECT_GT(m.rates.fp32, 0);
  EXPECT_GT(m.rates.bf16, 0);
  EXPECT_EQ(c.precision, m.choice.precision);
  EXPECT_EQ(c.precision, choose_precision(m.rates).precision);
  EXPECT_TRUE(has(c.why, "bf16 GEMMs ")) << c.why;
  EXPECT_TRUE(has(c.why, "fp32")) << c.why;
  EXPECT_TRUE(fs::exists(tmp.dir / "machine.json"));
  // Another process's view: read from the cache, the same choice.
  forget_measured_precision();
  const MeasuredChoice again = measured_precision();
  EXPECT_EQ(again.choice.precision, m.choice.precision);
  EXPECT_TRUE(has(again.source, "cached in ")) << again.source;
  forget_measured_precision();
}
