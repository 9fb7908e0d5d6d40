#include "tetrad/planner/machine.hpp"

#include <mpi.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <sstream>
#include <oneapi/dnnl/dnnl.h>
#include <toml++/toml.h>

#include "tetrad/comm/communicator.hpp"
#include "tetrad/core/cpu.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/backend/backend.hpp"
#include "tetrad/backend/ceilings.hpp"

namespace fs = std::filesystem;

namespace tetrad::planner {

namespace {

constexpr double kT = 1e12, kG = 1e9, kUs = 1e-6;

double get_number(const toml::table& t, const std::string& key, const std::string& where,
                  bool required, double fallback = 0) {
  const toml::node_view<const toml::node> n = t.at_path(key);
  if (!n) {
    if (required) fail("machine file '", where, "': missing key '", key, "' (a number)");
    return fallback;
  }
  if (auto v = n.value<double>()) return *v;
  fail("machine file '", where, "': '", key, "' must be a number");
}

std::string fmt(double v) {
  std::ostringstream os;
  os << std::setprecision(6) << v;
  return os.str();
}

}  // namespace

const char* gemm_op_name(GemmOp op) {
  return op == GemmOp::NN ? "nn" : op == GemmOp::NT ? "nt" : "tn";
}
GemmOp parse_gemm_op(const std::string& s) {
  if (s == "nn") return GemmOp::NN;
  if (s == "nt") return GemmOp::NT;
  if (s == "tn") return GemmOp::TN;
  fail("GEMM variant '", s, "': expected nn, nt or tn");
}

void Machine::validate() const {
  auto positive = [&](const char* key, double v) {
    if (!(v > 0))
      fail("machine '", name, "': ", key, " must be > 0 (got ", v, ")");
  };
  if (ranks_per_node < 1) fail("machine '", name, "': ranks_per_node must be >= 1");
  positive("compute.peak_fp32_tflops", peak_fp32);
  if (peak_bf16 < 0) fail("machine '", name, "': compute.peak_bf16_tflops must be >= 0");
  if (!(attention_efficiency >= 0 && attention_efficiency <= 1))
    fail("machine '", name, "': compute.attention_efficiency must be in [0, 1] (got ",
         attention_efficiency, "; 0 = same as gemm_efficiency)");
  if (!(gemm_efficiency > 0 && gemm_efficiency <= 1))
    fail("machine '", name, "': compute.gemm_efficiency must be in (0, 1] (got ", gemm_efficiency,
         ")");
  positive("memory.per_rank_gb", memory_bytes);
  positive("memory.bandwidth_gb_per_s", memory_bandwidth);
  positive("network.intra_bandwidth_gb_per_s", intra_bandwidth);
  positive("network.inter_bandwidth_gb_per_s", inter_bandwidth);
  if (intra_pair_bandwidth < 0 || intra_pair_bandwidth > intra_bandwidth)
    fail("machine '", name, "': network.intra_pair_bandwidth_gb_per_s must be in [0, "
         "intra_bandwidth_gb_per_s] (got ", intra_pair_bandwidth / 1e9, " GB/s; 0: a switched node)");
  if (intra_latency < 0 || inter_latency < 0)
    fail("machine '", name, "': network latencies must be >= 0");
  if (compute_units < 0) fail("machine '", name, "': compute.units must be >= 0 (0: not modelled)");
  if (collective_units < 0 || (collective_units > 0 && collective_units >= compute_units))
    fail("machine '", name, "': compute.collective_units must be >= 0 and below compute.units (got ",
         collective_units, " of ", compute_units, " units; 0: contention not modelled)");
  if (!(overlap_slowdown >= 0 && overlap_slowdown <= 1))
    fail("machine '", name, "': compute.overlap_slowdown must be in [0, 1] (got ", overlap_slowdown,
         "; the fraction by which overlapped compute slows, 0.189 = 18.9%)");
  if (gemm_tile_m < 1 || gemm_tile_n < 1)
    fail("machine '", name, "': compute.gemm_tile must be two positive numbers [m, n]");
  for (const auto& gs : gemm_shapes)
    if (gs.m < 1 || gs.n < 1 || gs.k < 1 || !(gs.efficiency > 0 && gs.efficiency <= 1))
      fail("machine '", name, "': [[compute.gemm]] needs m, n, k >= 1 and efficiency in (0, 1] (got ",
           gs.m, "x", gs.n, "x", gs.k, " at ", gs.efficiency, ")");
  for (GemmOp op : {GemmOp::NN, GemmOp::NT, GemmOp::TN}) {
    // Interpolation needs every combination of the m, n and k values that occur (per variant).
    std::vector<int> ms, ns, ks;
    size_t rows = 0;
    for (const auto& gs : gemm_shapes)
      if (gs.op == op) ms.push_back(gs.m), ns.push_back(gs.n), ks.push_back(gs.k), ++rows;
    if (rows == 0) continue;
    for (auto* v : {&ms, &ns, &ks}) {
      std::sort(v->begin(), v->end());
      v->erase(std::unique(v->begin(), v->end()), v->end());
    }
    if (rows != ms.size() * ns.size() * ks.size())
      fail("machine '", name, "': [[compute.gemm]] rows of op \"", gemm_op_name(op),
           "\" must cover every combination of their m, n and k values once (", ms.size(), " x ",
           ns.size(), " x ", ks.size(), " = ", ms.size() * ns.size() * ks.size(),
           " rows expected, got ", rows, ")");
  }
  for (const auto& m : measured)
    if (m.group_size < 2 || !(m.bandwidth > 0) || m.latency < 0)
      fail("machine '", name, "': [[network.measured]] needs group_size >= 2, bandwidth > 0, "
           "latency >= 0");
  topology.validate(name);
}

double Machine::gemm_eff(double m, double n, double k, bool bf16, GemmOp op) const {
  if (m < 1 || n < 1 || k < 1) return gemm_efficiency;
  if (!gemm_shapes.empty()) {
    // The variant's own rows; a file measured before the variants existed has "nn" rows only.
    std::vector<MeasuredGemm> rows;
    for (const auto& gs : gemm_shapes)
      if (gs.op == op) rows.push_back(gs);
    if (rows.empty())
      for (const auto& gs : gemm_shapes)
        if (gs.op == GemmOp::NN) rows.push_back(gs);
    if (rows.empty()) rows = gemm_shapes;
    // Trilinear interpolation in log(m), log(n), log(k) on the measured lattice, clamped at its
    // edges (a shape beyond the largest measured one gets the edge's efficiency).
    std::vector<double> axis[3];
    for (const auto& gs : rows) axis[0].push_back(gs.m), axis[1].push_back(gs.n), axis[2].push_back(gs.k);
    for (auto& v : axis) {
      std::sort(v.begin(), v.end());
      v.erase(std::unique(v.begin(), v.end()), v.end());
    }
    const double q[3] = {m, n, k};
    size_t lo[3], hi[3];
    double w[3];
    for (int d = 0; d < 3; ++d) {
      const auto& v = axis[d];
      const double x = std::clamp(q[d], v.front(), v.back());
      size_t i = 0;
      while (i + 1 < v.size() && v[i + 1] < x) ++i;
      lo[d] = i;
      hi[d] = std::min(i + 1, v.size() - 1);
      w[d] = hi[d] == lo[d] ? 0.0 : std::log(x / v[lo[d]]) / std::log(v[hi[d]] / v[lo[d]]);
    }
    auto at = [&](size_t a, size_t b, size_t c) {
      for (const auto& gs : rows)
        if (gs.m == axis[0][a] && gs.n == axis[1][b] && gs.k == axis[2][c]) return gs.efficiency;
      return gemm_efficiency;  // unreachable: validate() checks the lattice is complete
    };
    double e = 0;
    for (int corner = 0; corner < 8; ++corner) {
      const bool bm = corner & 1, bn = corner & 2, bk = corner & 4;
      const double wt = (bm ? w[0] : 1 - w[0]) * (bn ? w[1] : 1 - w[1]) * (bk ? w[2] : 1 - w[2]);
      if (wt > 0) e += wt * at(bm ? hi[0] : lo[0], bn ? hi[1] : lo[1], bk ? hi[2] : lo[2]);
    }
    return std::clamp(e, 1e-3, 1.0);
  }
  double e = gemm_efficiency;
  if (compute_units > 0) {
    // Wave quantization: every unit computes one output tile at a time, so a GEMM takes
    // ceil(tiles / units) waves and the last one may leave units idle.
    // The library may lay the tile either way round; take the better.
    auto wave = [&](double tm, double tn) {
      const double tiles = std::ceil(m / tm) * std::ceil(n / tn);
      return tiles / (std::ceil(tiles / compute_units) * compute_units);
    };
    e *= std::max(wave(gemm_tile_m, gemm_tile_n), wave(gemm_tile_n, gemm_tile_m));
  }
  // Roofline: the operands read once and the output written once, at the memory's bandwidth.
  const double b = bf16 ? 2.0 : 4.0;
  const double intensity = 2 * m * n * k / (b * (m * k + k * n + m * n));
  const double pk = peak(bf16);
  if (pk > 0 && memory_bandwidth > 0) e = std::min(e, intensity * memory_bandwidth / pk);
  return e;
}

Machine load_machine_file(const std::string& path) {
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    fail("machine file '", path, "' line ", b.line, ", column ", b.column, ": ",
         std::string(e.description()));
  }
  Machine m;
  m.source = path;
  m.name = t["name"].value_or(fs::path(path).stem().string());
  m.description = t["description"].value_or(std::string());
  m.ranks_per_node = int(get_number(t, "ranks_per_node", path, true));
  m.peak_fp32 = get_number(t, "compute.peak_fp32_tflops", path, true) * kT;
  m.peak_bf16 = get_number(t, "compute.peak_bf16_tflops", path, false) * kT;
  m.gemm_efficiency = get_number(t, "compute.gemm_efficiency", path, true);
  m.attention_efficiency = get_number(t, "compute.attention_efficiency", path, false, 0);
  m.compute_units = int(get_number(t, "compute.units", path, false, 0));
  m.collective_units = int(get_number(t, "compute.collective_units", path, false, 0));
  m.overlap_slowdown = get_number(t, "compute.overlap_slowdown", path, false, 0);
  if (auto tile = t.at_path("compute.gemm_tile")) {
    const toml::array* a = tile.as_array();
    if (!a || a->size() != 2 || !(*a)[0].value<double>() || !(*a)[1].value<double>())
      fail("machine file '", path, "': compute.gemm_tile must be [m, n] (two numbers)");
    m.gemm_tile_m = int(*(*a)[0].value<double>());
    m.gemm_tile_n = int(*(*a)[1].value<double>());
  }
  if (const toml::array* arr = t.at_path("compute.gemm").as_array()) {
    for (const auto& e : *arr) {
      const toml::table* row = e.as_table();
      if (!row) fail("machine file '", path, "': compute.gemm must be an array of tables");
      MeasuredGemm gs;
      gs.m = int(get_number(*row, "m", path, true));
      gs.n = int(get_number(*row, "n", path, true));
      gs.k = int(get_number(*row, "k", path, true));
      gs.efficiency = get_number(*row, "efficiency", path, true);
      try {
        gs.op = parse_gemm_op((*row)["op"].value_or(std::string("nn")));
      } catch (const Error& e) {
        fail("machine file '", path, "': compute.gemm op: ", e.what());
      }
      m.gemm_shapes.push_back(gs);
    }
  }
  m.memory_bytes = get_number(t, "memory.per_rank_gb", path, true) * kG;
  m.memory_bandwidth = get_number(t, "memory.bandwidth_gb_per_s", path, true) * kG;
  m.intra_bandwidth = get_number(t, "network.intra_bandwidth_gb_per_s", path, true) * kG;
  m.intra_latency = get_number(t, "network.intra_latency_us", path, true) * kUs;
  m.intra_pair_bandwidth = get_number(t, "network.intra_pair_bandwidth_gb_per_s", path, false, 0) * kG;
  m.inter_bandwidth = get_number(t, "network.inter_bandwidth_gb_per_s", path, true) * kG;
  m.inter_latency = get_number(t, "network.inter_latency_us", path, true) * kUs;
  if (const toml::array* arr = t.at_path("network.measured").as_array()) {
    for (const auto& e : *arr) {
      const toml::table* row = e.as_table();
      if (!row) fail("machine file '", path, "': network.measured must be an array of tables");
      MeasuredLink l;
      l.op = (*row)["op"].value_or(std::string("all-reduce"));
      if (l.op != "all-reduce" && l.op != "all-gather" && l.op != "reduce-scatter")
        fail("machine file '", path, "': network.measured op '", l.op,
             "': expected all-reduce, all-gather or reduce-scatter");
      l.group_size = int(get_number(*row, "group_size", path, true));
      l.bandwidth = get_number(*row, "bandwidth_gb_per_s", path, true) * kG;
      l.latency = get_number(*row, "latency_us", path, true) * kUs;
      m.measured.push_back(l);
    }
  }
  if (t.at_path("network.topology")) {
    NetworkTopology& top = m.topology;
    try {
      top.kind = parse_topology_kind(t.at_path("network.topology.kind").value_or(std::string("")));
    } catch (const Error& e) {
      fail("machine file '", path, "': ", e.what());
    }
    top.nodes_per_group = int(get_number(t, "network.topology.nodes_per_group", path, true));
    top.nodes = int(get_number(t, "network.topology.nodes", path, false, 0));
    if (top.kind == NetworkTopology::Kind::Dragonfly) {
      top.groups = int(get_number(t, "network.topology.groups", path, true));
      top.links_per_arc = int(get_number(t, "network.topology.links_per_arc", path, true));
      top.link_bandwidth = get_number(t, "network.topology.link_bandwidth_gb_per_s", path, true) * kG;
    } else {
      top.oversubscription = get_number(t, "network.topology.oversubscription", path, false, 1);
    }
  }
  m.validate();
  return m;
}

