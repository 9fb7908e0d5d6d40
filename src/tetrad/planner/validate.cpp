#include "tetrad/planner/validate.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tetrad/core/error.hpp"
#include "tetrad/planner/report.hpp"

namespace tetrad::planner {

ModelConfig planner_model(const std::string& name) {
  auto gpt = [](int L, int H, int heads, int V, int S) {
    ModelConfig c;
    c.family = Family::GPT2;
    c.n_layer = L;
    c.n_embd = H;
    c.n_head = heads;
    c.n_kv_head = heads;
    c.ffn = 4 * H;
    c.vocab_size = V;
    c.max_seq = S;
    c.tie_embeddings = true;
    return c;
  };
  if (name == "gpt-1t") return gpt(128, 25600, 160, 51200, 2048);
  if (name == "gpt-80b") return gpt(42, 12288, 96, 51200, 2048);
  // AxoNN's weak-scaling series (the shapes of its scripts; V = 51200 assumed) and the 175B
  // GPT-3 shape of the ORNL Frontier runs: docs/planner.md, "Scaling curves".
  if (name == "gpt-5b") return gpt(24, 4096, 32, 51200, 2048);
  if (name == "gpt-10b") return gpt(32, 5120, 40, 51200, 2048);
  if (name == "gpt-20b") return gpt(32, 7168, 56, 51200, 2048);
  if (name == "gpt-40b") return gpt(38, 9216, 72, 51200, 2048);
  if (name == "gpt-60b") return gpt(56, 9216, 72, 51200, 2048);
  if (name == "gpt-160b") return gpt(84, 12288, 96, 51200, 2048);
  if (name == "gpt-320b") return gpt(96, 16384, 128, 51200, 2048);
  if (name == "gpt-175b") return gpt(96, 12288, 96, 51200, 2048);
  // Llama 3.1 as Meta published it (the model cards' config.json; "The Llama 3 Herd of Models",
  // 2024, table 3): heads of 128, 8 KV heads, SwiGLU, vocabulary 128256, untied head, RoPE theta
  // 500000 with Llama 3.1's scaling, 128K context.
  auto llama31 = [&](int L, int H, int heads, int ffn) {
    ModelConfig c = gpt(L, H, heads, 128256, 131072);
    c.family = Family::Llama;
    c.n_kv_head = 8;
    c.ffn = ffn;
    c.tie_embeddings = false;
    c.rope_theta = 500000.0f;
    c.rope_type = "llama3";
    return c;
  };
  if (name == "llama-405b") return llama31(126, 16384, 128, 53248);
  // TorchTitan's long-context rows (docs/planner.md) run the 8B at up to 256K (max_seq raised).
  if (name == "llama-8b") return llama31(32, 4096, 32, 14336);
  // Mixtral 8x7B as Mistral AI published it (the model card's config.json; Jiang et al.,
  // "Mixtral of Experts", 2024): Mistral 7B's attention (32 heads of 128, 8 KV heads), 8 SwiGLU
  // experts of width 14336, top 2 renormalised, vocabulary 32000, untied, RoPE theta 1e6, 32K
  // context: 46.7B parameters, 12.9B active per token.
  if (name == "mixtral-8x7b") {
    ModelConfig c = gpt(32, 4096, 32, 32000, 32768);
    c.family = Family::Mixtral;
    c.n_kv_head = 8;
    c.ffn = 14336;
    c.n_experts = 8;
    c.experts_per_token = 2;
    c.tie_embeddings = false;
    c.rope_theta = 1000000.0f;
    return c;
  }
  try {
    return named_model(name);
  } catch (const Error& e) {
    fail(e.what(), ", gpt-1t, gpt-80b (published rows), gpt-5b, gpt-10b, gpt-20b, gpt-40b, "
         "gpt-60b, gpt-160b, gpt-320b, gpt-175b (scaling series), llama-8b (Llama 3.1 8B), "
         "llama-405b (Llama 3.1 405B), mixtral-8x7b (Mixtral 8x7B)");
  }
}

namespace {
std::vector<PublishedResult> published_results_impl(double gemm_efficiency, int64_t batch_80b,
                                                    bool contention);
}  // namespace

SweepConfig local_sweep_config(int ranks) {
  if (ranks < 1) fail("sweep: ranks must be >= 1 (got ", ranks, ")");
  SweepConfig sc;
  sc.micro_batches = ranks;  // Gp = ranks has a bubble of (ranks - 1) / ranks: visible
  return sc;
}

PlanInput sweep_plan_input(const SweepConfig& sc, int ranks) {
  PlanInput in;
  in.model = planner_model(sc.model);
  in.model.n_layer = sc.layers;
  in.model_name = sc.model;
  in.seq = sc.seq;
  in.micro_batch = sc.micro_batch;
  in.global_batch = int64_t(sc.micro_batch) * sc.micro_batches;
  in.schedule = parse_pipeline_schedule(sc.schedule);
  in.ranks = ranks;
  // The sweep's grids are the validation's list (docs/planner.md, 5 on 2 ranks and 15 on 4);
  // context grids are not in it yet (at 256 tokens a sequence they only add the K|V exchange).
  in.allow_context = false;
  return in;
}

std::vector<GridShape> local_sweep_grids(int ranks) {
  const SweepConfig sc = local_sweep_config(ranks);
  const PlanInput in = sweep_plan_input(sc, ranks);
  std::vector<GridShape> out;
  for (const GridShape& g : all_grids(ranks))
    if ((g.c() == 1 || in.allow_context) && divisibility_problem(in, g).empty()) out.push_back(g);
  return out;
}

std::string local_sweep_bench_args(int ranks) {
  const SweepConfig sc = local_sweep_config(ranks);
  std::ostringstream o;
  for (const GridShape& g : local_sweep_grids(ranks))
    o << "--configs " << sc.model << " --grid " << trainer_grid_string(g) << " --layers " << sc.layers
      << " --seq " << sc.seq << " --micro-batches " << sc.micro_batches << " --accumulate --schedule "
      << sc.schedule << "\n";
  return o.str();
}

BenchComparison compare_with_bench(const std::string& path, const Machine& m) {
  std::ifstream f(path);
  if (!f) fail("cannot read bench results '", path, "' (tetrad bench --grids --json FILE)");
  BenchComparison c;
  std::string line;
  int lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      fail("'", path, "' line ", lineno, ": not JSON: ", e.what());
    }
    if (!j.contains("grid") || !j.contains("median_step_s")) continue;
    // The planner predicts the blocking schedule (overlap none); rows timed with the trainer's
    // overlap on would be a second, differently-run measurement of the same grid.
    if (j.value("overlap", std::string("off")) != "off") continue;
    MeasuredGrid r;
    r.config = j.at("config").get<std::string>();
    r.ranks = j.at("ranks").get<int>();
    int v[5];
    const std::string g = j.at("grid").get<std::string>();
    // "XxYxZxD" from the trainer's 4D grid, "XxYxZxPxD" once it has the pipeline axis.
    const int n = std::sscanf(g.c_str(), "%dx%dx%dx%dx%d", &v[0], &v[1], &v[2], &v[3], &v[4]);
    if (n == 4) r.grid = GridShape{v[0], v[1], v[2], v[3]};
    else if (n == 5) r.grid = GridShape::xyzpd(v[0], v[1], v[2], v[3], v[4]);
    else fail("'", path, "' line ", lineno, ": grid '", g, "' is not XxYxZxD or XxYxZxPxD");
    r.measured_s = j.at("median_step_s").get<double>();
    PlanInput in;
    in.model = planner_model(r.config);
    in.model_name = r.config;
    in.seq = j.value("seq", in.model.max_seq);
    // bench --grids: `global_batch` sequences per micro-batch; with a pipeline axis the step runs
    // `micro_batches` of them through the schedule. The run's layers, recomputation, ZeRO and
    // schedule are predicted as the bench ran them (older files lack the keys: the defaults).
    in.micro_batch = j.value("global_batch", 4);
    in.global_batch = in.micro_batch * std::max(1, j.value("micro_batches", 1));
    if (j.contains("layers")) in.model.n_layer = j.at("layers").get<int>();
    in.recompute = parse_recompute(j.value("recompute", std::string("none")));
    in.zero = j.value("zero", 0);
    in.schedule = parse_pipeline_schedule(j.value("schedule", std::string("1f1b")));
    in.virtual_stages = j.value("virtual_stages", 1);
    in.pipeline_layers = j.value("pipeline_layers", std::string("even"));
    in.ranks = r.ranks;
    {
      std::ostringstream set;
      if (r.grid.p() > 1)
        set << name(in.schedule) << (in.virtual_stages > 1 ? " x" + std::to_string(in.virtual_stages) : "")
            << ", m " << in.global_batch / in.micro_batch
            << (in.pipeline_layers != "even" ? ", layers " + in.pipeline_layers : "");
      if (in.recompute != Recompute::None) set << (set.tellp() > 0 ? ", " : "") << "recompute " << name(in.recompute);
      if (in.zero > 0) set << (set.tellp() > 0 ? ", " : "") << "ZeRO " << in.zero;
      r.setting = set.str();
    }
    Machine mm = m;
    mm.ranks_per_node = std::max(mm.ranks_per_node, r.ranks);  // one node: every rank is here
    const Estimate e = estimate(in, r.grid, mm);
    if (!e.valid) fail("'", path, "' line ", lineno, ": the planner rejects measured grid ", g, ": ", e.reject);
    r.predicted_s = e.step;
    r.dominant = e.dominant;
    // The same grid measured again (a repeated sweep): keep the faster run, the one less
    // disturbed by whatever else shared the machine.
    bool seen = false;
    for (auto& q : c.rows)
      if (q.config == r.config && q.grid == r.grid && q.ranks == r.ranks &&
          q.predicted_s == r.predicted_s) {  // same settings predict the same time
        q.measured_s = std::min(q.measured_s, r.measured_s);
        seen = true;
      }
    if (!seen) c.rows.push_back(r);
  }
  if (c.rows.empty()) fail("'", path, "' has no measured grids");
  std::vector<double> a, b;
  for (const auto& r : c.rows) a.push_back(r.measured_s), b.push_back(r.predicted_s);
  c.spearman = spearman(a, b);
  const auto best = std::min_element(a.begin(), a.end());
  const auto pick = std::min_element(b.begin(), b.end()) - b.begin();
  c.top_choice_vs_best = a[size_t(pick)] / *best - 1;
  return c;
}

