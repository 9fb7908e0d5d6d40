#include "tetrad/planner/scaling.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "tetrad/core/error.hpp"
#include "tetrad/planner/report.hpp"
#include "tetrad/planner/validate.hpp"

namespace tetrad::planner {

ScalingKind parse_scaling_kind(const std::string& s) {
  if (s == "weak") return ScalingKind::Weak;
  if (s == "strong") return ScalingKind::Strong;
  fail("--scaling '", s, "': expected weak or strong");
}
const char* name(ScalingKind k) { return k == ScalingKind::Weak ? "weak" : "strong"; }

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) out.push_back(cur), cur.clear();
    else if (c != ' ') cur += c;
  }
  out.push_back(cur);
  return out;
}

int parse_positive(const std::string& t, const std::string& what) {
  size_t used = 0;
  long v = 0;
  try {
    v = std::stol(t, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (t.empty() || used != t.size() || v < 1 || v > (1L << 30))
    fail(what, ": '", t, "' is not a positive integer");
  return int(v);
}

}  // namespace

std::vector<int> parse_rank_list(const std::string& s) {
  std::vector<int> out;
  for (const auto& t : split(s, ',')) out.push_back(parse_positive(t, "--ranks"));
  for (size_t i = 1; i < out.size(); ++i)
    if (out[i] <= out[i - 1])
      fail("--ranks '", s, "': rank counts must be strictly increasing (", out[i - 1], " then ",
           out[i], ")");
  return out;
}

std::vector<GridShape> parse_grid_list(const std::string& s) {
  std::vector<GridShape> out;
  for (const auto& g : split(s, ';')) {
    try {
      out.push_back(parallel::parse_grid(g));  // x,y,z,d, x,y,z,p,d or named (d=2,x=2)
    } catch (const Error& e) {
      fail("--grids: ", e.what(), " (points separated by ';')");
    }
  }
  return out;
}

void ScalingSpec::validate() const {
  if (ranks.empty()) fail("scaling: no rank counts (--ranks 512,1024,...)");
  for (size_t i = 1; i < ranks.size(); ++i)
    if (ranks[i] <= ranks[i - 1]) fail("scaling: rank counts must be strictly increasing");
  if (!models.empty() && models.size() != ranks.size())
    fail("scaling: ", models.size(), " models for ", ranks.size(),
         " rank counts (one model per point, or one for all)");
  if (!models.empty() && kind == ScalingKind::Strong)
    fail("scaling: strong scaling keeps one model; a model per point is weak scaling (--scaling weak)");
  if (!global_batches.empty() && global_batches.size() != ranks.size())
    fail("scaling: ", global_batches.size(), " global batches for ", ranks.size(), " rank counts");
  if (!grids.empty() && grids.size() != ranks.size())
    fail("scaling: ", grids.size(), " grids for ", ranks.size(), " rank counts (--grids: one per point)");
  for (size_t i = 0; i < grids.size(); ++i)
    if (grids[i].size() != ranks[i])
      fail("scaling: grid ", grid_label(grids[i]), " has ", grids[i].size(), " ranks, point ", i + 1,
           " has ", ranks[i]);
  if (base.global_batch < 1 && global_batches.empty())
    fail("scaling: the first point needs a global batch (--global-batch)");
}

PlanInput scaling_point_input(const ScalingSpec& spec, size_t i) {
  PlanInput in = spec.base;
  in.ranks = spec.ranks[i];
  if (!spec.models.empty()) {
    in.model = spec.models[i];
    in.model_name = spec.model_names[i];
  }
  if (!spec.global_batches.empty()) {
    in.global_batch = spec.global_batches[i];
    if (in.micro_batch > in.global_batch) in.micro_batch = in.global_batch;
  } else if (spec.kind == ScalingKind::Weak && spec.models.empty()) {
    // One model: work per GPU constant means tokens per GPU constant.
    const int64_t r0 = spec.ranks[0], r = spec.ranks[i];
    if ((spec.base.global_batch * r) % r0 != 0)
      fail("weak scaling: global batch ", spec.base.global_batch, " x ", r, " / ", r0,
           " ranks is not a whole number of sequences");
    in.global_batch = spec.base.global_batch * r / r0;
    if (spec.base.micro_batch > 0) {
      if ((spec.base.micro_batch * r) % r0 != 0)
        fail("weak scaling: micro-batch ", spec.base.micro_batch, " x ", r, " / ", r0,
             " ranks is not a whole number of sequences");
      in.micro_batch = spec.base.micro_batch * r / r0;
    }
  }
  return in;
}

namespace {

const char* kLossTerms[] = {"comm x", "comm y", "comm z", "comm p", "comm d", "comm zd",
                            "bubble", "contention", "optimizer", "compute rate"};

void fill_shares(ScalingPoint& p, double seconds_per_flop0) {
  const Estimate& e = p.estimate;
  std::map<std::string, double> s;
  const double step = e.step;
  s["compute"] = e.compute / step;
  double by_axis_total = 0;
  std::map<std::string, double> by_axis;
  for (const auto& c : e.collectives) {
    by_axis[std::string("comm ") + c.axis.name()] += c.exposed;
    by_axis_total += c.exposed;
  }
  for (const char* t : kLossTerms) s[t] = 0;
  if (by_axis_total > 0)
    for (const auto& [k, v] : by_axis) s[k] = e.comm_exposed * v / by_axis_total / step;
  s["bubble"] = e.bubble / step;
  s["contention"] = e.contention / step;
  s["optimizer"] = e.optimizer / step;
  const double flops_per_rank = e.hardware_flops / p.ranks;
  s["compute rate"] = seconds_per_flop0 > 0 ? (e.compute - flops_per_rank * seconds_per_flop0) / step : 0;
  p.shares = s;
  p.limit = "compute";
  p.limit_share = 0;
  for (const char* t : kLossTerms)
    if (s[t] > p.limit_share) p.limit = t, p.limit_share = s[t];
  if (p.limit_share < 0.05) p.limit = "compute", p.limit_share = s["compute"];
}

}  // namespace

std::vector<ScalingPoint> scaling_curve(const ScalingSpec& spec, const Machine& m) {
  spec.validate();
  std::vector<ScalingPoint> pts;
  double seconds_per_flop0 = 0, model_per_gpu0 = 0;
  const ScalingPoint* first = nullptr;
  for (size_t i = 0; i < spec.ranks.size(); ++i) {
    const PlanInput in = scaling_point_input(spec, i);
    ScalingPoint p;
    p.ranks = in.ranks;
    p.model_name = in.model_name;
    p.parameters = double(local_parameters(in.model, GridShape{}));
    p.global_batch = in.global_batch;
    const long need_nodes = (long(in.ranks) + m.ranks_per_node - 1) / m.ranks_per_node;
    if (m.topology.machine_nodes() > 0 && need_nodes > m.topology.machine_nodes()) {
      p.reject = std::to_string(in.ranks) + " ranks need " + std::to_string(need_nodes) +
                 " nodes; machine '" + m.name + "' has " + std::to_string(m.topology.machine_nodes());
    } else if (!spec.grids.empty()) {
      p.grid_given = true;
      p.estimate = estimate(in, spec.grids[i], m);
      p.grids_total = p.grids_valid = 1;
      p.valid = p.estimate.valid;
      p.reject = p.estimate.reject;
    } else {
      const auto all = plan(in, m);
      p.grids_total = int(all.size());
      for (const auto& e : all) p.grids_valid += e.valid;
      if (!all.empty() && all.front().valid) {
        p.estimate = all.front();
        p.valid = true;
      } else {
        // The most telling rejection: a grid that divides but does not fit, if any.
        p.reject = all.empty() ? "no grid" : all.front().reject;
        for (const auto& e : all)
          if (e.reject.starts_with("does not fit")) {
            p.reject = "no grid fits; e.g. " + grid_label(e.grid) + " " + e.reject;
            break;
          }
      }
    }
    if (p.valid) {
      const Estimate& e = p.estimate;
      p.step = e.step;
      p.tokens_per_s = e.tokens_per_s;
      p.model_flops_per_s = e.model_flops_full / e.step;
      p.hardware_flops_per_s = e.hardware_flops_full / e.step;
      p.model_flops_per_gpu = p.model_flops_per_s / p.ranks;
      p.hardware_flops_per_gpu = p.hardware_flops_per_s / p.ranks;
      p.mfu = e.mfu;
      p.hfu = e.hfu;
      p.memory_bound = e.memory.total() > 0.9 * m.memory_bytes;
      if (seconds_per_flop0 == 0) {
        seconds_per_flop0 = e.compute / (e.hardware_flops / p.ranks);
        model_per_gpu0 = p.model_flops_per_gpu;
      }
      p.efficiency = p.model_flops_per_gpu / model_per_gpu0;
      fill_shares(p, seconds_per_flop0);
    }
    pts.push_back(p);
  }
  for (auto& p : pts) {
    if (!p.valid) continue;
    if (!first) first = &p;
    p.grew.clear();
    p.grew_by = 0;
    for (const char* t : kLossTerms) {
      const double d = p.shares.at(t) - first->shares.at(t);
      if (d > p.grew_by + 1e-12) p.grew = t, p.grew_by = d;
    }
    if (p.grew_by < 0.005) p.grew.clear(), p.grew_by = 0;
  }
  return pts;
}

namespace {

std::string human_params(double n) {
  char b[32];
  if (n >= 1e12) std::snprintf(b, sizeof b, "%.2fT", n / 1e12);
  else if (n >= 1e9) std::snprintf(b, sizeof b, "%.1fB", n / 1e9);
  else if (n >= 1e6) std::snprintf(b, sizeof b, "%.1fM", n / 1e6);
  else std::snprintf(b, sizeof b, "%.0f", n);
  return b;
}

std::string settings_line(const ScalingSpec& spec, const Machine& m) {
  const PlanInput& b = spec.base;
  std::ostringstream o;
  o << name(spec.kind) << " scaling on machine '" << m.name << "' (" << m.ranks_per_node
    << " ranks/node";
  if (m.topology.present())
    o << ", " << topology_kind_name(m.topology.kind) << " of " << m.topology.nodes_per_group
      << "-node groups";
  o << "): " << (spec.models.empty() ? b.model_name : "a model per point") << ", seq " << b.seq
    << ", " << name(b.precision) << ", recompute " << name(b.recompute) << ", ZeRO " << b.zero
    << ", overlap " << name(b.overlap) << ", attention " << name(b.attention_kernel)
    << (b.allow_pipeline ? "" : ", no pipeline") << "; ";
  if (!spec.global_batches.empty()) o << "global batch per point as given";
  else if (spec.kind == ScalingKind::Weak && spec.models.empty())
    o << "global batch " << b.global_batch << " sequences at " << spec.ranks[0]
      << " ranks, in proportion to the ranks";
  else o << "global batch " << b.global_batch << " sequences at every point";
  if (b.search_micro_batch) o << ", micro-batch chosen per point (the fastest that fits)";
  else if (b.micro_batch > 0) o << ", micro-batch " << b.micro_batch << " (whole job)";
  else if (b.micro_batch_per_data_group > 0)
    o << ", micro-batch " << b.micro_batch_per_data_group << " per data group, divided over Z";
  else o << ", micro-batch " << b.micro_batch_per_replica << " per replica";
  o << "\nFLOP/s: hardware FLOPs (recomputation counted) for 'PFLOP/s' and 'TFLOP/s/GPU', "
       "model FLOPs for efficiency (per-GPU model FLOP/s / the first point's), both with attention "
       "counted in full (Narayanan et al.'s count, the one published runs report); MFU and HFU count "
       "causal attention as half (the work the kernels do)\n";
  return o.str();
}

}  // namespace

std::string scaling_text(const ScalingSpec& spec, const Machine& m,
                         const std::vector<ScalingPoint>& pts) {
  std::ostringstream o;
  o << settings_line(spec, m);
  char line[512];
  std::snprintf(line, sizeof line, "%7s  %-10s %8s %7s  %-16s %-10s %9s %11s %9s %10s %6s %6s %6s  %-22s %s\n",
                "ranks", "model", "params", "batch", "grid (x,y,z,p,d)", "micro x m", "step s", "tokens/s",
                "PFLOP/s", "TFLOP/s/GPU", "MFU", "HFU", "eff", "limit (share of step)",
                "grew most since first");
  o << line;
  for (const auto& p : pts) {
    if (!p.valid) {
      std::snprintf(line, sizeof line, "%7d  %-10s %8s %7lld  ", p.ranks, p.model_name.c_str(),
                    human_params(p.parameters).c_str(), static_cast<long long>(p.global_batch));
      o << line << "no valid grid: " << p.reject << "\n";
      continue;
    }
    const std::string grid = grid_label(p.estimate.grid) + (p.grid_given ? "*" : "");
    std::string limit = p.limit + " " + std::to_string(int(std::lround(100 * p.limit_share))) + "%";
    if (p.memory_bound) limit += ", memory";
    char grew[64] = "-";
    if (!p.grew.empty()) std::snprintf(grew, sizeof grew, "%s +%.1f pts", p.grew.c_str(), 100 * p.grew_by);
    std::snprintf(line, sizeof line,
                  "%7d  %-10s %8s %7lld  %-16s %-10s %9.3f %11.4g %9.2f %10.1f %5.1f%% %5.1f%% %5.1f%%  %-22s %s\n",
                  p.ranks, p.model_name.c_str(), human_params(p.parameters).c_str(),
                  static_cast<long long>(p.global_batch), grid.c_str(), micro_label(p.estimate).c_str(),
                  p.step, p.tokens_per_s,
                  p.hardware_flops_per_s / 1e15, p.hardware_flops_per_gpu / 1e12, 100 * p.mfu,
                  100 * p.hfu, 100 * p.efficiency, limit.c_str(), grew);
    o << line;
  }
  if (!spec.grids.empty()) o << "(* grid given for the point)\n";
  return o.str();
}

nlohmann::json scaling_json(const ScalingSpec& spec, const Machine& m,
                            const std::vector<ScalingPoint>& pts) {
  nlohmann::json j;
  j["kind"] = name(spec.kind);
  j["machine"] = m.name;
  j["ranks_per_node"] = m.ranks_per_node;
  j["topology"] = topology_kind_name(m.topology.kind);
  j["seq"] = spec.base.seq;
  j["precision"] = name(spec.base.precision);
  j["recompute"] = name(spec.base.recompute);
  j["zero"] = spec.base.zero;
  j["overlap"] = name(spec.base.overlap);
  j["attention_kernel"] = name(spec.base.attention_kernel);
  j["micro_batch_searched"] = spec.base.search_micro_batch;
  j["flops_basis"] = "pflops / *_hardware_*: hardware FLOPs (recomputation counted); mfu and "
                     "efficiency: model FLOPs";
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& p : pts) {
    nlohmann::json q;
    q["ranks"] = p.ranks;
    q["model"] = p.model_name;
    q["parameters"] = p.parameters;
    q["global_batch"] = p.global_batch;
    q["valid"] = p.valid;
    if (!p.valid) {
      q["reject"] = p.reject;
      arr.push_back(q);
      continue;
    }
    static constexpr std::pair<const char*, double ScalingPoint::*> kNumbers[] = {
        {"step_s", &ScalingPoint::step},
        {"tokens_per_s", &ScalingPoint::tokens_per_s},
        {"model_flops_per_s", &ScalingPoint::model_flops_per_s},
        {"hardware_flops_per_s", &ScalingPoint::hardware_flops_per_s},
        {"model_flops_per_s_per_gpu", &ScalingPoint::model_flops_per_gpu},
        {"hardware_flops_per_s_per_gpu", &ScalingPoint::hardware_flops_per_gpu},
        {"mfu", &ScalingPoint::mfu},
        {"hfu", &ScalingPoint::hfu},
        {"efficiency", &ScalingPoint::efficiency},
        {"limit_share", &ScalingPoint::limit_share},
        {"grew_by", &ScalingPoint::grew_by}};
    for (const auto& [key, field] : kNumbers) q[key] = p.*field;
    q["grid"] = grid_label(p.estimate.grid);
    q["c"] = p.estimate.grid.c();  // the context axis (issue 28): 1 without one
    q["cp_comm"] = p.estimate.grid.c() > 1 ? name(p.estimate.cp_comm) : "none";
    q["grid_given"] = p.grid_given;
    q["grids_valid"] = p.grids_valid;
    q["grids_total"] = p.grids_total;
    q["micro_batch"] = p.estimate.micro_batch;
    q["micro_batch_per_replica"] = p.estimate.micro_batch / parallel::token_slots(p.estimate.grid);
    q["micro_batches"] = p.estimate.micro_batches;
    q["pflops"] = p.hardware_flops_per_s / 1e15;
    q["limit"] = p.limit;
    q["grew_most"] = p.grew;
    q["memory_bound"] = p.memory_bound;
    q["memory_per_rank_bytes"] = p.estimate.memory.total();
    q["shares"] = p.shares;
    q["estimate"] = p.estimate.to_json();
    arr.push_back(q);
  }
  j["points"] = arr;
  return j;
}

