#include "tetrad/core/cpu.hpp"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tetrad/core/error.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define TETRAD_X86 1
#endif

namespace tetrad {

namespace {

#ifdef TETRAD_X86
struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned subleaf = 0) {
  Regs r;
  __cpuid_count(leaf, subleaf, r.a, r.b, r.c, r.d);
  return r;
}

bool bit(unsigned v, int i) { return (v >> i) & 1u; }

// XCR0: which register states the OS saves on context switch. Only valid when OSXSAVE is set.
uint64_t xgetbv0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

// Linux >= 5.16 keeps AMX tile data off until the process asks for it; without the permission
// the first tile instruction kills the process with SIGILL.
bool request_amx_permission() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long kArchGetXcompPerm = 0x1022;
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
  unsigned long mask = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &mask) != 0) return false;
  return (mask >> kXfeatureXtiledata) & 1ul;
#else
  return false;
#endif
}

std::string trim(std::string s) {
  size_t b = s.find_first_not_of(' ');
  size_t e = s.find_last_not_of(' ');
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
#ifdef TETRAD_X86
  Regs r0 = cpuid(0);
  unsigned max_leaf = r0.a;
  char vendor[13] = {};
  std::memcpy(vendor + 0, &r0.b, 4);
  std::memcpy(vendor + 4, &r0.d, 4);
  std::memcpy(vendor + 8, &r0.c, 4);
  f.vendor = vendor;

  if (cpuid(0x80000000).a >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      Regs r = cpuid(0x80000002 + i);
      std::memcpy(brand + 16 * i + 0, &r.a, 4);
      std::memcpy(brand + 16 * i + 4, &r.b, 4);
      std::memcpy(brand + 16 * i + 8, &r.c, 4);
      std::memcpy(brand + 16 * i + 12, &r.d, 4);
    }
    f.brand = trim(brand);
  }

  bool osxsave = false;
  bool avx = false;
  if (max_leaf >= 1) {
    Regs r1 = cpuid(1);
    f.fma = bit(r1.c, 12);
    osxsave = bit(r1.c, 27);
    avx = bit(r1.c, 28);
  }
  if (max_leaf >= 7) {
    Regs r7 = cpuid(7, 0);
    f.avx2 = bit(r7.b, 5);
    f.avx512f = bit(r7.b, 16);
    f.avx512bw = bit(r7.b, 30);
    f.avx512vl = bit(r7.b, 31);
    f.amx_bf16 = bit(r7.d, 22);
    f.amx_tile = bit(r7.d, 24);
    f.amx_int8 = bit(r7.d, 25);
    if (r7.a >= 1) f.avx512_bf16 = bit(cpuid(7, 1).a, 5);
  }

  if (osxsave) {
    uint64_t xcr0 = xgetbv0();
    const uint64_t sse_avx = (1u << 1) | (1u << 2);              // XMM, YMM
    const uint64_t avx512 = (1u << 5) | (1u << 6) | (1u << 7);   // opmask, ZMM_Hi256, Hi16_ZMM
    const uint64_t tiles = (1u << 17) | (1u << 18);              // XTILECFG, XTILEDATA
    f.os_avx = avx && (xcr0 & sse_avx) == sse_avx;
    f.os_avx512 = f.os_avx && (xcr0 & avx512) == avx512;
    if (f.amx_tile && (xcr0 & tiles) == tiles) f.amx_permitted = request_amx_permission();
  }
#endif
  return f;
}

const char* env_isa_cap() {
  const char* e = std::getenv("TETRAD_MAX_CPU_ISA");
  return e && *e ? e : nullptr;
}

const char* onednn_isa_name(IsaLevel l) {
  switch (l) {
    case IsaLevel::Scalar: return "SSE41";
    case IsaLevel::Avx2: return "AVX2";
    case IsaLevel::Avx512: return "AVX512_CORE";
    case IsaLevel::Avx512Bf16: return "AVX512_CORE_BF16";
    case IsaLevel::Amx: return "AVX512_CORE_AMX";
  }
  return "ALL";
}

// Before main(): hand the cap to oneDNN, which reads ONEDNN_MAX_CPU_ISA once, at its first
// kernel; after that the variable would be ignored. A bad value is left for cpu_features() to
// report (throwing here would abort before main with no message).
const bool g_onednn_cap_applied = [] {
  const char* e = env_isa_cap();
  if (!e || std::getenv("ONEDNN_MAX_CPU_ISA")) return false;
  try {
    ::setenv("ONEDNN_MAX_CPU_ISA", onednn_isa_name(parse_isa_level(e)), 0);
    return true;
  } catch (const Error&) {
    return false;
  }
}();

}  // namespace

const char* isa_level_name(IsaLevel l) {
  switch (l) {
    case IsaLevel::Scalar: return "scalar";
    case IsaLevel::Avx2: return "avx2";
    case IsaLevel::Avx512: return "avx512";
    case IsaLevel::Avx512Bf16: return "avx512_bf16";
    case IsaLevel::Amx: return "amx";
  }
  return "?";
}

IsaLevel parse_isa_level(const std::string& s) {
  for (IsaLevel l : {IsaLevel::Scalar, IsaLevel::Avx2, IsaLevel::Avx512, IsaLevel::Avx512Bf16,
                     IsaLevel::Amx})
    if (s == isa_level_name(l)) return l;
  fail("TETRAD_MAX_CPU_ISA = \"", s,
       "\": expected scalar, avx2, avx512, avx512_bf16 or amx (the widest instruction set "
       "tetrad's kernels may use)");
}

CpuFeatures with_isa_cap(CpuFeatures f, IsaLevel cap) {
  f.max_isa = cap;
  return f;
}

std::string CpuFeatures::best_isa() const {
  if (use_amx_bf16()) return "amx-bf16";
  if (use_avx512()) return "avx512";
  if (use_avx2_fma()) return "avx2+fma";
  return "scalar";
}

std::string CpuFeatures::summary() const {
  std::string s = vendor.empty() ? "unknown-vendor" : vendor;
  if (!brand.empty()) s += " \"" + brand + "\"";
  s += " | cpuid:";
  auto add = [&](bool on, const char* name) {
    if (on) (s += ' ') += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512_bf16, "avx512_bf16");
  add(amx_tile, "amx_tile");
  add(amx_bf16, "amx_bf16");
  add(amx_int8, "amx_int8");
  s += " | os: avx=";
  s += os_avx ? "yes" : "no";
  s += " avx512=";
  s += os_avx512 ? "yes" : "no";
  s += " amx=";
  s += amx_permitted ? "yes" : "no";
  if (capped()) s += std::string(" | capped at ") + isa_level_name(max_isa) + " (TETRAD_MAX_CPU_ISA)";
  s += " | best: " + best_isa();
  return s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    CpuFeatures f = detect();
    if (const char* e = env_isa_cap()) f = with_isa_cap(f, parse_isa_level(e));
    return f;
  }();
  (void)g_onednn_cap_applied;
  return features;
}

int num_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  int n = CPU_COUNT(&set);
  return n > 0 ? n : 1;
}

int64_t peak_rss_bytes() {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return int64_t(ru.ru_maxrss) * 1024;  // kilobytes on Linux
}

int64_t current_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  long long size = 0, resident = 0;
  int n = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  if (n != 2) return 0;
  return int64_t(resident) * int64_t(sysconf(_SC_PAGESIZE));
}

int64_t hwm_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  long long kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmHWM: %lld kB", &kb) == 1) break;
  std::fclose(f);
  return int64_t(kb) * 1024;
}

bool reset_peak_rss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

}  // namespace tetrad