std::string comparison_text(const BenchComparison& c, const std::string& title) {
  std::vector<size_t> by_measured(c.rows.size()), by_predicted(c.rows.size());
  for (size_t i = 0; i < c.rows.size(); ++i) by_measured[i] = by_predicted[i] = i;
  std::sort(by_measured.begin(), by_measured.end(),
            [&](size_t i, size_t j) { return c.rows[i].measured_s < c.rows[j].measured_s; });
  std::sort(by_predicted.begin(), by_predicted.end(),
            [&](size_t i, size_t j) { return c.rows[i].predicted_s < c.rows[j].predicted_s; });
  std::vector<int> rm(c.rows.size()), rp(c.rows.size());
  for (size_t k = 0; k < c.rows.size(); ++k) rm[by_measured[k]] = int(k) + 1, rp[by_predicted[k]] = int(k) + 1;
  std::ostringstream o;
  o << title << "\n"
    << "| grid (x,y,z,p,d) | measured s/step | predicted s/step | error | measured rank | predicted rank | predicted dominant |\n"
    << "| --- | --- | --- | --- | --- | --- | --- |\n";
  o << std::fixed;
  for (size_t k = 0; k < c.rows.size(); ++k) {
    const auto& r = c.rows[by_measured[k]];
    o << "| " << grid_label(r.grid) << (r.setting.empty() ? "" : " (" + r.setting + ")") << " | "
      << std::setprecision(3) << r.measured_s << " | "
      << r.predicted_s << " | " << std::showpos << std::setprecision(1)
      << 100 * (r.predicted_s / r.measured_s - 1) << "%" << std::noshowpos << " | "
      << rm[by_measured[k]] << " | " << rp[by_measured[k]] << " | " << r.dominant << " |\n";
  }
  o << std::setprecision(3) << "Spearman rank correlation (predicted vs measured): " << c.spearman
    << "; the predicted-fastest grid measured " << std::setprecision(1)
    << 100 * c.top_choice_vs_best << "% slower than the measured best\n";
  return o.str();
}