std::vector<ReferencePoint> load_reference_points(const std::string& path) {
  std::ifstream f(path);
  if (!f) fail("cannot read reference points '", path, "'");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  std::vector<nlohmann::json> items;
  try {
    const auto j = nlohmann::json::parse(text);
    if (j.is_array()) items.assign(j.begin(), j.end());
    else items.push_back(j);
  } catch (const std::exception&) {
    // JSON lines
    std::istringstream ls(text);
    std::string line;
    int n = 0;
    while (std::getline(ls, line)) {
      ++n;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      try {
        items.push_back(nlohmann::json::parse(line));
      } catch (const std::exception& e) {
        fail("reference points '", path, "' line ", n, ": not JSON (", e.what(), ")");
      }
    }
  }
  std::vector<ReferencePoint> out;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& j = items[i];
    if (!j.is_object() || !j.contains("ranks") || !j["ranks"].is_number_integer())
      fail("reference points '", path, "' entry ", i + 1, ": needs \"ranks\" (an integer)");
    ReferencePoint r;
    r.ranks = j["ranks"].get<int>();
    if (j.contains("pflops") && !j["pflops"].is_null()) r.pflops = j["pflops"].get<double>();
    if (j.contains("efficiency") && !j["efficiency"].is_null()) r.efficiency = j["efficiency"].get<double>();
    r.label = j.value("label", std::string("reference"));
    if (r.ranks < 1 || (r.pflops < 0 && r.efficiency < 0))
      fail("reference points '", path, "' entry ", i + 1,
           ": needs ranks >= 1 and \"pflops\" or \"efficiency\" (a fraction, 1 = 100%)");
    out.push_back(r);
  }
  if (out.empty()) fail("reference points '", path, "' has no points");
  return out;
}

