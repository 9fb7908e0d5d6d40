#include "tetrad/parallel/options.hpp"

#include <sstream>

#include "tetrad/core/error.hpp"

namespace tetrad::parallel {

Recompute parse_recompute(const std::string& text) {
  if (text == "none") return Recompute::None;
  if (text == "selective") return Recompute::Selective;
  if (text == "full") return Recompute::Full;
  fail("train.recompute: expected \"none\", \"selective\" or \"full\", got \"", text, "\"");
}

const char* recompute_name(Recompute mode) {
  switch (mode) {
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
  }
  return "?";
}

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
