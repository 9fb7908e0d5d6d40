#include "tetrad/planner/report.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tetrad/core/error.hpp"
#include "tetrad/model/params.hpp"

namespace tetrad::planner {

nlohmann::json Estimate::to_json() const {
  nlohmann::json j = {{"grid", {{"x", grid.x()}, {"y", grid.y()}, {"c", grid.c()}, {"z", grid.z()}, {"p", grid.p()}, {"d", grid.d()}}},
                      {"grid_string", plan_label(*this)},
                      {"trainer_grid", trainer_grid_string(grid)},  // tetrad train --grid's argument
                      {"expert_parallel", expert_parallel},
                      {"valid", valid},
                      {"trainable", trainable}};
  if (!valid) {
    j["reject"] = reject;
    return j;
  }
  nlohmann::json colls = nlohmann::json::array();
  for (const auto& c : collectives)
    colls.push_back({{"what", c.what}, {"axis", c.group_name()}, {"op", op_name(c.op)},
                     {"bytes_per_call", c.bytes}, {"calls_per_step", c.calls},
                     {"seconds_per_step", c.seconds}, {"exposed_seconds_per_step", c.exposed},
                     {"inter_node", c.inter_node}, {"groups", c.groups},
                     {"topology_limited", c.topology_limited}});
  j.update({{"micro_batch", micro_batch},
            {"micro_batch_per_replica", micro_batch / parallel::token_slots(grid)},
            {"micro_batches", micro_batches},
            {"tokens_per_rank_per_micro_batch", tokens_per_rank},
            {"cp_comm", grid.c() > 1 ? name(cp_comm) : "none"},
            {"step_s", step},
            {"compute_s", compute},
            {"compute_gemm_s", compute_gemm},
            {"compute_attention_s", compute_attention},
            {"contention_s", contention},
            {"comm_total_s", comm_total},
            {"comm_exposed_s", comm_exposed},
            {"bubble_s", bubble},
            {"optimizer_s", optimizer},
            {"tokens_per_s", tokens_per_s},
            {"mfu", mfu},
            {"hfu", hfu},
            {"model_flops_per_step", model_flops},
            {"hardware_flops_per_step", hardware_flops},
            {"model_flops_per_step_full_attention", model_flops_full},
            {"hardware_flops_per_step_full_attention", hardware_flops_full},
            {"memory_bytes",
             {{"weights", memory.weights}, {"grads", memory.grads}, {"optimizer", memory.optimizer},
              {"gathered", memory.gathered}, {"staging", memory.staging},
              {"activations", memory.activations},
              {"total", memory.total()}}},
            {"dominant", dominant},
            {"collectives", colls}});
  return j;
}

namespace {
std::string human_time(double s) {
  std::ostringstream o;
  o << std::fixed;
  if (s >= 1) o << std::setprecision(2) << s << " s";
  else if (s >= 1e-3) o << std::setprecision(1) << s * 1e3 << " ms";
  else o << std::setprecision(0) << s * 1e6 << " us";
  return o.str();
}
std::string human_bytes(double b) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(b >= 10e9 ? 1 : 2);
  if (b >= 1e9) o << b / 1e9 << " GB";
  else o << b / 1e6 << " MB";
  return o.str();
}
}  // namespace

std::string micro_label(const Estimate& e) {
  if (e.micro_batch <= 0) return "-";
  return std::to_string(e.micro_batch / parallel::token_slots(e.grid)) + " x " + std::to_string(e.micro_batches);
}