namespace {

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&apos;"; break;
      default:
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\n') o += c;
    }
  }
  return o;
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

std::string tick_label(double v) {
  char b[32];
  if (v >= 100 || v == std::floor(v)) std::snprintf(b, sizeof b, "%.0f", v);
  else if (v >= 1) std::snprintf(b, sizeof b, "%.1f", v);
  else std::snprintf(b, sizeof b, "%.2g", v);
  return b;
}

// One panel: x = log2(ranks), y linear or log10.
struct Panel {
  double x0, y0, w, h;       // pixel box of the plotting area
  double lx_min, lx_max;     // log2 ranks
  double y_min, y_max;       // data (log10 when logy)
  bool logy;
  double px(double ranks) const {
    const double lx = std::log2(ranks);
    return x0 + (lx_max > lx_min ? (lx - lx_min) / (lx_max - lx_min) : 0.5) * w;
  }
  double py(double v) const {
    const double t = logy ? std::log10(std::max(v, 1e-30)) : v;
    return y0 + h - (t - y_min) / (y_max - y_min) * h;
  }
};

void marker(std::ostringstream& o, int shape, double x, double y, const char* color) {
  switch (shape % 4) {
    case 0: o << "<circle cx=\"" << num(x) << "\" cy=\"" << num(y) << "\" r=\"4\" fill=\"" << color << "\"/>"; break;
    case 1: o << "<rect x=\"" << num(x - 4) << "\" y=\"" << num(y - 4) << "\" width=\"8\" height=\"8\" fill=\"" << color << "\"/>"; break;
    case 2: o << "<path d=\"M" << num(x) << " " << num(y - 5) << " L" << num(x + 5) << " " << num(y) << " L" << num(x) << " " << num(y + 5) << " L" << num(x - 5) << " " << num(y) << " Z\" fill=\"" << color << "\"/>"; break;
    default: o << "<path d=\"M" << num(x) << " " << num(y - 5) << " L" << num(x + 5) << " " << num(y + 4) << " L" << num(x - 5) << " " << num(y + 4) << " Z\" fill=\"" << color << "\"/>"; break;
  }
  o << "\n";
}

}  // namespace