static std::vector<fs::path> machine_dirs() {
  return {fs::path("machines"), fs::path(TETRAD_SOURCE_DIR_STR) / "machines"};
}

std::vector<std::string> shipped_machines() {
  std::vector<std::string> names;
  for (const auto& dir : machine_dirs()) {
    if (!fs::is_directory(dir)) continue;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".toml") names.push_back(e.path().stem().string());
    if (!names.empty()) break;
  }
  std::sort(names.begin(), names.end());
  return names;
}

Machine load_machine(const std::string& name_or_path) {
  if (name_or_path.ends_with(".toml") || name_or_path.find('/') != std::string::npos) {
    if (!fs::exists(name_or_path)) fail("machine file '", name_or_path, "' does not exist");
    return load_machine_file(name_or_path);
  }
  for (const auto& dir : machine_dirs()) {
    const fs::path p = dir / (name_or_path + ".toml");
    if (fs::exists(p)) return load_machine_file(p.string());
  }
  std::string known;
  for (const auto& n : shipped_machines()) known += (known.empty() ? "" : ", ") + n;
  fail("unknown machine '", name_or_path, "'; expected a .toml file or one of: ", known,
       " (tetrad plan --measure-machine FILE writes one for this machine)");
}

std::string machine_to_toml(const Machine& m) {
  std::ostringstream o;
  o << "# Machine description for `tetrad plan` (docs/planner.md). Per-rank figures unless noted.\n"
    << "name = " << toml::value<std::string>(m.name) << "\n"
    << "description = " << toml::value<std::string>(m.description) << "\n"
    << "ranks_per_node = " << m.ranks_per_node << "\n\n"
    << "[compute]\n"
    << "peak_fp32_tflops = " << fmt(m.peak_fp32 / kT) << "   # FLOP/s per rank\n"
    << "peak_bf16_tflops = " << fmt(m.peak_bf16 / kT) << "   # bf16 GEMM rate / gemm_efficiency; 0: none (bf16 plans refused)\n"
    << "gemm_efficiency = " << fmt(m.gemm_efficiency)
    << "   # fraction of peak that large training GEMMs reach\n";
  if (m.attention_efficiency > 0)
    o << "attention_efficiency = " << fmt(m.attention_efficiency)
      << "   # the same for the attention kernel (causal FLOPs executed)\n";
  if (m.compute_units > 0)
    o << "units = " << m.compute_units << "   # SMs a GEMM's tiles are spread over\n"
      << "gemm_tile = [" << m.gemm_tile_m << ", " << m.gemm_tile_n << "]   # output tile per unit\n";
  if (m.collective_units > 0)
    o << "collective_units = " << m.collective_units
      << "   # units a running collective holds while it overlaps compute\n";
  if (m.overlap_slowdown > 0)
    o << "overlap_slowdown = " << fmt(m.overlap_slowdown)
      << "   # measured slowdown of compute beside a collective\n";
  for (const auto& gs : m.gemm_shapes)
    o << "[[compute.gemm]]   # measured: C[m,n] += op(A)[m,k] op(B)[k,n], efficiency = sgemm / FMA peak\n"
      << "op = \"" << gemm_op_name(gs.op) << "\"\n"
      << "m = " << gs.m << "\nn = " << gs.n << "\nk = " << gs.k << "\nefficiency = "
      << fmt(gs.efficiency) << "\n";
  o << "\n"
    << "[memory]\n"
    << "per_rank_gb = " << fmt(m.memory_bytes / kG) << "\n"
    << "bandwidth_gb_per_s = " << fmt(m.memory_bandwidth / kG) << "   # per rank\n\n"
    << "[network]\n"
    << "intra_bandwidth_gb_per_s = " << fmt(m.intra_bandwidth / kG)
    << "   # per rank, one direction, inside a node\n"
    << "intra_latency_us = " << fmt(m.intra_latency / kUs) << "\n";
  if (m.intra_pair_bandwidth > 0)
    o << "intra_pair_bandwidth_gb_per_s = " << fmt(m.intra_pair_bandwidth / kG)
      << "   # the links joining one pair of ranks (no switch)\n";
  o
    << "inter_bandwidth_gb_per_s = " << fmt(m.inter_bandwidth / kG)
    << "   # per node (all NICs), one direction\n"
    << "inter_latency_us = " << fmt(m.inter_latency / kUs) << "\n";
  if (m.topology.present()) {
    const NetworkTopology& top = m.topology;
    o << "\n[network.topology]   # the level above the node (docs/planner.md, \"The network at scale\")\n"
      << "kind = \"" << topology_kind_name(top.kind) << "\"\n"
      << "nodes_per_group = " << top.nodes_per_group << "\n";
    if (top.nodes > 0) o << "nodes = " << top.nodes << "\n";
    if (top.kind == NetworkTopology::Kind::Dragonfly)
      o << "groups = " << top.groups << "\nlinks_per_arc = " << top.links_per_arc
        << "\nlink_bandwidth_gb_per_s = " << fmt(top.link_bandwidth / kG) << "\n";
    else
      o << "oversubscription = " << fmt(top.oversubscription) << "\n";
  }
  for (const auto& l : m.measured)
    o << "\n[[network.measured]]   # one collective among group_size ranks of one node\n"
      << "op = " << toml::value<std::string>(l.op) << "\n"
      << "group_size = " << l.group_size << "\n"
      << "bandwidth_gb_per_s = " << fmt(l.bandwidth / kG) << "\n"
      << "latency_us = " << fmt(l.latency / kUs) << "\n";
  return o.str();
}

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median seconds of one collective on `c` (all groups running at once): all-reduce of n floats,
// all-gather into n floats, reduce-scatter of n floats. The median, not the best: the planner
// predicts typical steps, and on a shared machine the best repetition is the one nobody else was
// running.
double time_collective(const std::string& op, const comm::Communicator& c,
                       const comm::Communicator& world, size_t n, int reps) {
  const size_t g = size_t(c.size());
  n = std::max(n / g, size_t(1)) * g;
  std::vector<float> buf(n, 1.0f), out(n, 0.0f);
  auto run = [&] {
    if (op == "all-reduce") c.allreduce_sum(buf.data(), n);
    else if (op == "all-gather") c.allgather(buf.data(), out.data(), n / g);
    else c.reduce_scatter_sum(buf.data(), out.data(), n / g);
  };
  run();  // warm-up: connections, buffers
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    world.barrier();
    const double t0 = now_s();
    run();
    double dt = now_s() - t0;
    world.allreduce_max(&dt, 1);  // the slowest group sets the pace
    t.push_back(dt);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// GFLOP/s of dnnl_sgemm C[m,n] = op(A)[m,k] op(B)[k,n] (row-major; op = the trainer's variant,
// GemmOp), calling it until at least `min_s` has passed: a 128^3 GEMM takes a tenth of a
// millisecond, far below a scheduler time slice.
class SgemmTimer {
 public:
  SgemmTimer(int m, int n, int k, GemmOp op = GemmOp::NN)
      : m_(m), n_(n), k_(k), op_(op), a_(size_t(m) * k, 1.0f), b_(size_t(k) * n, 0.5f), c_(size_t(m) * n) {
    call();  // warm-up: oneDNN's kernel selection and first touch
  }
  double gflops(double min_s) {
    int calls = 0;
    const double t0 = now_s();
    double dt = 0;
    do {
      call();
      ++calls;
      dt = now_s() - t0;
    } while (dt < min_s);
    return 2.0 * m_ * n_ * k_ * calls / dt * 1e-9;
  }

 private:
  void call() {
    const bool ta = op_ == GemmOp::TN, tb = op_ == GemmOp::NT;
    // A is [m, k] (or [k, m] transposed), B [k, n] (or [n, k]): leading dimensions as stored.
    if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m_, n_, k_, 1.0f, a_.data(), ta ? m_ : k_,
                   b_.data(), tb ? k_ : n_, 0.0f, c_.data(), n_) != dnnl_success)
      fail("dnnl_sgemm failed on ", m_, "x", n_, "x", k_);
  }
  int m_, n_, k_;
  GemmOp op_;
  std::vector<float> a_, b_, c_;
};