std::vector<PublishedResult> published_results(double gemm_efficiency, int64_t batch_80b,
                                               bool contention) {
  if (contention) {
    // Both ways: the rows with the machine files as shipped, and with contention switched off.
    std::vector<PublishedResult> with = published_results(gemm_efficiency, batch_80b, false);
    std::vector<PublishedResult> out = published_results_impl(gemm_efficiency, batch_80b, true);
    for (size_t i = 0; i < out.size(); ++i) out[i].predicted_without_contention = with[i].predicted;
    return out;
  }
  std::vector<PublishedResult> out = published_results_impl(gemm_efficiency, batch_80b, false);
  for (auto& r : out) r.predicted_without_contention = r.predicted;
  return out;
}

namespace {
std::vector<PublishedResult> published_results_impl(double gemm_efficiency, int64_t batch_80b,
                                                    bool contention) {
  std::vector<PublishedResult> out;
  {
    // Narayanan et al., SC21, Table 1, last row: 1T on 3072 A100-80GB (Selene: DGX A100 nodes).
    PlanInput in;
    in.model_name = "gpt-1t";
    in.model = planner_model("gpt-1t");
    in.seq = 2048;
    in.global_batch = 3072;
    in.micro_batch_per_replica = 1;
    in.precision = Precision::BF16;
    in.recompute = Recompute::Full;
    in.zero = 0;
    in.memory_model = MemoryModel::Reference;  // another framework's run (planner.hpp)
    in.overlap = Overlap::None;
    in.dp_grad_comm_bytes = 2;  // fp16 gradients all-reduced in fp16 (scaling.cpp, Megatron-LM's rows)
    // SC21's Megatron-LM ran attention with its scores in memory (FlashAttention came in 2022).
    in.attention_kernel = AttentionKernel::Materialized;
    in.allow_context = false;
    in.ranks = 3072;
    Machine m = load_machine("dgx-a100");
    if (gemm_efficiency > 0) m.gemm_efficiency = gemm_efficiency;
    if (!contention) m.collective_units = 0, m.overlap_slowdown = 0;
    // Megatron's tensor parallelism (column- then row-parallel) is our Y axis with Gx = Gz = 1.
    const GridShape g = GridShape::xyzpd(1, 8, 1, 64, 6);
    PublishedResult r;
    r.system = "Megatron-LM (Narayanan et al., SC21)";
    r.model = "1T GPT (L=128, H=25600, 160 heads, S=2048, V=51200)";
    r.machine = m.name;
    r.configuration = "TP=8 (Gy=8), PP=64, DP=6; batch 3072, micro-batch 1; bf16, full "
                      "recomputation, no overlap, attention materialized";
    r.metric = "TFLOP/s per GPU (hardware FLOPs, recomputation counted)";
    r.reported = 163;
    r.estimate = estimate(in, g, m);
    if (!r.estimate.valid) fail("published row ", r.system, ": the planner rejects ", grid_label(g), ": ", r.estimate.reject);
    r.predicted = r.estimate.hardware_flops_full / r.estimate.step / in.ranks / 1e12;
    r.assumptions = "1F1B schedule (no interleaving); Megatron's reported 163 counts the "
                    "recomputed forward (96 B S L H^2 (1 + S/6H + V/16LH))";
    out.push_back(r);
  }
  {
    // Singh et al. 2023 (AxoNN): 80B GPT on 1024 A100-40GB of Perlmutter, 182 PFLOP/s in all.
    PlanInput in;
    in.model_name = "gpt-80b";
    in.model = planner_model("gpt-80b");
    in.seq = 2048;
    in.global_batch = 2048;
    in.micro_batch = 2048;  // one micro-batch per step (AxoNN has no pipeline)
    in.precision = Precision::BF16;
    in.recompute = Recompute::Full;
    in.zero = 0;
    in.memory_model = MemoryModel::Reference;  // another framework's run (planner.hpp)
    in.overlap = Overlap::Tensor;
    in.dp_grad_comm_bytes = 4;  // Megatron-AxoNN: fp32 data-parallel all-reduce under bf16 (scaling.cpp)
    in.z_grad_comm_bytes = 2;
    in.ranks = 1024;
    in.allow_pipeline = false;  // AxoNN's 4D grid has no pipeline axis
    in.allow_context = false;   // nor a context axis
    Machine m = load_machine("perlmutter");
    if (gemm_efficiency > 0) m.gemm_efficiency = gemm_efficiency;
    if (!contention) m.collective_units = 0, m.overlap_slowdown = 0;
    // Larger batches accumulate micro-batches of 2048 sequences (2 per rank).
    if (batch_80b > 0) in.global_batch = batch_80b, in.micro_batch = std::min<int64_t>(batch_80b, 2048);
    const auto p = plan(in, m);
    PublishedResult r;
    r.system = "AxoNN (Singh et al., 2023)";
    r.model = "80B GPT (L=42, H=12288, 96 heads, S=2048, V=51200)";
    r.machine = m.name;
    if (p.empty() || !p.front().valid) fail("published row ", r.system, ": no valid grid");
    r.estimate = p.front();
    r.configuration = "the planner's first choice " + grid_label(r.estimate.grid) +
                      " (x,y,z,p,d) among 4D grids (Gp = 1); batch " + std::to_string(in.global_batch) +
                      " x 2048 tokens; bf16, "
                      "full recomputation, overlap of tensor-parallel collectives";
    r.metric = "PFLOP/s in total (hardware FLOPs, recomputation counted)";
    r.reported = 182;
    r.predicted = r.estimate.hardware_flops_full / r.estimate.step / 1e15;
    r.assumptions = "vocabulary 51200, global batch 2048 sequences (4.2M tokens) and full "
                    "recomputation are assumptions, not reported in the row";
    out.push_back(r);
  }
  return out;
}
}  // namespace