std::string scaling_svg(const ScalingSpec& spec, const Machine& m, const std::vector<ScalingPoint>& pts,
                        const std::vector<ReferencePoint>& refs) {
  const double W = 980, H = 430;
  double rmin = 1e300, rmax = 0, emax = 1.05, fmin = 1e300, fmax = 0;
  auto take_r = [&](double r) { rmin = std::min(rmin, r), rmax = std::max(rmax, r); };
  const ScalingPoint* first = nullptr;
  for (const auto& p : pts) {
    take_r(p.ranks);
    if (!p.valid) continue;
    if (!first) first = &p;
    emax = std::max(emax, p.efficiency * 1.05);
    fmin = std::min(fmin, p.hardware_flops_per_s / 1e15);
    fmax = std::max(fmax, p.hardware_flops_per_s / 1e15);
  }
  for (const auto& r : refs) {
    take_r(r.ranks);
    if (r.efficiency >= 0) emax = std::max(emax, r.efficiency * 1.05);
    if (r.pflops > 0) fmin = std::min(fmin, r.pflops), fmax = std::max(fmax, r.pflops);
  }
  if (first) {  // the ideal line spans the first point to the largest rank count
    const double ideal_top = first->hardware_flops_per_s / 1e15 * rmax / first->ranks;
    fmax = std::max(fmax, ideal_top);
  }
  if (!(fmax > 0)) fmin = 0.1, fmax = 1;
  if (rmax <= 0) rmin = 1, rmax = 2;
  const double lx_min = std::floor(std::log2(rmin)), lx_max = std::max(lx_min + 1, std::ceil(std::log2(rmax)));
  Panel eff{70, 60, 380, 300, lx_min, lx_max, 0, std::ceil(emax * 10) / 10, false};
  Panel fl{570, 60, 380, 300, lx_min, lx_max, std::floor(std::log10(fmin)), std::ceil(std::log10(fmax)), true};
  if (fl.y_max <= fl.y_min) fl.y_max = fl.y_min + 1;

  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" viewBox=\"0 0 " << W << " " << H << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  std::string title = std::string(name(spec.kind)) + " scaling, machine " + m.name + ": " +
                      (spec.models.empty() ? spec.base.model_name : std::string("a model per point")) +
                      ", " + name(spec.base.precision) + ", recompute " + name(spec.base.recompute);
  o << "<text x=\"" << W / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">"
    << xml_escape(title) << "</text>\n";
  auto axes = [&](const Panel& p, const std::string& ylabel) {
    o << "<rect x=\"" << p.x0 << "\" y=\"" << p.y0 << "\" width=\"" << p.w << "\" height=\"" << p.h
      << "\" fill=\"none\" stroke=\"#444\"/>\n";
    for (double lx = p.lx_min; lx <= p.lx_max + 1e-9; lx += 1) {
      const double x = p.px(std::pow(2.0, lx));
      o << "<line x1=\"" << num(x) << "\" y1=\"" << p.y0 << "\" x2=\"" << num(x) << "\" y2=\""
        << p.y0 + p.h << "\" stroke=\"#ddd\"/>\n"
        << "<text x=\"" << num(x) << "\" y=\"" << p.y0 + p.h + 16 << "\" text-anchor=\"middle\">"
        << tick_label(std::pow(2.0, lx)) << "</text>\n";
    }
    const int steps = p.logy ? int(p.y_max - p.y_min) : int(std::lround(p.y_max * 10));
    for (int k = 0; k <= steps; k += p.logy ? 1 : 2) {
      const double v = p.logy ? std::pow(10.0, p.y_min + k) : k / 10.0;
      const double y = p.py(v);
      o << "<line x1=\"" << p.x0 << "\" y1=\"" << num(y) << "\" x2=\"" << p.x0 + p.w << "\" y2=\""
        << num(y) << "\" stroke=\"#ddd\"/>\n"
        << "<text x=\"" << p.x0 - 6 << "\" y=\"" << num(y + 4) << "\" text-anchor=\"end\">"
        << (p.logy ? tick_label(v) : tick_label(100 * v) + "%") << "</text>\n";
    }
    o << "<text x=\"" << p.x0 + p.w / 2 << "\" y=\"" << p.y0 + p.h + 34
      << "\" text-anchor=\"middle\">ranks (GPUs)</text>\n"
      << "<text x=\"" << p.x0 - 50 << "\" y=\"" << p.y0 + p.h / 2 << "\" text-anchor=\"middle\" "
      << "transform=\"rotate(-90 " << p.x0 - 50 << " " << p.y0 + p.h / 2 << ")\">"
      << xml_escape(ylabel) << "</text>\n";
  };
  axes(eff, "scaling efficiency (model FLOP/s per GPU vs first point)");
  axes(fl, "sustained PFLOP/s (hardware FLOPs)");
  const char* pred = "#1f5fbf";
  const char* ref_colors[] = {"#d9480f", "#2b8a3e", "#862e9c", "#e67700"};
  // Ideal scaling.
  if (first) {
    o << "<line x1=\"" << num(eff.px(rmin)) << "\" y1=\"" << num(eff.py(1)) << "\" x2=\""
      << num(eff.px(rmax)) << "\" y2=\"" << num(eff.py(1)) << "\" stroke=\"#888\" stroke-dasharray=\"5,4\"/>\n";
    const double f0 = first->hardware_flops_per_s / 1e15;
    o << "<line x1=\"" << num(fl.px(first->ranks)) << "\" y1=\"" << num(fl.py(f0)) << "\" x2=\""
      << num(fl.px(rmax)) << "\" y2=\"" << num(fl.py(f0 * rmax / first->ranks))
      << "\" stroke=\"#888\" stroke-dasharray=\"5,4\"/>\n";
  }
  auto polyline = [&](const Panel& p, bool flops) {
    std::ostringstream pl;
    for (const auto& q : pts)
      if (q.valid)
        pl << num(p.px(q.ranks)) << "," << num(p.py(flops ? q.hardware_flops_per_s / 1e15 : q.efficiency)) << " ";
    o << "<polyline points=\"" << pl.str() << "\" fill=\"none\" stroke=\"" << pred << "\" stroke-width=\"2\"/>\n";
    for (const auto& q : pts)
      if (q.valid) marker(o, 0, p.px(q.ranks), p.py(flops ? q.hardware_flops_per_s / 1e15 : q.efficiency), pred);
  };
  polyline(eff, false);
  polyline(fl, true);
  std::vector<std::string> labels;
  for (const auto& r : refs)
    if (std::find(labels.begin(), labels.end(), r.label) == labels.end()) labels.push_back(r.label);
  for (const auto& r : refs) {
    const int k = int(std::find(labels.begin(), labels.end(), r.label) - labels.begin());
    const char* c = ref_colors[k % 4];
    if (r.efficiency >= 0) marker(o, 1 + k, eff.px(r.ranks), eff.py(r.efficiency), c);
    if (r.pflops > 0) marker(o, 1 + k, fl.px(r.ranks), fl.py(r.pflops), c);
  }
  // Legend.
  double ly = H - 22;
  double lx = 70;
  marker(o, 0, lx, ly - 4, pred);
  o << "<text x=\"" << lx + 10 << "\" y=\"" << ly << "\">predicted (tetrad plan)</text>\n";
  lx += 170;
  o << "<line x1=\"" << lx - 8 << "\" y1=\"" << ly - 4 << "\" x2=\"" << lx + 8 << "\" y2=\"" << ly - 4
    << "\" stroke=\"#888\" stroke-dasharray=\"5,4\"/><text x=\"" << lx + 12 << "\" y=\"" << ly
    << "\">ideal</text>\n";
  lx += 70;
  for (size_t k = 0; k < labels.size(); ++k) {
    marker(o, 1 + int(k), lx, ly - 4, ref_colors[k % 4]);
    o << "<text x=\"" << lx + 10 << "\" y=\"" << ly << "\">" << xml_escape(labels[k]) << "</text>\n";
    lx += 20 + 7.0 * double(labels[k].size());
  }
  o << "</svg>\n";
  return o.str();
}

