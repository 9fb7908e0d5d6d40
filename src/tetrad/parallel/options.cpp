#include "tetrad/parallel/options.hpp"

#include <sstream>

#include "tetrad/core/error.hpp"
#include "tetrad/core/names.hpp"

namespace tetrad::parallel {

namespace {
constexpr Named<Recompute> kRecomputeNames[] = {
    {Recompute::None, "none"}, {Recompute::Selective, "selective"}, {Recompute::Full, "full"}};
}  // namespace

Recompute parse_recompute(const std::string& text) {
  return parse_named(text, kRecomputeNames, "train.recompute");
}

const char* recompute_name(Recompute mode) { return name_of(mode, kRecomputeNames); }

std::string OverlapOptions::summary() const {
  std::ostringstream os;
  os << "overlap: backward all-reduce " << (backward_allreduce ? "on" : "off")
     << ", reduce-scatter " << (reduce_scatter ? "on" : "off") << ", prefetch depth "
     << prefetch_depth << (prefetch_across_steps ? " (across steps)" : "") << ", weight cache " << (cache_gathered_weights ? "on" : "off")
     << ", data-parallel buckets " << (dp_overlap ? "overlapped" : "at the end") << " ("
     << (dp_bucket_mb > 0 ? std::to_string(dp_bucket_mb) + " MiB" : std::string("per tensor"))
     << "), forward chunks " << forward_chunks << ", progress "
     << (progress_thread ? "thread" : "polling");
  return os.str();
}

}  // namespace tetrad::parallel