// Efficiency of every lattice shape relative to the square that gives gemm_efficiency: rounds of (square, every shape), each
// timed for at least 20 ms, and each shape's median ratio to the square of its own round, so a
// load that changes between rounds (a shared machine) cancels out. Times the square's efficiency
// (sgemm / FMA peak) gives each shape's.
std::vector<MeasuredGemm> measure_gemm_lattice(const std::vector<int>& dims, int square, int threads,
                                               int rounds, const comm::Communicator& world) {
  const int prev = omp_get_max_threads();
  omp_set_num_threads(threads);
  SgemmTimer sq(square, square, square);
  std::vector<MeasuredGemm> shapes;
  std::vector<SgemmTimer> timers;
  timers.reserve(3 * dims.size() * dims.size() * dims.size());
  // Each of the trainer's three variants (GemmOp): its weight-gradient GEMM (tn) reduces over the
  // tokens with a transposed operand, which oneDNN packs differently from the forward's.
  for (GemmOp op : {GemmOp::NN, GemmOp::NT, GemmOp::TN})
    for (int gm : dims)
      for (int gn : dims)
        for (int gk : dims) {
          shapes.push_back(MeasuredGemm{gm, gn, gk, 0, op});
          timers.emplace_back(gm, gn, gk, op);
        }
  std::vector<std::vector<double>> ratios(shapes.size());
  for (int r = 0; r < rounds; ++r) {
    world.barrier();
    const double ref = sq.gflops(0.02);
    for (size_t i = 0; i < shapes.size(); ++i) ratios[i].push_back(timers[i].gflops(0.02) / ref);
  }
  omp_set_num_threads(prev);
  for (size_t i = 0; i < shapes.size(); ++i) {
    auto& v = ratios[i];
    std::sort(v.begin(), v.end());
    shapes[i].efficiency = v[v.size() / 2];  // ratio to the square for now
  }
  return shapes;
}

}  // namespace

