// What the CPU can do, found at run time, and what the process is using.
//
// The build sets no -march flag, so the binary runs on any x86-64. Code with wide vectors is
// compiled per function (__attribute__((target("avx512f,fma"))) and the like) and chosen at run
// time from cpu_features(). An instruction set is usable only when the CPU has it (cpuid) *and*
// the operating system saves its registers (XCR0 via xgetbv) *and*, for AMX on Linux, the process
// has asked for the tile-data state (arch_prctl(ARCH_REQ_XCOMP_PERM)). The use_* helpers combine
// the three; the raw bits are kept for the machine line of benchmark output.
//
// TETRAD_MAX_CPU_ISA = scalar | avx2 | avx512 | avx512_bf16 | amx in the environment caps what
// the use_* helpers report (never above what the CPU has), so every run-time branch a narrower
// CPU takes can be forced on a wider one: tetrad's own kernels dispatch on use_*, and, unless
// ONEDNN_MAX_CPU_ISA is already set, the same cap is handed to oneDNN (its ISA names, read by
// oneDNN at its first kernel) before main() runs. An unknown value throws Error naming the choices.
//
// Not done here: frequency, cache sizes or topology beyond the affinity count; non-x86 CPUs report
// every feature false. Everything is thread-safe; cpu_features() is computed once.
#pragma once
#include <cstdint>
#include <string>

namespace tetrad {

// Instruction-set levels, each including the ones before it (what TETRAD_MAX_CPU_ISA names).
enum class IsaLevel { Scalar = 0, Avx2 = 1, Avx512 = 2, Avx512Bf16 = 3, Amx = 4 };
const char* isa_level_name(IsaLevel l);  // "scalar" | "avx2" | "avx512" | "avx512_bf16" | "amx"
// Parses a TETRAD_MAX_CPU_ISA value; throws Error listing the choices.
IsaLevel parse_isa_level(const std::string& s);

struct CpuFeatures {
  std::string vendor;  // cpuid leaf 0, e.g. "GenuineIntel", "AuthenticAMD"
  std::string brand;   // cpuid 0x80000002-4 brand string, may be empty or generic under a hypervisor

  // cpuid bits: the CPU implements the instructions.
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512_bf16 = false;
  bool amx_tile = false;
  bool amx_bf16 = false;
  bool amx_int8 = false;

  // Operating-system support.
  bool os_avx = false;         // XCR0 has SSE and AVX (YMM) state
  bool os_avx512 = false;      // XCR0 has SSE, AVX, opmask, ZMM_Hi256 and Hi16_ZMM state
  bool amx_permitted = false;  // XCR0 has tile state and Linux granted XTILEDATA to the process

  // The cap from TETRAD_MAX_CPU_ISA (Amx, i.e. none, when unset).
  IsaLevel max_isa = IsaLevel::Amx;
  bool capped() const { return max_isa != IsaLevel::Amx; }

  // What code may use: the CPU and the OS support it, and the cap allows it.
  bool use_avx2_fma() const { return allows(IsaLevel::Avx2) && avx2 && fma && os_avx; }
  bool use_avx512() const { return allows(IsaLevel::Avx512) && avx512f && os_avx512; }
  bool use_avx512_bf16() const {
    return allows(IsaLevel::Avx512Bf16) && use_avx512() && avx512_bf16;
  }
  bool use_amx_bf16() const {
    return allows(IsaLevel::Amx) && amx_tile && amx_bf16 && amx_permitted;
  }
  bool allows(IsaLevel l) const { return int(l) <= int(max_isa); }

  // The widest usable floating-point path: "amx-bf16", "avx512", "avx2+fma" or "scalar".
  std::string best_isa() const;
  // One line: vendor, brand, cpuid features, OS state and the best usable path.
  std::string summary() const;
};

// The features of `raw` with the cap `cap` applied (what cpu_features() does with the
// environment's cap; pure, for tests).
CpuFeatures with_isa_cap(CpuFeatures raw, IsaLevel cap);

// Detected once (thread-safe) and cached. The first call also asks Linux for AMX tile data
// permission when the CPU has AMX; that is what amx_permitted records.
const CpuFeatures& cpu_features();

// CPUs this process may run on (sched_getaffinity); at least 1.
int num_cores();

// Largest resident set so far (getrusage ru_maxrss), in bytes.
int64_t peak_rss_bytes();
// Resident set now (/proc/self/statm), in bytes; 0 where /proc is not available.
int64_t current_rss_bytes();
// The resident high-water mark (VmHWM of /proc/self/status), in bytes; 0 where unavailable.
// reset_peak_rss() sets it back to the current resident set (writes 5 to /proc/self/clear_refs),
// so one process can measure the peak of several phases in turn; false where Linux refuses.
int64_t hwm_rss_bytes();
bool reset_peak_rss();

}  // namespace tetrad