// ------------------------------------------------------------------- published scaling rows

namespace {

const ScalingPoint* at(const std::vector<ScalingPoint>& pts, int ranks) {
  for (const auto& p : pts)
    if (p.ranks == ranks) return &p;
  return nullptr;
}

// Megatron-LM's weak-scaling table (Narayanan et al., SC21, table 1): GPT models of 1.7B to 1T
// on 32 to 3072 A100-80GB GPUs of Selene (DGX A100, 8 per node, InfiniBand), V = 51200,
// S = 2048, mixed precision, the paper's tensor (t) and pipeline (p) degrees and batches, full
// recomputation (its 96 B S L H^2 FLOP count), no overlap, attention with its scores in memory
// (AttentionKernel::Materialized: Megatron-LM's kernels of 2021, before FlashAttention; dropout
// of the probabilities at Megatron's default 0.1). Assumed: micro-batch 1 per replica (the table
// does not give it; the --published 1T row's), the 1F1B schedule, no ZeRO.
PublishedScaling megatron_weak_scaling() {
  struct Row {
    const char* name;
    int L, H, heads, t, p, gpus;
    int64_t batch;
    double pflops;
  };
  const Row table[] = {{"1.7B", 24, 2304, 24, 1, 1, 32, 512, 4.4},
                       {"3.6B", 30, 3072, 32, 2, 1, 64, 512, 8.8},
                       {"7.5B", 36, 4096, 32, 4, 1, 128, 512, 18.2},
                       {"18.4B", 40, 6144, 48, 8, 1, 256, 1024, 34.6},
                       {"39.1B", 48, 8192, 64, 8, 2, 512, 1536, 70.8},
                       {"76.1B", 60, 10240, 80, 8, 4, 1024, 1792, 143.8},
                       {"145.6B", 80, 12288, 96, 8, 8, 1536, 2304, 227.1},
                       {"310.1B", 96, 16384, 128, 8, 16, 1920, 2160, 297.4},
                       {"529.6B", 105, 20480, 128, 8, 35, 2520, 2520, 410.2},
                       {"1008.0B", 128, 25600, 160, 8, 64, 3072, 3072, 502.0}};
  PublishedScaling s;
  s.name = "Megatron-LM weak scaling, Selene (DGX A100)";
  s.machine = "dgx-a100";
  ScalingSpec& sp = s.spec;
  sp.kind = ScalingKind::Weak;
  const std::string assume =
      "the paper's model, t, p, GPUs and batch per row; attention materialized (Megatron-LM's "
      "kernels before FlashAttention); micro-batch 1 per replica, 1F1B, no ZeRO, bf16 rates for its "
      "mixed precision assumed";
  for (const Row& r : table) {
    ModelConfig mc = planner_model("gpt-5b");
    mc.n_layer = r.L;
    mc.n_embd = r.H;
    mc.n_head = mc.n_kv_head = r.heads;
    mc.ffn = 4 * r.H;
    mc.validate();
    sp.ranks.push_back(r.gpus);
    sp.model_names.push_back(std::string("gpt-") + r.name);
    sp.models.push_back(mc);
    sp.global_batches.push_back(r.batch);
    sp.grids.push_back(GridShape::xyzpd(1, r.t, 1, r.p, r.gpus / (r.t * r.p)));
    // Within the design's tolerance or not is the model's to say (docs/planner.md, "The attention
    // kernel": every row within since the scores' passes are priced).
    s.rows.push_back({"Megatron-LM (Narayanan et al.)", std::string(r.name) + ", t" + std::to_string(r.t) +
                      " p" + std::to_string(r.p), "PFLOP/s (hardware FLOPs)", assume, r.gpus, r.pflops, 0, "", ""});
  }
  // Per-GPU hardware FLOP/s from 1.7B on 32 GPUs to 1T on 3072: 163 / 137 TFLOP/s (super-linear).
  s.rows.push_back({"Megatron-LM (Narayanan et al.)", "1.7B -> 1T weak", "scaling efficiency (per-GPU hardware FLOP/s)",
                    assume, 3072, 163.0 / 137.0, 0, "", ""});
  PlanInput& in = sp.base;
  in.model = sp.models[0];
  in.model_name = sp.model_names[0];
  in.seq = 2048;
  in.global_batch = sp.global_batches[0];
  in.micro_batch_per_replica = 1;
  in.precision = Precision::BF16;
  in.recompute = Recompute::Full;
  in.memory_model = MemoryModel::Reference;  // another framework's run (planner.hpp)
  in.overlap = Overlap::None;
  // SC21's mixed precision is fp16 (Megatron-LM's bf16 came later), whose gradients it
  // all-reduced in fp16 (accumulate_allreduce_grads_in_fp32 off by default; forced only for bf16).
  in.dp_grad_comm_bytes = 2;
  in.attention_kernel = AttentionKernel::Materialized;
  in.allow_context = false;
  return s;
}

}  // namespace

