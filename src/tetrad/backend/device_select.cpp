#include "tetrad/backend/device_select.hpp"

#include <cstdlib>

#include "tetrad/core/error.hpp"

namespace tetrad::backend {

namespace {
bool parse_nonneg(const std::string& s, int* out) {
  if (s.empty() || s.size() > 9) return false;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}
}  // namespace

int local_rank_from_environment(std::string* source) {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID",
                          "LOCAL_RANK"}) {
    const char* v = std::getenv(var);
    if (!v) continue;
    int r = 0;
    if (!parse_nonneg(v, &r))
      fail("environment variable ", var, "='", v, "' is not a node-local rank (expected a "
           "non-negative integer)");
    if (source) *source = var;
    return r;
  }
  if (source) *source = "none";
  return 0;
}

int device_for_local_rank(int local_rank, int device_count) {
  if (device_count <= 0) fail("no GPU to assign local rank ", local_rank, " to (0 devices visible)");
  if (local_rank < 0) fail("local rank ", local_rank, " is negative");
  return local_rank % device_count;
}

int parse_device_index(const std::string& name, const std::string& family) {
  if (name == family) return -1;
  const std::string prefix = family + ":";
  int v = 0;
  if (name.rfind(prefix, 0) == 0 && parse_nonneg(name.substr(prefix.size()), &v)) return v;
  fail("device '", name, "' is not one of '", family, "' (one per local rank) or '", family,
       ":N' (device N)");
}

}  // namespace tetrad::backend