std::string published_text(const std::vector<PublishedResult>& rows) {
  std::ostringstream o;
  o << "| system | model | machine file | configuration | metric | reported | predicted | error | "
       "predicted without overlap contention | error |\n"
    << "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const auto& r : rows) {
    o << "| " << r.system << " | " << r.model << " | " << r.machine << " | " << r.configuration
      << " | " << r.metric << " | " << std::fixed << std::setprecision(0) << r.reported << " | "
      << r.predicted << " | " << std::showpos << std::setprecision(1) << 100 * r.error() << "%"
      << std::noshowpos << " | " << std::setprecision(0) << r.predicted_without_contention << " | "
      << std::showpos << std::setprecision(1) << 100 * r.error_without_contention() << "%"
      << std::noshowpos << " |\n";
  }
  for (const auto& r : rows) {
    const Estimate& e = r.estimate;
    o << "\n" << r.system << ": step " << std::setprecision(2) << e.step << " s = compute "
      << std::setprecision(1) << 100 * e.compute / e.step << "% + exposed communication "
      << 100 * e.comm_exposed / e.step << "% + bubble " << 100 * e.bubble / e.step
      << "% + optimizer " << 100 * e.optimizer / e.step << "% + overlap contention "
      << 100 * e.contention / e.step << "%; HFU " << 100 * e.hfu << "%, MFU "
      << 100 * e.mfu << "%; memory/rank " << e.memory.total() / 1e9 << " GB; assumptions: "
      << r.assumptions << "\n";
  }
  return o.str();
}