std::string context_choice_text(const std::vector<Estimate>& plan) {
  const Estimate* first = nullptr;
  const Estimate *flat = nullptr, *closest = nullptr;  // the fastest C = 1 grid; the smallest rejected one
  for (const auto& e : plan) {
    if (e.valid && !first) first = &e;
    if (e.grid.c() != 1) continue;
    if (e.valid && !flat) flat = &e;
    if (!e.valid && e.memory.total() > 0 && (!closest || e.memory.total() < closest->memory.total()))
      closest = &e;
  }
  if (!first || first->grid.c() <= 1) return "";
  std::ostringstream o;
  o << std::fixed << std::setprecision(1);
  const double exposed = [&] {
    double x = 0;
    for (const auto& c : first->collectives)
      if (c.axis == AxisSet(Axis::C)) x += c.exposed;
    return x;
  }();
  o << "context: the first choice cuts each sequence over C = " << first->grid.c() << " ("
    << first->tokens_per_rank << " tokens per rank per micro-batch; keys and values by "
    << name(first->cp_comm) << ", exposed " << 100 * exposed / first->step << "% of the step): ";
  if (flat)
    o << "the fastest grid with C = 1, " << grid_label(flat->grid) << ", takes "
      << 100 * (flat->step / first->step - 1) << "% longer (" << human_time(flat->step) << ", "
      << human_bytes(flat->memory.total()) << " per rank)\n";
  else if (closest)
    o << "no grid with C = 1 fits: the closest, " << grid_label(closest->grid) << ", needs "
      << human_bytes(closest->memory.total()) << " per rank (activations "
      << human_bytes(closest->memory.activations) << ")\n";
  else
    o << "no grid with C = 1 is valid\n";
  return o.str();
}

std::string plan_text(const PlanInput& in, const Machine& m, const std::vector<Estimate>& plan,
                      int show_rejected, int top) {
  std::ostringstream o;
  const ModelConfig& mc = in.model;
  o << "model " << in.model_name << " (" << family_name(mc.family) << ", L=" << mc.n_layer
    << " H=" << mc.n_embd << " heads=" << mc.n_head << " ffn=" << mc.ffn << " V=" << mc.vocab_size
    << ", " << count_parameters(mc) / 1e6 << " M parameters)\n"
    << "run: global batch " << in.global_batch << " x " << in.seq << " tokens, micro-batch ";
  if (in.search_micro_batch) o << "chosen per grid (the fastest that fits; --micro-batch fixes it)";
  else if (in.micro_batch > 0) o << in.micro_batch << " (whole job)";
  else if (in.micro_batch_per_data_group > 0) o << in.micro_batch_per_data_group << " per data group, over Z";
  else o << in.micro_batch_per_replica << " per data replica";
  o << ", " << name(in.precision) << ", recompute " << name(in.recompute) << ", ZeRO " << in.zero
    << ", overlap " << name(in.overlap) << ", attention " << name(in.attention_kernel) << ", pipeline "
    << name(in.schedule)
    << (in.virtual_stages > 1 ? " x" + std::to_string(in.virtual_stages) : std::string()) << ", "
    << in.ranks << " ranks\n"
    << "machine " << m.name << ": " << m.ranks_per_node << " ranks/node, "
    << m.peak(in.precision == Precision::BF16) / 1e12 << " TFLOP/s " << name(in.precision)
    << " peak x " << m.gemm_efficiency << " GEMM efficiency"
    << (m.gemm_shapes.size() ? " (by shape: measured lattice)"
        : m.compute_units > 0 ? " (by shape: waves over " + std::to_string(m.compute_units) + " units, roofline)"
                              : " (by shape: roofline)")
    << ", " << m.memory_bytes / 1e9
    << " GB/rank" << (m.source.empty() ? "" : " (" + m.source + ")") << "\n"
    << "FLOPs: model FLOPs = tokens x (6 N_matmul + 6 L A S: causal attention counted as half"
    << (mc.moe() ? "; N_matmul ACTIVE: the " + std::to_string(mc.experts_per_token) + " of " +
                       std::to_string(mc.n_experts) + " experts a token is routed to and the router, "
                       "so MFU is on active FLOPs" : std::string())
    << ") = " << model_flops_per_step(mc, in.global_batch, in.seq) << " per step (MFU uses these); "
    << "hardware FLOPs with recompute " << name(in.recompute) << " = "
    << hardware_flops_per_step(mc, in.global_batch, in.seq, in.recompute) << " (HFU)\n\n";
  int nvalid = 0, nrej = 0;
  for (const auto& e : plan) (e.valid ? nvalid : nrej)++;
  o << nvalid << " valid grids (x y z p d" << (mc.moe() ? "; eN: the expert axis E = N folded over C x D" : "")
    << "), fastest first; " << nrej << " rejected\n";
  o << " rank  grid              micro x m        step        tokens/s       MFU    HFU    memory/rank  compute  comm(exp)  bubble   dominant\n";
  int rank = 0;
  for (const auto& e : plan) {
    if (!e.valid) continue;
    ++rank;
    if (top > 0 && rank > top) continue;
    std::ostringstream line;
    line << std::setw(5) << rank << "  " << std::left << std::setw(18) << plan_label(e)
         << std::setw(11) << micro_label(e) << std::right << std::setw(10) << human_time(e.step) << std::setw(14) << std::fixed
         << std::setprecision(e.tokens_per_s >= 100 ? 0 : 1) << e.tokens_per_s << std::setw(8)
         << std::setprecision(1) << 100 * e.mfu << "%" << std::setw(6) << 100 * e.hfu << "%"
         << std::setw(13) << human_bytes(e.memory.total()) << std::setw(8)
         << 100 * e.compute / e.step << "%" << std::setw(9) << 100 * e.comm_exposed / e.step << "%"
         << std::setw(8) << 100 * e.bubble / e.step << "%   " << e.dominant
         << (e.trainable                ? ""
             : e.grid.c() > 1         ? "  [context: not trainable yet]"
                                      : "  [pipeline: not trainable yet]");
    o << line.str() << "\n";
  }
  if (top > 0 && rank > top) o << "  ... " << rank - top << " more valid grids (--top 0 shows all)\n";
  o << context_choice_text(plan);
  if (nrej > 0) {
    o << "\nrejected:\n";
    int shown = 0;
    for (const auto& e : plan) {
      if (e.valid) continue;
      if (show_rejected >= 0 && shown++ >= show_rejected) {
        o << "  ... " << nrej - show_rejected << " more (--json lists every one)\n";
        break;
      }
      o << "  " << std::left << std::setw(11) << plan_label(e) << std::right << " " << e.reject
        << "\n";
    }
  }
  return o.str();
}

