// What the CPU can do, found at run time, and what the process is using.
//
// The build sets no -march flag, so the binary runs on any x86-64. Code with wide vectors is
// compiled per function (__attribute__((target("avx512f,fma"))) and the like) and chosen at run
// time from cpu_features(). An instruction set is usable only when the CPU has it (cpuid) *and*
// the operating system saves its registers (XCR0 via xgetbv) *and*, for AMX on Linux, the process
// has asked for the tile-data state (arch_prctl(ARCH_REQ_XCOMP_PERM)). The use_* helpers combine
// the three; the raw bits are kept for the machine line of benchmark output.
//
// Not done here: frequency, cache sizes or topology beyond the affinity count; non-x86 CPUs report
// every feature false. Everything is thread-safe; cpu_features() is computed once.
#pragma once
#include <cstdint>
#include <string>

namespace tetrad {

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

  // What code may use.
  bool use_avx2_fma() const { return avx2 && fma && os_avx; }
  bool use_avx512() const { return avx512f && os_avx512; }
  bool use_avx512_bf16() const { return use_avx512() && avx512_bf16; }
  bool use_amx_bf16() const { return amx_tile && amx_bf16 && amx_permitted; }

  // The widest usable floating-point path: "amx-bf16", "avx512", "avx2+fma" or "scalar".
  std::string best_isa() const;
  // One line: vendor, brand, cpuid features, OS state and the best usable path.
  std::string summary() const;
};

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