std::vector<PublishedScaling> published_scaling(double batch_scale) {
  std::vector<PublishedScaling> out;
  auto scaled = [&](int64_t b) { return std::max<int64_t>(1, int64_t(std::llround(double(b) * batch_scale))); };
  {
    // AxoNN (Singh et al.) on Perlmutter: 5B on 512 GPUs growing to 40B on 4096, the model shapes
    // of its scripts; bf16, flash attention, full recomputation, the three tensor-parallel
    // overlaps (OAR, ORS, OAG = overlap tensor), no pipeline. The micro-batch is its Gordon Bell
    // launch script's (axonn-ai/Megatron-AxoNN examples/run_axonn_perlmutter.sh:
    // MICRO_BATCH_SIZE=16 per data-parallel group, which Megatron-AxoNN divides over the depth
    // axis Z), the global batch a script argument not stated: assumed 2048 sequences x 2048
    // tokens (4.2M tokens) at every point.
    PublishedScaling s;
    s.name = "AxoNN weak scaling, Perlmutter";
    s.machine = "perlmutter";
    ScalingSpec& sp = s.spec;
    sp.kind = ScalingKind::Weak;
    sp.ranks = {512, 1024, 2048, 4096};
    sp.model_names = {"gpt-5b", "gpt-10b", "gpt-20b", "gpt-40b"};
    for (const auto& n : sp.model_names) sp.models.push_back(planner_model(n));
    PlanInput& in = sp.base;
    in.model = sp.models[0];
    in.model_name = sp.model_names[0];
    in.seq = 2048;
    in.global_batch = scaled(2048);
    in.micro_batch_per_data_group = 16;
    in.precision = Precision::BF16;
    in.recompute = Recompute::Full;
    in.memory_model = MemoryModel::Reference;  // another framework's run (planner.hpp)
    in.overlap = Overlap::Tensor;
    // Megatron-AxoNN's bf16 accumulates and all-reduces the gradients over the data axis in fp32
    // (Megatron-LM's arguments.py forces accumulate_allreduce_grads_in_fp32 for bf16; AxoNN's
    // own communication model, examples/comm_model.py, prices that all-reduce at 4 bytes); the
    // Z reduce-scatter of a layer's weight gradient moves the bf16 GEMM output (axonn
    // intra_layer/fully_connected.py).
    in.dp_grad_comm_bytes = 4;
    in.z_grad_comm_bytes = 2;
    in.allow_pipeline = false;
    in.allow_context = false;  // AxoNN has no context axis
    const std::string assume = "V = 51200 and global batch " + std::to_string(in.global_batch) +
                               " x 2048 tokens assumed, micro-batch 16 per data group over Z (its launch "
                               "script); grid: the planner's first choice among Gp = 1 grids";
    const std::string miss = "known miss: docs/planner.md, \"The AxoNN curve, fifth pass\"";
    s.rows.push_back({"AxoNN (Singh et al.)", "5B, 24 x 4096 x 32", "PFLOP/s (hardware FLOPs)", assume, 512, 80.8, 0, "", ""});
    s.rows.push_back({"AxoNN (Singh et al.)", "40B, 38 x 9216 x 72", "PFLOP/s (hardware FLOPs)", assume, 4096, 620.1, 0, "", miss});
    // AxoNN's efficiency is per-GPU hardware FLOP/s at 4096 over that at 512 (620.1 / 8 / 80.8).
    s.rows.push_back({"AxoNN (Singh et al.)", "5B -> 40B weak", "scaling efficiency (per-GPU hardware FLOP/s)",
                      assume, 4096, 0.959, 0, "", miss});
    out.push_back(s);
  }
  // ORNL on Frontier (Dash et al., ISC 2024): Megatron-DeepSpeed with tensor, pipeline and
  // ZeRO-1 data parallelism; bf16 assumed with full recomputation and no overlap, micro-batch 1
  // per replica, V = 51200. Neither the grid nor the batch is in the abstract: the planner picks
  // the grid at each point; the batch is 2 sequences per GCD at the largest point.
  auto ornl = [&](const std::string& nm, const ModelConfig& mc, const std::string& mname,
                  ScalingKind kind, std::vector<int> ranks, int64_t batch0, double reported,
                  const std::string& series) {
    PublishedScaling s;
    s.name = nm;
    s.machine = "frontier";
    ScalingSpec& sp = s.spec;
    sp.kind = kind;
    sp.ranks = std::move(ranks);
    PlanInput& in = sp.base;
    in.model = mc;
    in.model_name = mname;
    in.seq = 2048;
    in.global_batch = scaled(batch0);
    in.micro_batch_per_replica = 1;
    in.precision = Precision::BF16;
    in.recompute = Recompute::Full;
    in.memory_model = MemoryModel::Reference;  // another framework's run (planner.hpp)
    in.zero = 1;
    in.overlap = Overlap::None;
    // DeepSpeed's ZeRO reduces in the gradients' dtype unless communication_data_type says
    // otherwise (its default): bf16.
    in.dp_grad_comm_bytes = 2;
    in.allow_context = false;  // Megatron-DeepSpeed's runs split no sequence
    const std::string assume =
        std::string(kind == ScalingKind::Weak ? "weak: global batch " + std::to_string(in.global_batch) +
                                                    " sequences at the first point, in proportion to the ranks"
                                              : "strong: global batch " + std::to_string(in.global_batch) +
                                                    " sequences at every point") +
        "; first point " + std::to_string(sp.ranks.front()) +
        " GCDs assumed; bf16, full recomputation, ZeRO-1, micro-batch 1 per replica, V = 51200 assumed";
    s.rows.push_back({"ORNL (Dash et al.)", series, "scaling efficiency", assume, sp.ranks.back(), reported, 0, "", ""});
    out.push_back(s);
  };
  const ModelConfig m175 = planner_model("gpt-175b");
  const ModelConfig m1t = planner_model("gpt-1t");
  ornl("ORNL 175B weak scaling, Frontier", m175, "gpt-175b", ScalingKind::Weak, {128, 256, 512, 1024}, 256, 1.00, "175B weak");
  ornl("ORNL 175B strong scaling, Frontier", m175, "gpt-175b", ScalingKind::Strong, {256, 512, 1024}, 2048, 0.89, "175B strong");
  ornl("ORNL 1T weak scaling, Frontier", m1t, "gpt-1t", ScalingKind::Weak, {768, 1536, 3072}, 1536, 1.00, "1T weak");
  ornl("ORNL 1T strong scaling, Frontier", m1t, "gpt-1t", ScalingKind::Strong, {1024, 2048, 3072}, 6144, 0.87, "1T strong");
  if (batch_scale == 1) out.push_back(megatron_weak_scaling());  // published batches: no sensitivity
  for (auto& s : out) {
    const Machine m = load_machine(s.machine);
    s.points = scaling_curve(s.spec, m);
    for (auto& r : s.rows) {
      const ScalingPoint* p = at(s.points, r.ranks);
      if (!p || !p->valid) fail("published scaling ", s.name, ": no valid grid at ", r.ranks, " ranks");
      r.grid = grid_label(p->estimate.grid);
      if (r.metric.starts_with("PFLOP/s")) r.predicted = p->hardware_flops_per_s / 1e15;
      else if (r.metric.ends_with("(per-GPU hardware FLOP/s)"))
        r.predicted = p->hardware_flops_per_gpu / s.points.front().hardware_flops_per_gpu;
      else r.predicted = p->efficiency;
    }
  }
  return out;
}