std::string why_text(const PlanInput& in, const Machine& m, const Estimate& e) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(1);
  o << "grid " << plan_label(e) << (e.grid.c() > 1 ? " (x,y,z,p,d, c)" : " (x,y,z,p,d)") << " for " << in.model_name << " on " << in.ranks
    << " ranks of machine " << m.name << ": " << (e.valid ? "valid" : "rejected: " + e.reject) << "\n";
  if (e.valid && e.trainable) o << "train it with: tetrad train --grid " << trainer_grid_string(e.grid) << "\n";
  const MemoryBreakdown& mb = e.memory;
  if (mb.total() > 0) {
    o << "memory per rank " << mb.total() / 1e9 << " GB of " << m.memory_bytes / 1e9 << " GB:";
    const std::pair<const char*, double> items[] = {{"weights", mb.weights}, {"grads", mb.grads},
        {"optimizer", mb.optimizer}, {"gathered", mb.gathered}, {"staging", mb.staging},
        {"activations", mb.activations}};
    for (const auto& [k, v] : items) o << " " << k << " " << v / 1e9;
    o << " GB\n";
  }
  if (e.micro_batch > 0)
    o << "micro-batch " << micro_label(e) << " (per replica x micro-batches), " << e.tokens_per_rank
      << " tokens per rank per micro-batch\n";
  if (e.grid.c() > 1)
    o << "context: each sequence in " << 2 * e.grid.c() << " chunks over C = " << e.grid.c()
      << " (rank r holds chunks r and " << 2 * e.grid.c() << " - 1 - r), " << in.seq / e.grid.c()
      << " tokens of it per rank; activations per rank 1/" << e.grid.c()
      << ", attention 1/" << e.grid.c() << " of each sequence's causal S^2 work; keys and values by "
      << (e.valid ? name(e.cp_comm) : name(in.cp_comm))
      << (in.cp_comm == CpComm::Auto ? " (the faster of ring and all-gather here; --cp-comm sets one)" : "")
      << "\n";
  if (!e.valid) return o.str();
  auto pct = [&](double v) { return 100 * v / e.step; };
  o << "step " << human_time(e.step) << " = compute " << pct(e.compute) << "% (GEMMs "
    << pct(e.compute_gemm) << "%, attention " << pct(e.compute_attention) << "%, the rest "
    << pct(e.compute - e.compute_gemm - e.compute_attention) << "%) + exposed communication "
    << pct(e.comm_exposed) << "% + bubble " << pct(e.bubble) << "% + contention "
    << pct(e.contention) << "% + optimizer " << pct(e.optimizer) << "%; MFU " << 100 * e.mfu
    << "%, HFU " << 100 * e.hfu << "%, dominant " << e.dominant << "\n";
  o << "collectives (per step: calls, seconds, exposed):\n";
  for (const auto& c : e.collectives)
    o << "  " << std::left << std::setw(44) << c.what << std::right << " " << std::setw(2)
      << c.group_name() << " " << std::setw(14) << op_name(c.op) << std::setw(12)
      << human_bytes(c.bytes) << " x " << std::setw(7) << c.calls << std::setw(11)
      << human_time(c.seconds) << std::setw(11) << human_time(c.exposed)
      << (c.inter_node ? "  across nodes" : "") << "\n";
  return o.str();
}