Machine measure_machine(const std::string& name, int threads, bool quick) {
  int mpi_ready = 0;
  MPI_Initialized(&mpi_ready);
  comm::Communicator world = mpi_ready ? comm::Communicator::world() : comm::Communicator::self();
  const int N = world.size();
  threads = threads > 0 ? threads : 1;

  // Compute ceilings with every rank computing at once: on a shared node that is the rate a rank
  // actually gets (4 ranks on 2 cores get about half a core each).
  world.barrier();
  Measurement fma = measure_fma_peak(threads, quick ? 0.02 : 0.05, quick ? 3 : 5);
  world.barrier();
  const int sq = quick ? 768 : 1536;
  Measurement gemm = measure_sgemm(GemmShape{"square", sq, sq, sq}, threads, quick ? 3 : 5);
  // sgemm on a lattice of shapes (every rank at once): how the efficiency falls for the thin
  // GEMMs that splitting a layer over X or Y leaves a rank (docs/planner.md, "GEMM efficiency by
  // shape"); the planner interpolates it in log(m), log(n), log(k).
  // The lattice has 256 as well: oneDNN's efficiency is not smooth in the width (on this machine
  // its tn call ran at 0.65-0.75 of nn with an output side of 256 but matched it at 128 and 512),
  // and 256 is what an X or Y split of a 512-wide model leaves a rank, so interpolating across
  // it would miss the dip. Three variants x 64 shapes, 3 rounds: about 30 s on a quiet core.
  const std::vector<int> dims =
      quick ? std::vector<int>{128, 1024} : std::vector<int>{128, 256, 512, 1536};
  std::vector<MeasuredGemm> lattice = measure_gemm_lattice(dims, sq, threads, 3, world);
  world.barrier();
  // The bf16 GEMM the trainer runs in bf16 mode (operands converted each call; native AMX /
  // AVX512-BF16 through oneDNN where the CPU has them, emulated in fp32 elsewhere), so the planner
  // prices a bf16 run at what it costs here on any CPU.
  Measurement bf16 = measure_gemm_bf16(GemmShape{"square", sq, sq, sq}, threads, quick ? 2 : 3);
  world.barrier();
  Measurement mem = measure_memory_bandwidth(size_t(64) << 20, threads, quick ? 3 : 5);
  world.barrier();
  const double attn = attention_gflops(threads, quick ? 2 : 4);
  // Medians: what a rank typically gets (on a shared machine the best repetition is the rare
  // quiet moment).
  double v[5] = {fma.median, gemm.median, bf16.ok() ? bf16.median : 0.0, mem.median, attn};
  // The slowest rank sets every rank's pace: take the minimum over ranks.
  for (double& x : v) {
    x = -x;
    world.allreduce_max(&x, 1);
    x = -x;
  }
  Machine m;
  m.name = name;
  m.ranks_per_node = N;
  m.peak_fp32 = v[0] * 1e9;
  m.gemm_efficiency = std::min(1.0, v[1] / v[0]);
  // peak_bf16 is the rate that, at the lattice's efficiencies, reproduces the measured bf16
  // square: the planner prices both precisions with the one (fp32-measured) shape lattice.
  m.peak_bf16 = v[2] > 0 ? v[2] * 1e9 / m.gemm_efficiency : 0;
  m.memory_bandwidth = v[3] * 1e9;
  m.attention_efficiency = std::min(1.0, v[4] / v[0]);
  for (MeasuredGemm& gs : lattice) {
    double r = -gs.efficiency;  // the slowest rank's ratio to the square
    world.allreduce_max(&r, 1);
    gs.efficiency = std::clamp(-r * m.gemm_efficiency, 1e-3, 1.0);
    m.gemm_shapes.push_back(gs);
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  m.memory_bytes = double(pages) * double(page) / N;

  // Ring all-reduce among g consecutive ranks, every group at once; latency from 1 float,
  // bandwidth from 16 Mi floats (64 MiB: larger than the last-level cache, like a model's
  // gradients; 16 MiB measured cache bandwidth, 3-7x what the trainer's collectives got) after
  // removing the latency part.
  const size_t big = quick ? (size_t(1) << 22) : (size_t(1) << 24);
  for (int g = 2; g <= N; ++g) {
    if (N % g != 0) continue;
    comm::Communicator grp = world.split(world.rank() / g, world.rank() % g, detail::concat("g", g));
    for (const std::string op : {"all-reduce", "all-gather", "reduce-scatter"}) {
      const double steps = op == "all-reduce" ? 2.0 * (g - 1) : double(g - 1);
      const double t_small = time_collective(op, grp, world, size_t(g), quick ? 20 : 50);
      const double t_big = time_collective(op, grp, world, big, quick ? 3 : 7);
      MeasuredLink l;
      l.op = op;
      l.group_size = g;
      l.latency = t_small / steps;
      const double bw_time = std::max(t_big - t_small, 1e-9);
      l.bandwidth = steps / g * double(big * sizeof(float)) / bw_time;
      m.measured.push_back(l);
    }
  }
  if (!m.measured.empty()) {
    // The largest group's all-reduce stands for the node; there is no inter-node network on one
    // machine, so "across nodes" gets the same figures (a plan never needs them when every rank
    // is in one node).
    m.intra_bandwidth = m.measured[m.measured.size() - 3].bandwidth;
    m.intra_latency = m.measured[m.measured.size() - 3].latency;
  } else {
    m.intra_bandwidth = m.memory_bandwidth / 2;
    m.intra_latency = 1e-6;
  }
  m.inter_bandwidth = m.intra_bandwidth * N;
  m.inter_latency = m.intra_latency;
  std::ostringstream d;
  d << "measured by tetrad plan --measure-machine: " << N << " rank(s) x " << threads
    << " thread(s), " << num_cores() << " core(s) visible to each rank, " << cpu_features().summary()
    << "; compute measured with all ranks busy; bf16 GEMMs " << backend::cpu_backend().bf16_status().gemm_path;
  m.description = d.str();
  m.validate();
  return m;
}

}  // namespace tetrad::planner