std::string published_scaling_text(const std::vector<PublishedScaling>& series) {
  std::ostringstream o;
  o << "| system | series | ranks | metric | reported | predicted | error | grid (x,y,z,p,d) | "
       "design tolerance (15% / 10 pts) |\n"
    << "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const auto& s : series)
    for (const auto& r : s.rows) {
      const bool eff = r.is_efficiency();
      o << "| " << r.system << " | " << r.series << " | " << r.ranks << " | " << r.metric << " | "
        << std::fixed << std::setprecision(1) << (eff ? 100 * r.reported : r.reported) << (eff ? "%" : "")
        << " | " << (eff ? 100 * r.predicted : r.predicted) << (eff ? "%" : "") << " | "
        << std::showpos << (eff ? 100 * (r.predicted - r.reported) : 100 * r.error())
        << (eff ? " pts" : "%") << std::noshowpos << " | " << r.grid << " | "
        << (r.within_design_tolerance() ? "within" : r.known_miss.empty() ? "OUTSIDE" : "outside (" + r.known_miss + ")")
        << " |\n";
      o.unsetf(std::ios::fixed);
    }
  for (const auto& s : series) {
    o << "\n" << s.name << " (" << (s.rows.empty() ? "" : s.rows[0].assumptions) << "):\n";
    o << scaling_text(s.spec, load_machine(s.machine), s.points);
  }
  return o.str();
}