nlohmann::json plan_json(const PlanInput& in, const Machine& m, const std::vector<Estimate>& plan) {
  nlohmann::json grids = nlohmann::json::array();
  for (const auto& e : plan) grids.push_back(e.to_json());
  return {{"model", {{"name", in.model_name}, {"family", family_name(in.model.family)},
                     {"n_layer", in.model.n_layer}, {"n_embd", in.model.n_embd},
                     {"n_head", in.model.n_head}, {"ffn", in.model.ffn},
                     {"vocab_size", in.model.vocab_size}, {"parameters", count_parameters(in.model)}}},
          {"run", {{"global_batch", in.global_batch}, {"micro_batch", in.micro_batch},
                   {"micro_batch_per_replica", in.micro_batch_per_replica},
                   {"micro_batch_per_data_group", in.micro_batch_per_data_group},
                   {"micro_batch_searched", in.search_micro_batch}, {"seq", in.seq},
                   {"precision", name(in.precision)}, {"recompute", name(in.recompute)},
                   {"zero", in.zero}, {"overlap", name(in.overlap)}, {"attention_kernel", name(in.attention_kernel)},
                   {"schedule", name(in.schedule)},
                   {"virtual_stages", in.virtual_stages}, {"ranks", in.ranks}}},
          {"machine", {{"name", m.name}, {"source", m.source}, {"ranks_per_node", m.ranks_per_node}}},
          {"flops_formula", "model: tokens * (6*N_matmul + 6*L*A*S: causal attention half; N_matmul the active weights of a mixture of experts: its k routed experts and router); hardware adds recomputed forward"},
          {"grids", grids}};
}

double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  TETRAD_CHECK(a.size() == b.size());
  const size_t n = a.size();
  if (n < 2) return 0;
  auto ranks = [n](const std::vector<double>& v) {
    std::vector<size_t> idx(n);
    for (size_t i = 0; i < n; ++i) idx[i] = i;
    std::sort(idx.begin(), idx.end(), [&](size_t i, size_t j) { return v[i] < v[j]; });
    std::vector<double> r(n);
    for (size_t i = 0; i < n;) {
      size_t j = i;
      while (j + 1 < n && v[idx[j + 1]] == v[idx[i]]) ++j;
      for (size_t k = i; k <= j; ++k) r[idx[k]] = 0.5 * double(i + j) + 1;
      i = j + 1;
    }
    return r;
  };
  const auto ra = ranks(a), rb = ranks(b);
  double ma = 0, mb = 0;
  for (size_t i = 0; i < n; ++i) ma += ra[i], mb += rb[i];
  ma /= n;
  mb /= n;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < n; ++i) {
    sab += (ra[i] - ma) * (rb[i] - mb);
    saa += (ra[i] - ma) * (ra[i] - ma);
    sbb += (rb[i] - mb) * (rb[i] - mb);
  }
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0;
}

}  // namespace tetrad::planner
