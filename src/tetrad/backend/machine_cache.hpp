// Figures measured once per machine and kept between runs (issue 29): what precision "auto"
// measured (the faster of fp32 and bf16 GEMMs here) and the best peaks MFU divides by. A run
// reads them instead of measuring again, so start-up stays short and a measurement disturbed by
// another process does not decide a run by itself.
//
// Where: $TETRAD_CACHE_DIR, else $XDG_CACHE_HOME/tetrad, else $HOME/.cache/tetrad, file
// machine.json (one JSON object: entry name -> value). TETRAD_CACHE_DIR=off keeps nothing (every
// run measures). Entries are named by what they measure and the machine they were measured on
// (machine_key: the CPU's identity and features, the ISA cap, the oneDNN version, the thread
// count), so a changed CPU, library or thread count is a new entry, measured afresh.
//
// Concurrency: every access holds an exclusive flock on machine.json.lock for the whole
// read-measure-write, and the file is replaced atomically (write + rename). Ranks of one job on
// one node therefore agree: the first measures and writes, the others wait and read its answer.
// A cache that cannot be read or written is never an error: the caller measures, and `why` says
// what happened.
#pragma once
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace tetrad::backend {

// The cache file, or "" where caching is off or no directory is known (why says which).
std::string machine_cache_path(std::string* why = nullptr);

// "GenuineIntel "<brand>" | cpuid: ... | os: ... | best: amx-bf16; oneDNN 2.6.0; 2 threads":
// what a cached figure is valid for.
std::string machine_key(int threads);

// Under the lock: the value of `entry` in the cache at `path` (null when absent), passed to
// `update`, whose result (if not null) is written back as the entry's new value. Returns the
// value the caller should use: update's result, or the cached one when update returns null.
// path "": no cache, update(null) is called and its result returned. A file that cannot be read
// (bad JSON) is treated as empty and rewritten; a failure to write leaves `note` saying so.
nlohmann::json machine_cache_update(const std::string& path, const std::string& entry,
                                    const std::function<nlohmann::json(const nlohmann::json&)>& update,
                                    std::string* note = nullptr);

}  // namespace tetrad::backend