std::string published_scaling_sensitivity_text() {
  std::ostringstream o;
  o << "| batch x | AxoNN 512 PFLOP/s (error) | AxoNN 4096 PFLOP/s (error) | AxoNN weak eff. 512->4096 "
       "(published 95.9%) | ORNL 175B weak | 175B strong | 1T weak | 1T strong |\n"
    << "| --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (double f : {0.5, 1.0, 2.0, 4.0}) {
    const auto series = published_scaling(f);
    auto cell = [&](const PublishedScalingRow& r) {
      std::ostringstream c;
      c << std::fixed << std::setprecision(1);
      if (r.is_efficiency()) c << 100 * r.predicted << "%";
      else c << r.predicted << " (" << std::showpos << 100 * r.error() << "%" << std::noshowpos << ")";
      return c.str();
    };
    const auto& ax = series[0];
    const ScalingPoint& a0 = ax.points.front();
    const ScalingPoint& a1 = ax.points.back();
    // AxoNN's own efficiency is per-GPU hardware FLOP/s; the planner's the same basis here.
    const double eff = a0.valid && a1.valid ? (a1.hardware_flops_per_gpu / a0.hardware_flops_per_gpu) : 0;
    o << "| " << f << " | " << cell(ax.rows[0]) << " | " << cell(ax.rows[1]) << " | " << std::fixed
      << std::setprecision(1) << 100 * eff << "%";
    o.unsetf(std::ios::fixed);
    for (size_t k = 1; k < series.size() && k <= 4; ++k) o << " | " << cell(series[k].rows[0]);  // ORNL
    o << " |\n";
  }
  return o.str();
}

}  // namespace tetrad::planner