std::string published_sensitivity_text() {
  std::ostringstream o;
  o << "| gemm_efficiency (all GPU files) | AxoNN batch (sequences) | Megatron 1T error | AxoNN 80B error | AxoNN grid |\n"
    << "| --- | --- | --- | --- | --- |\n";
  for (double eff : {0.6, 0.65, 0.7, 0.8})
    for (int64_t b : {int64_t(1024), int64_t(2048), int64_t(8192)}) {
      if (b != 2048 && eff != 0.7) continue;
      const auto rows = published_results(eff, b);
      o << "| " << std::setprecision(2) << eff << " | " << b << " | " << std::showpos << std::fixed << std::setprecision(1)
        << 100 * rows[0].error() << "% | " << 100 * rows[1].error() << "%" << std::noshowpos
        << " | " << grid_label(rows[1].estimate.grid) << " |\n";
      o.unsetf(std::ios::fixed);
    }
  return o.str();
}

// The planner's own input, checked before any grid is priced.
void PlanInput::validate() const {
  model.validate();
  if (global_batch < 1) fail("plan: global batch must be >= 1 sequence (got ", global_batch, ")");
  if (seq < 1) fail("plan: sequence length must be >= 1 (got ", seq, ")");
  if (micro_batch < 0 || micro_batch_per_replica < 0 || micro_batch_per_data_group < 0)
    fail("plan: micro-batches must be >= 0 (got ", micro_batch, ", ", micro_batch_per_replica, " and ",
         micro_batch_per_data_group, ")");
  const int given = (micro_batch > 0) + (micro_batch_per_replica > 0) + (micro_batch_per_data_group > 0);
  if (search_micro_batch && given > 0)
    fail("plan: a micro-batch is given (",
         std::max({micro_batch, micro_batch_per_replica, micro_batch_per_data_group}),
         "), so it is not searched: give a micro-batch or let the planner choose it, not both");
  if (!search_micro_batch && given != 1)
    fail("plan: give exactly one of the micro-batch of the whole job (--micro-batch), per "
         "(z, d) replica (--micro-batch-per-replica) or per data group (--micro-batch-per-data-group), "
         "or none to let the planner choose it");
  if (zero < 0 || zero > 2) fail("plan: ZeRO stage must be 0, 1 or 2 (got ", zero, ")");
  if (ranks < 1) fail("plan: ranks must be >= 1 (got ", ranks, ")");
  for (int b : {z_grad_comm_bytes, dp_grad_comm_bytes, tensor_comm_bytes})
    if (b != 0 && b != 2 && b != 4)
      fail("plan: a gradient or activation collective moves 2 (bf16) or 4 (fp32) bytes an element, "
           "or 0 for the run's precision (got ", b, ")");
  if (virtual_stages < 1) fail("plan: virtual stages must be >= 1 (got ", virtual_stages, ")");
  if (attention_kernel == AttentionKernel::Materialized && allow_context)
    fail("plan: the materialized attention kernel has no context-parallel form (its [S, S] scores "
         "are a sequence's own): plan it without the context axis (--no-context)");
  if (schedule == Schedule::OneFOneB && virtual_stages != 1)
    fail("plan: ", virtual_stages, " virtual stages need the interleaved schedule (1F1B has one "
         "chunk per stage)");
}

}  // namespace tetrad::planner
