#include "tetrad/data/tokenizer.hpp"
#include "tetrad/train/trainer.hpp"
#include "tetrad/train/inference.hpp"

#include <mpi.h>
#include <omp.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <memory>
#include <sstream>
#include <thread>

#include "tetrad/checkpoint/hf.hpp"
#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/checkpoint/run_checkpoint.hpp"
#include "tetrad/checkpoint/run_lock.hpp"
#include "tetrad/checkpoint/sharded_saver.hpp"
#include "tetrad/comm/communicator.hpp"
#include "tetrad/comm/transports.hpp"
#include "tetrad/core/cpu.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/json.hpp"
#include "tetrad/core/hash.hpp"
#include "tetrad/core/profile.hpp"
#include "tetrad/core/signals.hpp"
#include "tetrad/data/loader.hpp"
#include "tetrad/data/tokenizer.hpp"
#include "tetrad/model/params.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/planner/planner.hpp"
#include "tetrad/train/auto_grid.hpp"
#include "tetrad/train/device_memory.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/pipeline.hpp"
#include "tetrad/parallel/process_groups.hpp"
#include "tetrad/train/loss_mask.hpp"
#include "tetrad/train/step_runner.hpp"
#include "tetrad/train/optimizer.hpp"
#include "tetrad/train/watchdog.hpp"

namespace fs = std::filesystem;

namespace tetrad {

namespace {

std::string fixed1(double v) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(1) << v;
  return o.str();
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = long(s + 0.5);
  std::ostringstream os;
  if (t >= 3600) os << t / 3600 << "h" << std::setw(2) << std::setfill('0') << (t / 60) % 60 << "m";
  else if (t >= 60) os << t / 60 << "m" << std::setw(2) << std::setfill('0') << t % 60 << "s";
  else os << t << "s";
  return os.str();
}

// The data folder's tokenizer identity and vocabulary, checked against the model.
struct DataInfo {
  uint64_t tokenizer_identity = 0;
  int vocab_size = 0;
  std::string tokenizer_path;
};

DataInfo read_data_info(const std::string& data_dir, const ModelConfig& model) {
  const std::string meta_path = data_dir + "/meta.json";
  std::ifstream f(meta_path);
  if (!f)
    fail("data folder '", data_dir, "' has no meta.json; prepare it first with `tetrad prepare "
         "--input <text> --out ", data_dir, "`");
  std::stringstream text;
  text << f.rdbuf();
  const nlohmann::json j = parse_json_file_text(text.str(), "'" + meta_path + "'");
  DataInfo d;
  try {
    d.vocab_size = j.at("tokenizer").at("vocab_size").get<int>();
    d.tokenizer_identity =
        std::stoull(j.at("tokenizer").at("identity").get<std::string>(), nullptr, 16);
  } catch (const std::exception& e) {
    fail("'", meta_path, "' lacks tokenizer.vocab_size / tokenizer.identity: ", e.what());
  }
  if (d.vocab_size > model.vocab_size)
    fail("the tokenizer of '", data_dir, "' has ", d.vocab_size,
         " tokens but model.vocab_size is ", model.vocab_size,
         "; set model.vocab_size >= ", d.vocab_size);
  // Data folders from before tokenizer.json support name no file: theirs is tokenizer.model.
  const auto& tj = j["tokenizer"];
  d.tokenizer_path = data_dir + "/" +
                     (tj.contains("file") && tj["file"].is_string() ? tj["file"].get<std::string>()
                                                                    : std::string("tokenizer.model"));
  return d;
}

// Before any compute: the data folder's tokenizer is there, loads, and is the one the shards
// were made with (it is copied into every checkpoint; `generate` needs it).
void check_data_tokenizer(const std::string& data_dir, const DataInfo& d) {
  const std::string file = fs::path(d.tokenizer_path).filename().string();
  std::error_code ec;
  if (!fs::exists(d.tokenizer_path, ec))
    fail("data folder '", data_dir, "' has no ", file, " (the shards' tokenizer, kept with every "
         "checkpoint); prepare the folder again with `tetrad prepare`");
  uint64_t id = 0;
  try {
    id = data::Tokenizer::load(d.tokenizer_path).identity();
  } catch (const std::exception& e) {
    fail("data folder '", data_dir, "': ", file, " does not load (damaged?): ", e.what());
  }
  if (id != d.tokenizer_identity)
    fail("data folder '", data_dir, "': ", file, " (identity ", hex64(id),
         ") is not the tokenizer the shards were made with (meta.json records ",
         hex64(d.tokenizer_identity), "); prepare the folder again or restore its ", file);
}

// Before the model is allocated, on every rank: the memory the planner's formula gives for this
// run on this grid (weights, gradients, optimizer state, gathered weights, activations;
// planner.hpp), plus the backend's own workspace, must fit the memory this rank has on its device
// (train.memory_limit_mib, else Backend::memory_available() divided among the ranks that share
// the device), or the run stops with the formula's numbers (rather than allocating until the
// device runs out, or failing inside a step). The ranks decide together: root logs its line and
// flushes it, a collective finds the lowest rank that does not fit, and every rank stops with that
// rank's message. (Deciding alone raced: a rank that stopped first made mpirun kill root before
// its line was out, and the log lost the figure the error is about.)
std::string memory_problem_of_this_rank(const RunConfig& cfg, const parallel::GridShape& shape,
                                        int world, int rank, int ranks_on_node,
                                        backend::Backend& device, bool bf16, std::ostream& out,
                                        bool quiet) {
  MemoryFit fit;
  try {
    planner::PlanInput in = plan_input_of(cfg, world, device);
    in.precision = bf16 ? backend::Precision::BF16 : backend::Precision::FP32;  // as run on this device
    fit.formula = planner::memory_per_rank(in, shape);
  } catch (const Error&) {
    return "";  // a layout the formula cannot take; the model's own checks report what is wrong
  }
  if (device.name().rfind("cuda", 0) == 0) fit.workspace = backend_reserve_bytes(fit.formula);
  fit.device = device.name();
  const double MiB = double(1 << 20);
  if (cfg.train.memory_limit_mib > 0) {
    fit.available = double(cfg.train.memory_limit_mib) * MiB;
    fit.available_from = detail::concat("train.memory_limit_mib = ", cfg.train.memory_limit_mib);
  } else {
    const backend::MemoryAvailable m = device.memory_available();
    // Host memory is shared by every rank of the node; a GPU by the ranks on it: "cuda" picks
    // local_rank % devices (backend/device_select.hpp), "cuda:N" puts every rank on N.
    int sharing = std::max(1, ranks_on_node);
    if (!m.host_shared && cfg.train.device == "cuda" && m.devices > 1) {
      sharing = 0;
      for (int r = 0; r < ranks_on_node; ++r) sharing += r % m.devices == m.index;
      sharing = std::max(1, sharing);
    }
    fit.available = double(m.available) / sharing;
    fit.available_from = detail::concat(
        m.source, " ", fixed1(double(m.available) / MiB), " MiB of ", fixed1(double(m.total) / MiB),
        " MiB",
        sharing > 1 ? detail::concat(" / ", sharing, m.host_shared ? " ranks on the node"
                                                                   : " ranks on the device")
                    : std::string());
    if (m.available == 0) fit.available_from = m.source + " gave no figure: not checked";
  }
  if (!quiet) out << memory_fit_line(fit) << std::endl;  // out before any rank can stop the job
  FitContext c;
  c.rank = rank;
  c.world = world;
  c.micro_batch = cfg.train.micro_batch;
  c.recompute = cfg.train.recompute;
  c.bf16 = bf16;
  return memory_fit_problem(fit, c);
}

void check_memory_fits(const RunConfig& cfg, const parallel::GridShape& shape, int world, int rank,
                       int ranks_on_node, backend::Backend& device, bool bf16, std::ostream& out,
                       bool quiet, const comm::Communicator& world_group) {
  const std::string why =
      memory_problem_of_this_rank(cfg, shape, world, rank, ranks_on_node, device, bf16, out, quiet);
  // The lowest rank that does not fit, or world when all do (every rank gets here: a rank that
  // throws before it ends the job under mpirun, it does not leave the others waiting).
  int32_t first_bad = why.empty() ? world : rank;
  if (world > 1) {
    first_bad = -first_bad;
    world_group.allreduce_max(&first_bad, 1);
    first_bad = -first_bad;
  }
  if (first_bad == world) return;
  // Every rank stops with that rank's message: the first error ends the job (MPI_Abort), so
  // whichever rank's comes out, it carries the numbers.
  std::string msg = why;
  if (world > 1) {
    int64_t len = int64_t(msg.size());
    world_group.broadcast(&len, 1, first_bad);
    std::vector<uint16_t> text(static_cast<size_t>(len));  // bytes, one an element
    if (rank == first_bad)
      for (size_t i = 0; i < msg.size(); ++i) text[i] = static_cast<unsigned char>(msg[i]);
    world_group.broadcast(text.data(), text.size(), first_bad);
    msg.resize(text.size());
    for (size_t i = 0; i < text.size(); ++i) msg[i] = static_cast<char>(text[i]);
  }
  fail(msg);
}

// train.threads = 0: OMP_NUM_THREADS if set, else this node's cores shared among its ranks
// (ranks x threads above the cores makes OpenMP spin against itself).
void set_threads(int threads) {
  int n = threads;
  if (n <= 0) {
    if (const char* env = std::getenv("OMP_NUM_THREADS"); env && std::atoi(env) > 0) {
      n = std::atoi(env);
    } else {
      n = std::max(1, num_cores() / std::max(1, launcher_ranks_per_node()));
    }
  }
  omp_set_num_threads(n);
}

// Continues the data stream where the checkpoint left it. The position is the job's, so it
// holds for any number of data replicas or micro-batch split (the batches are then those of the
// new layout from that position on); a different sequence length numbers the windows
// differently, so that is refused.
void restore_data_position(const nlohmann::json& d, const std::string& dir, int T,
                           data::DataLoader& loader) {
  if (d.is_object() && d.empty()) return;  // an imported model: the data from the start
  try {
    const int saved_T = d.at("seq_len").get<int>();
    if (saved_T != T)
      fail("checkpoint ", dir, " was trained with train.seq_len = ", saved_T, " but the config has ",
           T, "; the data windows would not continue where they stopped (set train.seq_len = ",
           saved_T, " or start a new run.dir)");
    loader.restore(data::LoaderState{d.at("epoch").get<uint64_t>(), d.at("cursor").get<uint64_t>()});
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint ", dir, " lacks the data position: ", e.what());
  }
}

// The checkpoint a run folder's `latest` names, else its newest step folder ("" if none).
std::string latest_checkpoint_name(const std::string& run_dir, const std::vector<int64_t>& steps) {
  const std::string latest = run_dir + "/checkpoints/latest";
  std::error_code ec;
  if (fs::exists(latest, ec)) {
    try {
      std::string name = read_small_file(latest);
      while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
      if (!name.empty()) return name;
    } catch (const Error&) {
    }
  }
  return steps.empty() ? std::string() : checkpoint_folder_name(steps.front());
}

// On rank 0, holding the run folder's lock: a folder that already holds a trained run is only
// continued (--resume) or, when asked (--overwrite), emptied; never silently overwritten. Then
// what an interrupted save or prune left is removed.
void claim_run_folder(const std::string& run_dir, const TrainOptions& opt, std::ostream& out) {
  if (opt.resume && opt.overwrite)
    fail("--resume and --overwrite contradict each other: --resume continues the run in ", run_dir,
         ", --overwrite deletes it");
  const std::vector<int64_t> steps = checkpoint_steps(run_dir);
  if (!opt.resume && !steps.empty()) {
    std::string list;
    for (size_t i = 0; i < steps.size() && i < 5; ++i) list += (i ? ", " : "") + std::to_string(steps[i]);
    if (steps.size() > 5) list += ", ...";
    const std::string latest = latest_checkpoint_name(run_dir, steps);
    if (!opt.overwrite)
      fail("run folder '", run_dir, "' already holds a trained run: checkpoints of step(s) ", list,
           ", the latest ", run_dir, "/checkpoints/", latest,
           ". Not overwriting it. To continue that run pass --resume; to start another run set "
           "run.dir to a new folder (--set run.dir=...); to delete it and start afresh pass --overwrite");
    out << "overwrite: deleting the run in " << run_dir << " (checkpoints of step(s) " << list
        << ", metrics.jsonl) and starting afresh\n";
    const fs::path ck = fs::path(run_dir) / "checkpoints", gone = fs::path(run_dir) / "checkpoints.pruning";
    std::error_code ec;
    fs::remove_all(gone, ec);
    fs::rename(ck, gone, ec);
    if (ec) fail("cannot move '", ck.string(), "' out of the way: ", ec.message());
    fs::remove_all(gone, ec);
    if (ec) fail("cannot delete '", gone.string(), "': ", ec.message());
    fs::remove(fs::path(run_dir) / "metrics.jsonl", ec);
  }
  std::error_code ec;
  if (fs::exists(fs::path(run_dir) / "checkpoints.pruning", ec)) {
    fs::remove_all(fs::path(run_dir) / "checkpoints.pruning", ec);
    if (ec) fail("cannot delete '", run_dir, "/checkpoints.pruning' (left by an interrupted --overwrite): ",
                 ec.message());
  }
  clean_run_folder(run_dir, out);
}

// A checkpoint's loss record: the mean training loss of the last steps before it, and whether it
// is healthy (finite, no worse than a uniform guess over the vocabulary plus 1 nat, and not more
// than twice the best such mean of the run). An unhealthy checkpoint only changes pruning: the
// newest healthy one is kept besides the newest train.keep_checkpoints (run_checkpoint.hpp).
struct LossRecord {
  double loss = NAN;
  bool known = false, healthy = true;
};

LossRecord loss_record(const std::vector<double>& losses, double best, int vocab) {
  LossRecord r;
  const size_t n = losses.size(), from = n > 20 ? n - 20 : 0;
  if (n == 0) return r;
  double sum = 0;
  int finite = 0;
  for (size_t i = from; i < n; ++i)
    if (std::isfinite(losses[i])) sum += losses[i], ++finite;
  r.known = true;
  r.loss = finite ? sum / finite : NAN;
  r.healthy = std::isfinite(r.loss) && r.loss <= std::log(double(std::max(vocab, 2))) + 1.0 &&
              (!std::isfinite(best) || r.loss <= 2 * best);
  return r;
}

}  // namespace

bool progress_thread_wins(const std::string& mode, int ranks_on_node, int threads) {
  if (mode == "true") return true;
  if (mode == "false") return false;
  if (mode != "auto")
    fail("parallel.progress_thread must be true, false or \"auto\", got \"", mode, "\"");
  // The thread polls every ~50 us while collectives are pending: with a spare core it costs
  // nothing, on a full node it takes that time from the kernels (bench/overlap_train.sh: +10% on
  // the Z grid's step with 2 ranks x 1 thread on 2 cores, where polling costs nothing).
  return int64_t(ranks_on_node) * (threads + 1) <= num_cores();
}

parallel::OverlapOptions overlap_options(const OverlapConfig& c, int ranks_on_node, int threads) {
  parallel::OverlapOptions o;
  o.backward_allreduce = c.backward_allreduce;
  o.reduce_scatter = c.reduce_scatter;
  o.prefetch_depth = c.prefetch_depth;
  o.prefetch_across_steps = c.prefetch_across_steps;
  o.cache_gathered_weights = c.cache_gathered_weights;
  o.dp_overlap = c.dp_overlap;
  o.dp_bucket_mb = c.dp_bucket_mb;
  o.forward_chunks = c.forward_chunks;
  o.progress_thread = progress_thread_wins(c.progress_thread, ranks_on_node, threads);
  return o;
}

TrainResult train(const RunConfig& cfg, const TrainOptions& opt, std::ostream& log_stream) {
  cfg.validate();
  const TrainConfig& t = cfg.train;
  set_threads(t.threads);
  if (t.comm_timeout > 0) comm::set_collective_timeout(t.comm_timeout, "train.comm_timeout");

  // The process grid: the config's, checked against the ranks this job was launched with.
  using parallel::GridShape;
  using parallel::ProcessGroups;
  int mpi_ready = 0;
  MPI_Initialized(&mpi_ready);
  int world = 1;
  if (mpi_ready) MPI_Comm_size(MPI_COMM_WORLD, &world);
  // Where the model computes (train.device): its parameters, gradients, moments and activations
  // live there; the host reaches them through the backend's queue (checkpoints below).
  // Made before the grid is chosen: what precision "auto" means is the device's to say.
  std::unique_ptr<backend::Backend> device_owner;
  backend::Backend* device = &backend::cpu_backend();
  if (t.device != "cpu") {
    device_owner = backend::create(t.device);  // refuses naming what this build and machine lack
    device = device_owner.get();
  }
  // "auto", or no grid named on more than one rank: the planner's first choice, and why.
  const AutoGrid chosen_grid = resolve_grid(cfg, world, launcher_ranks_per_node(), *device);
  const GridShape shape = chosen_grid.grid;
  const std::string& auto_why = chosen_grid.why;
  comm::check_transport(t.comm, t.device, shape.p());  // a chosen grid may have a pipeline axis
  // The trainer's own groups are MPI's (or self() on one rank), whatever train.comm says: every
  // value the trainer reduces lives in host memory (loss sums, token counts, the weights' sum of
  // squares, failure flags, signals, the run-folder and checkpoint agreements), and NCCL
  // collectives take device memory only. The model gets NCCL groups of its own below when
  // train.comm resolves to nccl (their host() twins are MPI too).
  ProcessGroups groups =
      world > 1 ? ProcessGroups(comm::Communicator::world(), shape) : ProcessGroups();
  const bool root = groups.world.rank() == 0;
  std::ostream null_stream(nullptr);
  std::ostream& out = root ? log_stream : null_stream;
  if (!auto_why.empty()) out << auto_why;

  const int replicas = token_slots(shape);
  if (t.micro_batch % replicas != 0)
    fail("train.micro_batch (", t.micro_batch, ") must be divisible by Gz x Gd = ", replicas,
         " (its sequences are split over the Z and data-parallel ranks)");
  const int B = t.micro_batch / replicas, T = t.seq_len;
  const int slot = token_slot(groups.coord, shape);  // this rank's share of the tokens
  const DataInfo data = read_data_info(cfg.data_dir, cfg.model);
  check_data_tokenizer(cfg.data_dir, data);
  {
    // The shards of both splits (validation only where evaluation is on) open and match the
    // tokenizer and model now, not at the first evaluation after compute was spent.
    data::LoaderOptions o;
    o.tokenizer_identity = data.tokenizer_identity;
    o.model_vocab = cfg.model.vocab_size;
    o.shuffle = false;
    const data::DataLoader train_split(cfg.data_dir, "train", B, T, slot, replicas, t.seed, o);
    if (t.eval_interval > 0) {
      try {
        const data::DataLoader val_split(cfg.data_dir, "val", B, T, slot, replicas, t.seed, o);
      } catch (const Error& e) {
        fail(e.what(), " (validation is on, train.eval_interval = ", t.eval_interval,
             ": prepare with a larger --val-fraction, or set train.eval_interval = 0)");
      }
    }
  }
  const bool host_memory = device->capabilities().host_visible;
  // train.comm resolved (config.hpp): the model's groups on NCCL or on MPI, and why, for the log.
  // Made after the device, whose creation selects this rank's GPU (NCCL's communicators live on
  // the current device).
  // The rules: comm/transports.hpp.
  const comm::TransportChoice transport =
      comm::choose_transport(t.comm, t.device, shape.p(), groups.world);
  const bool use_nccl = transport.name == "nccl";
  const std::string& comm_why = transport.why;
  std::unique_ptr<ProcessGroups> nccl_groups;
  if (use_nccl)
    nccl_groups = std::make_unique<ProcessGroups>(ProcessGroups::on_nccl(
        mpi_ready ? comm::Communicator::world() : comm::Communicator::self("world"), shape));
  // The model's groups: NCCL's, or the trainer's own MPI groups.
  ProcessGroups& model_groups = nccl_groups ? *nccl_groups : groups;
  // GEMM precision of this run's model (not a process-wide switch: the model carries it). "auto"
  // is the device's to say (Backend::auto_precision: bf16 where it has bf16 matrix hardware).
  const backend::PrecisionChoice precision_choice = backend::resolve_precision(t.precision, *device);
  const backend::Precision precision = precision_choice.precision;
  check_memory_fits(cfg, shape, world, groups.world.rank(),
                    launcher_ranks_per_node() > 0 ? launcher_ranks_per_node() : world, *device,
                    precision == backend::Precision::BF16, out, opt.quiet, groups.world);

  // The run folder is this run's from here to the end (rank 0 holds its lock; every rank writes
  // shards into it): a second trainer is refused, and a folder holding a trained run is not
  // overwritten without --resume or --overwrite.
  std::unique_ptr<RunLock> run_lock;
  {
    int refused = 0;
    std::exception_ptr why;
    if (root) {
      try {
        std::string took_over;
        run_lock = std::make_unique<RunLock>(cfg.run_dir, &took_over);
        if (!took_over.empty()) out << took_over << "\n";
        claim_run_folder(cfg.run_dir, opt, out);
        RunConfig saved = cfg;  // a grid not named: the one chosen
        if (saved.grid.empty()) saved.grid = shape.to_arg();
        const std::string resolved = to_toml(saved);
        write_file_atomic(cfg.run_dir + "/config.toml", resolved);
        if (!opt.quiet) out << "# resolved configuration (saved to " << cfg.run_dir << "/config.toml)\n"
                            << resolved << "\n";
      } catch (const Error&) {
        refused = 1;
        why = std::current_exception();
      }
    }
    if (world > 1) groups.world.broadcast(&refused, 1, 0);
    if (refused) {
      if (why) std::rethrow_exception(why);
      fail("rank 0 refused the run folder ", cfg.run_dir, " (see its message)");
    }
  }

  parallel::ParallelOptions popt;
  popt.device = device;
  popt.precision = precision;
  if (t.attention_precision != "auto")
    popt.attention_precision = t.attention_precision == "bf16" ? backend::Precision::BF16
                                                               : backend::Precision::FP32;
  std::string layouts_why = "a plan given";
  if (t.gemm_layouts.find(':') != std::string::npos)
    popt.gemm_layout_plan = t.gemm_layouts;
  else
    popt.gemm_layouts = parallel::resolve_gemm_layouts(t.gemm_layouts, popt.precision, *device,
                                                       &layouts_why);
  popt.grad_comm_bf16 = t.grad_comm_precision == "bf16";
  popt.recompute = parallel::parse_recompute(t.recompute);
  popt.zero = cfg.zero;
  popt.virtual_stages = cfg.virtual_stages;
  popt.pipeline_layers = cfg.pipeline_layers;
  popt.sparse_embedding_grad = cfg.sparse_embedding_grad;
  // Ranks on this node: the launcher's count, else all of them (one node assumed).
  const int on_node = launcher_ranks_per_node() > 0 ? launcher_ranks_per_node() : world;
  popt.overlap = overlap_options(cfg.overlap, on_node, omp_get_max_threads());  // dp_overlap dropped with ZeRO or Gp > 1
  parallel::ParallelTransformer model(cfg.model, model_groups, B, T, popt);
  StepProfile prof;
  TraceLog trace_log;
  if (!opt.trace_path.empty()) prof.trace = &trace_log;
  model.set_profile(&prof);
  const ParamTable& table = model.table();
  // The split actually run ("balanced" is resolved from the model's costs, so say what it chose).
  if (shape.p() > 1 && root && !opt.quiet)
    out << "# pipeline: " << cfg.schedule << ", layers per virtual stage "
        << model.layer_split().to_string() << " (parallel.pipeline_layers = \""
        << cfg.pipeline_layers << "\")\n";
  const parallel::OptimizerLayout& ol = model.optimizer_layout();
  AdamW adam(decay_ranges(table, t, ol.param_offsets, ol.sizes, ol.state_offsets, ol.grad_offsets),
             ol.state_size, t, *device);
  // The step (train/step_runner.hpp). Gp > 1: its micro-batches go through the stages in the
  // pipeline schedule's order (runner.pipeline()). Host values are summed over the trainer's
  // own MPI groups.
  StepOptions sopt;
  sopt.micro_batches = t.grad_accum;
  sopt.B = B;
  sopt.T = T;
  sopt.grad_clip = t.grad_clip;
  sopt.max_bad_steps = t.max_bad_steps;
  sopt.schedule = parallel::parse_pipeline_schedule(cfg.schedule);
  sopt.profile = &prof;
  StepRunner runner(model, adam, groups, sopt);
  parallel::PipelineDriver* const pipe = runner.pipeline();
  // Host copies of device memory (not on the CPU backend, whose memory is host memory): n floats
  // of `dev` into host staging memory, and back.
  auto to_host = [&](const float* dev, size_t n) {
    backend::DeviceArray<float> h(*device, n, backend::MemoryKind::HostStaging);
    if (n) device->queue().copy_to_host(h.data(), dev, n * sizeof(float));
    device->queue().synchronize();
    return h;
  };
  auto to_device = [&](float* dev, const float* host, size_t n) {
    if (n) device->queue().copy_to_device(dev, host, n * sizeof(float));
    device->queue().synchronize();
  };
  data::LoaderOptions lopt;
  lopt.tokenizer_identity = data.tokenizer_identity;
  lopt.model_vocab = cfg.model.vocab_size;
  data::DataLoader train_loader(cfg.data_dir, "train", B, T, slot, replicas, t.seed, lopt);
  data::LoaderOptions val_opt = lopt;
  val_opt.shuffle = false;

  TrainResult result;
  int64_t step = 0;
  bool loaded = false;
  double best_loss = INFINITY;  // the best healthy checkpoint loss of the run (loss_record)
  auto restore_best = [&](const nlohmann::json& rec) {
    if (rec.is_object() && rec.contains("best_loss") && rec["best_loss"].is_number())
      best_loss = rec["best_loss"].get<double>();
  };
  // A tuned plan is the checkpoint's on resume (the same sums as the run that wrote it, so a
  // resumed run is bit-identical to an uninterrupted one); re-tuned only where the local shapes
  // changed (another grid or micro-batch). rule stays rule.
  std::string layouts_resumed;
  auto restore_gemm_layouts = [&](const nlohmann::json& rec) {
    if (popt.gemm_layouts != parallel::GemmLayouts::Tune || !rec.is_object() ||
        !rec.contains("gemm_layouts") || !rec["gemm_layouts"].is_string())
      return;
    const std::string src = rec.value("gemm_layouts_source", std::string());
    if (src != "tuned" && src != "checkpoint") return;  // that run had no tuned plan
    const parallel::GemmLayoutPlan saved =
        parallel::GemmLayoutPlan::parse(rec["gemm_layouts"].get<std::string>(), "checkpoint");
    layouts_resumed = model.set_gemm_layout_plan(saved)
                          ? "the checkpoint's"
                          : "re-tuned: the checkpoint's plan was for other shapes (" +
                                saved.to_string() + ")";
  };
  if (opt.resume) {
    // Rank 0 lists the usable checkpoints (latest first, cleaning up after an interrupted save)
    // and offers them one at a time; every rank loads its part of the offered one (sharded:
    // only the chunks it needs, each checksum-verified). If any rank fails (a damaged chunk, a
    // mismatching config), all agree to refuse it and go on to the previous one.
    std::vector<FoundCheckpoint> candidates;
    if (root) {
      std::ostringstream why;
      candidates = resume_candidates(cfg.run_dir, why);
      out << why.str();
    }
    std::string last_error;
    for (size_t k = 0;; ++k) {
      int64_t chosen = root && k < candidates.size() ? candidates[k].step : -1;
      if (world > 1) groups.world.broadcast(&chosen, 1, 0);
      if (chosen < 0) {
        if (k == 0) {
          out << "resume: no checkpoint in " << cfg.run_dir << "/checkpoints; starting from scratch\n";
          break;
        }
        fail("resume: no checkpoint in ", cfg.run_dir, "/checkpoints could be loaded",
             last_error.empty() ? std::string() : "; the last error: " + last_error);
      }
      const std::string dir = cfg.run_dir + "/checkpoints/" + checkpoint_folder_name(chosen);
      int failed = 0;
      std::string error;
      try {
        if (is_sharded_checkpoint(dir)) {
          // The files hold the moments laid out like the parameters; with ZeRO this rank keeps
          // its D piece of each tensor (optimizer_layout()).
          // On a device the files are read into host memory and copied over.
          const bool pieces = cfg.zero >= 1;
          const size_t np = size_t(model.num_local_params());
          std::vector<float> m_full(pieces || !host_memory ? np : 0), v_full(m_full.size()),
              p_host(host_memory ? 0 : np);
          const ShardedCheckpointInfo info = load_sharded_checkpoint(
              dir, cfg.model, data.tokenizer_identity, model.plan(),
              host_memory ? model.params() : p_host.data(),
              pieces || !host_memory ? m_full.data() : adam.m(),
              pieces || !host_memory ? v_full.data() : adam.v());
          if (!host_memory) to_device(model.params(), p_host.data(), np);
          if (pieces) {
            for (size_t i = 0; i < ol.sizes.size(); ++i) {
              const size_t n = size_t(ol.sizes[i]);
              to_device(adam.m() + ol.state_offsets[i], m_full.data() + ol.param_offsets[i], n);
              to_device(adam.v() + ol.state_offsets[i], v_full.data() + ol.param_offsets[i], n);
            }
          } else if (!host_memory) {
            to_device(adam.m(), m_full.data(), np);
            to_device(adam.v(), v_full.data(), np);
          }
          step = info.step;
          restore_best(info.extra);
          restore_gemm_layouts(info.extra);
          restore_data_position(info.data, dir, T, train_loader);
        } else {
          // The previous format (one HF folder + trainer_state.bin), tensor by tensor.
          auto keep = [&](float* local) {
            return [&model, local](size_t i, const float* d) { model.scatter_tensor(local, i, d); };
          };
          auto keep_state = [&](float* local) {
            return [&model, local](size_t i, const float* d) {
              model.scatter_state_tensor(local, i, d);
            };
          };
          TrainerState st = load_run_checkpoint_streamed(dir, cfg.model, table, keep(model.params()),
                                                         keep_state(adam.m()), keep_state(adam.v()));
          step = st.step;
          restore_best(st.info);
          try {
            train_loader.restore(data::LoaderState{st.info.at("data_epoch").get<uint64_t>(),
                                                   st.info.at("data_cursor").get<uint64_t>()});
          } catch (const nlohmann::json::exception& e) {
            fail("checkpoint '", dir, "' lacks the data position: ", e.what());
          }
        }
      } catch (const Error& e) {
        failed = 1;
        error = e.what();
      }
      if (world > 1) groups.world.allreduce_max(&failed, 1);
      if (!failed) {
        loaded = true;
        result.resumed_from = dir;
        out << "resumed from " << dir << " at step " << step << "\n";
        break;
      }
      if (!error.empty()) {
        last_error = error;
        std::cerr << "tetrad: rank " << groups.world.rank() << ": checkpoint " << dir
                  << " refused: " << error << std::endl;
      }
      out << "resume: " << dir << " refused" << (error.empty() ? " by another rank (see its message)" : "")
          << "; trying the previous checkpoint\n";
    }
  }
  if (!loaded) {
    if (!cfg.init_from.empty()) {
      // Fine-tuning: the data must be made with the model's own tokenizer.
      if (const std::string tok = data::find_tokenizer_file(cfg.init_from); !tok.empty()) {
        const uint64_t id = hash_file(tok);
        if (id != data.tokenizer_identity)
          fail("run.init_from '", cfg.init_from, "' has tokenizer ", hex64(id), " (", tok,
               ") but the shards in '", cfg.data_dir, "' were made with tokenizer ",
               hex64(data.tokenizer_identity), "; prepare the data with --tokenizer ", cfg.init_from);
      }
      load_hf_params_streamed(cfg.init_from, cfg.model, table,
                              [&](size_t i, const float* data) {
                                model.scatter_tensor(model.params(), i, data);
                              });
      out << "initialised from " << cfg.init_from << "\n";
    } else {
      model.init_weights(t.seed);
    }
  }
  result.first_step = step;

  // MFU against the device's peak of the arithmetic the run's GEMMs use (Backend::peak: on a CPU
  // the bf16 matrix peak for a bf16 run, the fp32 FMA peak otherwise; on a GPU its datasheet
  // peak). HFU counts the FLOPs recomputation adds as well, against the same peak.
  const bool bf16_run = precision == backend::Precision::BF16;
  std::string peak_name =
      std::string(bf16_run ? "bf16 matrix peak" : "fp32 FMA peak") + " (given)";
  double peak_gflops = opt.peak_gflops;
  if (peak_gflops <= 0) {
    const backend::DevicePeak pk = device->peak(precision, 0);
    peak_gflops = pk.gflops;
    peak_name = pk.name;
  }
  const double flops_tok = flops_per_token(cfg.model, T);
  const double hw_flops_tok = flops_tok + recompute_flops_per_token(cfg.model, T, t.recompute);
  const bool report_hfu = t.recompute != "none";
  const int64_t tokens_per_step = int64_t(t.micro_batch) * T * t.grad_accum;
  if (!opt.quiet) {
    out << "model: " << family_name(cfg.model.family) << " " << cfg.model_name << ", "
        << table.total << " parameters; batch " << t.grad_accum << " x " << t.micro_batch << " x "
        << T << " = " << tokens_per_step << " tokens/step; " << world << " rank(s) x "
        << omp_get_max_threads() << " threads; MFU baseline: " << peak_name << " "
        << std::fixed << std::setprecision(0) << peak_gflops << " GFLOP/s per rank\n"
        << std::defaultfloat;
    if (world > 1) out << model.overlap().summary() << "\n";
    if (t.device != "cpu") out << "device: " << device->description() << "\n";
    // After the model is made: its device registered with the groups (the staging is known).
    out << "comm: " << model_groups.transport_summary() << " (" << comm_why << ")\n";
  }
  // Which rank holds what: one line per rank, in rank order.
  for (int r = 0; r < world; ++r) {
    if (r == groups.world.rank() && !opt.quiet)
      log_stream << groups.summary() << "; " << model.num_local_params() << " of " << table.total
                 << " parameters, " << B << " of " << t.micro_batch << " sequences per micro-batch"
                 << "; memory: state " << std::fixed << std::setprecision(2)
                 << double(model.state_bytes()) / (1 << 20) << " MiB (parallel.zero = " << cfg.zero
                 << "), activations " << double(model.activation_bytes()) / (1 << 20)
                 << " MiB (train.recompute = " << t.recompute << "; none: "
                 << double(model.activation_bytes(parallel::Recompute::None)) / (1 << 20)
                 << " MiB, saved " << double(model.activation_bytes(parallel::Recompute::None) -
                                             model.activation_bytes()) / (1 << 20)
                 << " MiB)" << std::defaultfloat << std::endl;
    if (world > 1) groups.world.barrier();
  }

  // metrics.jsonl is appended to, never truncated (--overwrite deleted it first): each start
  // writes an "event": "start" line with the step it starts from, so a reader (report) drops the
  // lines of an abandoned timeline after that step.
  std::ofstream metrics;
  const std::string metrics_path = cfg.run_dir + "/metrics.jsonl";
  auto check_metrics = [&] {
    if (!metrics)
      fail("cannot write '", metrics_path, "' (is the disk full?); the last checkpoint (",
           result.last_checkpoint.empty() ? "none written by this run" : result.last_checkpoint,
           ") is intact");
  };
  if (root) {
    metrics.open(metrics_path, std::ios::app);
    metrics << nlohmann::json{{"event", "start"}, {"step", step}, {"resumed", loaded},
                              {"max_steps", t.max_steps}}.dump()
            << "\n";
    metrics.flush();
    check_metrics();
  }
  std::vector<int32_t> inputs(size_t(t.grad_accum) * B * T), targets(inputs.size());

  // Checkpoints: every rank writes its own shards (sharded.hpp), on a background thread from a
  // snapshot unless train.async_checkpoint is off; the checkpoint becomes visible once every
  // rank's file is on disk (ShardedSaver::poll, once per step while a save is pending).
  ShardedSaver::Options so;
  so.run_dir = cfg.run_dir;
  so.tokenizer_path = data.tokenizer_path;
  so.keep_last = t.keep_checkpoints;
  so.async = t.async_checkpoint;
  ShardedSaver saver(groups.world, so);
  auto report_save = [&] {
    result.last_checkpoint = saver.last_dir();
    const SaveTimings& st = saver.last_timings();
    result.checkpoint_blocked_s += st.blocked_s;
    if (!opt.quiet)
      out << "checkpoint " << saver.last_dir() << ": " << std::fixed << std::setprecision(2)
          << double(st.bytes) / 1e6 << " MB by " << world << " rank(s); rank 0 wrote its shard in "
          << std::setprecision(3) << st.write_s << " s" << (t.async_checkpoint ? " in the background" : "")
          << ", visible after " << st.total_s << " s; training blocked " << st.blocked_s
          << " s (snapshot " << st.snapshot_s << " s, completion " << st.commit_s << " s)\n"
          << std::defaultfloat;
  };
  Watchdog watchdog(t.step_timeout, groups.world.rank());
  const bool streamed_save = cfg.zero >= 1;  // see save() below
  auto save = [&](int64_t at_step, bool wait) {
    // Never replace a good checkpoint with weights that are no longer finite.
    double sq = sum_squares(model.param_data(), model.num_local_params(), *device);
    if (world > 1) groups.world.allreduce_sum(&sq, 1);
    if (!std::isfinite(sq)) {
      out << "not writing a checkpoint at step " << at_step << ": the weights are not finite\n";
      return;
    }
    watchdog.arm(at_step, "checkpoint");
    const LossRecord lr_rec = loss_record(result.losses, best_loss, cfg.model.vocab_size);
    nlohmann::json health = nlohmann::json::object();
    if (lr_rec.known) {
      health["loss"] = std::isfinite(lr_rec.loss) ? nlohmann::json(lr_rec.loss) : nlohmann::json(nullptr);
      health["healthy"] = lr_rec.healthy;
      if (lr_rec.healthy) best_loss = std::min(best_loss, lr_rec.loss);
    }
    if (std::isfinite(best_loss)) health["best_loss"] = best_loss;
    if (saver.pending()) {  // the previous one is still being written: wait for it
      saver.finish();
      report_save();
    }
    if (streamed_save) {
      // ZeRO >= 1 (Adam moments in D pieces): the sharded format writes every rank's local
      // buffers as laid out by the shard plan, which the pieces do not match, so these save
      // streamed one tensor at a time (synchronously): rank 0 writes, every rank takes part in
      // each tensor's gather, in the writer's order (params, then m, then v, each in table
      // order). (A pipeline grid saves sharded: each stage writes the layers it stores.)
      const auto t0 = std::chrono::steady_clock::now();
      auto gather = [&model](const float* local) {
        return [&model, local](size_t i, float* out) { model.gather_tensor(local, i, out); };
      };
      auto gather_state = [&model](const float* local) {
        return [&model, local](size_t i, float* out) { model.gather_state_tensor(local, i, out); };
      };
      if (root) {
        const auto ls = train_loader.state();
        nlohmann::json info = {{"data_epoch", ls.epoch}, {"data_cursor", ls.cursor},
                               {"tokens_seen", at_step * tokens_per_step},
                               {"grid", shape.to_string()}, {"config", to_toml(cfg)}};
        info.update(health);
        CheckpointOptions co;
        co.tokenizer_path = data.tokenizer_path;
        co.keep_last = t.keep_checkpoints;
        result.last_checkpoint = save_run_checkpoint_streamed(
            cfg.run_dir, cfg.model, table, gather(model.param_data()), gather_state(adam.m()),
            gather_state(adam.v()), at_step, {}, info, co);
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!opt.quiet) out << "checkpoint " << result.last_checkpoint << " (" << std::fixed
                            << std::setprecision(2) << dt << " s)\n" << std::defaultfloat;
      } else {
        std::vector<float> tensor;
        for (size_t i = 0; i < table.specs.size(); ++i) {
          tensor.resize(size_t(table.specs[i].numel));
          model.gather_tensor(model.param_data(), i, tensor.data());
        }
        for (const float* local : {(const float*)adam.m(), (const float*)adam.v()})
          for (size_t i = 0; i < table.specs.size(); ++i) {
            tensor.resize(size_t(table.specs[i].numel));
            model.gather_state_tensor(local, i, tensor.data());
          }
      }
      if (world > 1) groups.world.barrier();  // the checkpoint is complete before anyone goes on
      return;
    }
    ShardedCheckpointInfo info;
    info.step = at_step;
    info.virtual_stages = cfg.virtual_stages;  // which layers each pipeline stage stores
    info.pipeline_layers = model.layer_split().counts();
    info.tokenizer_identity = data.tokenizer_identity;
    // The loader's position is the job's position in the global window stream (the same on
    // every replica); replica r's next window is stream position cursor + r (data/loader.hpp).
    const auto ls = train_loader.state();
    nlohmann::json next = nlohmann::json::array();
    for (int r = 0; r < replicas; ++r) next.push_back(ls.cursor + uint64_t(r));
    info.data = {{"epoch", ls.epoch}, {"cursor", ls.cursor}, {"replicas", replicas},
                 {"micro_batch", t.micro_batch}, {"seq_len", T}, {"grad_accum", t.grad_accum},
                 {"replica_next_position", next}, {"seed", t.seed}};
    // The loop keeps no random generator state: data order and loss masks are functions of
    // (seed, epoch, step), so the seed is the whole random state.
    info.rng = {{"seed", t.seed}, {"generators", nlohmann::json::array()}};
    info.extra = {{"tokens_seen", at_step * tokens_per_step}, {"grid", shape.to_string()},
                  {"config", to_toml(cfg)},
                  {"gemm_layouts", model.gemm_layout_plan().to_string()},
                  {"gemm_layouts_source", model.gemm_layout_plan().source}};
    info.extra.update(health);
    if (host_memory) {
      saver.begin(cfg.model, table, model.plan(), model.param_data(), adam.m(), adam.v(), info);
    } else {  // the snapshot is taken from host copies (pinned memory on a GPU)
      const size_t np = size_t(model.num_local_params());
      const backend::DeviceArray<float> hp = to_host(model.param_data(), np),
                                        hm = to_host(adam.m(), np), hv = to_host(adam.v(), np);
      saver.begin(cfg.model, table, model.plan(), hp.data(), hm.data(), hv.data(), info);
    }
    if (wait || !t.async_checkpoint) {
      saver.finish();
      report_save();
    }
  };
  auto poll_save = [&] {
    if (saver.pending() && saver.poll()) report_save();
  };

  auto validate = [&](int64_t at_step) {
    data::DataLoader val(cfg.data_dir, "val", B, T, slot, replicas, t.seed, val_opt);
    double sums[2] = {0, 0};
    std::vector<int32_t> vi(size_t(B) * T), vt(vi.size());
    for (int i = 0; i < t.eval_batches; ++i) {
      val.next_batch(vi.data(), vt.data());
      sums[0] += pipe ? pipe->forward_loss(vi.data(), vt.data(), B, T)
                      : model.forward_loss(vi.data(), vt.data(), B, T);
      for (int32_t y : vt) sums[1] += y >= 0;
    }
    if (groups.tokens().size() > 1) groups.tokens().allreduce_sum(sums, 2);
    if (pipe) groups.p().allreduce_sum(sums, 1);  // the loss is on the last stage
    const double vl = sums[0] / std::max(sums[1], 1.0);
    result.val_losses.push_back(vl);
    if (root) {
      metrics << nlohmann::json{{"step", at_step}, {"val_loss", vl}}.dump() << "\n";
      metrics.flush();
      check_metrics();
    }
    if (!opt.quiet) out << "step " << at_step << " | val loss " << std::fixed
                        << std::setprecision(4) << vl << std::defaultfloat << "\n";
  };

  const LossMask loss_mask{parse_loss_mask(t.loss_mask), t.goldfish_k, t.goldfish_h, t.seed};
  if (loss_mask.mode != LossMaskMode::None && !opt.quiet)
    out << "loss mask: " << t.loss_mask << " (k = " << t.goldfish_k
        << (loss_mask.mode == LossMaskMode::Goldfish ? ", h = " + std::to_string(t.goldfish_h) : std::string())
        << "): about 1 in " << t.goldfish_k << " targets dropped from the loss\n";
  if (!opt.quiet) {
    const std::string attn_path = &model.compute_backend() == &backend::cpu_backend()
                                      ? " (" + backend::cpu_backend().bf16_status().attention_path + ")"
                                      : std::string();
    if (precision == backend::Precision::BF16)
      out << "precision: bf16 GEMMs, fp32 master weights and optimizer; "
          << device->capabilities().gemm_bf16_path
          << (t.precision == "auto" ? " (auto: " + precision_choice.why + ")" : "")
          << "; attention "
          << (model.attention_precision() == backend::Precision::BF16
                  ? "bf16 products" + attn_path
                  : std::string("fp32"))
          << (t.attention_precision == "auto" ? " (auto)" : "") << "\n";
    else if (model.attention_precision() == backend::Precision::BF16)
      out << "precision: fp32 GEMMs; attention bf16 products" << attn_path << "\n";
    else if (t.precision == "auto")
      out << "precision: fp32 (auto: " << precision_choice.why << ")\n";
    if (precision == backend::Precision::BF16)
      out << model.gemm_layout_summary() << " [train.gemm_layouts = "
          << (popt.gemm_layout_plan.empty() ? t.gemm_layouts : std::string("<plan>")) << ": "
          << layouts_why << "]"
          << (layouts_resumed.empty() ? std::string() : "; on resume: " + layouts_resumed) << "\n";
  }
  // SIGINT/SIGTERM end the run with a final checkpoint (a scheduler's SIGTERM before the
  // wall-clock limit loses no work). The handler never runs on this thread or its OpenMP team:
  // a signal taken inside oneDNN's GEMM corrupts the heap (core/signals.hpp).
  // Under Open MPI, a SIGCONT reaching a running rank is mpirun's first notice that it is ending
  // the job (core/signals.hpp): stopping then, not at its SIGTERM, doubles the time to save.
  StopSignals signals(std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr);
  // Under Open MPI's mpirun, Ctrl-C / SIGTERM to mpirun reaches the ranks as SIGCONT, then
  // SIGTERM odls_base_sigkill_timeout seconds later, then SIGKILL as long again (default 1 s:
  // 2 s from the notice to the kill, too short for a final checkpoint of most models); SIGUSR1
  // is forwarded without a kill.
  if (root && !opt.quiet && std::getenv("OMPI_COMM_WORLD_SIZE")) {
    const char* g = std::getenv("OMPI_MCA_odls_base_sigkill_timeout");
    const int grace = g ? std::atoi(g) : 1;
    if (grace < 10)
      out << "note: Ctrl-C or SIGTERM to mpirun gives the ranks " << 2 * grace
          << " s from its first notice to its SIGKILL (twice Open MPI's odls_base_sigkill_timeout), which may "
             "not be enough for the final checkpoint: launch with `mpirun --mca "
             "odls_base_sigkill_timeout 30 ...`, or stop with `kill -USR1 <mpirun pid>` (forwarded "
             "to every rank without a kill; docs/checkpoints.md, \"Stopping a run\")\n";
  }
  const auto run_start = std::chrono::steady_clock::now();
  const int64_t start_step = step;
  // The timeline skips the first step (one-off allocation and warm-up) when the run is longer.
  const int64_t trace_from = start_step + (t.max_steps - start_step > opt.trace_steps ? 1 : 0);
  // Test hook (tests/mpi/watchdog.sh): TETRAD_TEST_STALL_AT=RANK:STEP makes that rank hang in
  // that step, as a stuck kernel or file system would.
  int stall_rank = -1;
  int64_t stall_step = -1;
  if (const char* e = std::getenv("TETRAD_TEST_STALL_AT"))
    if (std::sscanf(e, "%d:%lld", &stall_rank, reinterpret_cast<long long*>(&stall_step)) != 2)
      stall_rank = -1;
  for (; step < t.max_steps; ++step) {
    prof.clear();
    if (prof.trace) {
      const bool rec = step >= trace_from && step < trace_from + opt.trace_steps;
      if (rec && !trace_log.recording && world > 1) groups.world.barrier();  // align the ranks' clocks
      if (rec && !trace_log.recording) trace_log.origin = std::chrono::steady_clock::now();
      trace_log.recording = rec;
    }
    const auto t0 = std::chrono::steady_clock::now();
    watchdog.arm(step + 1, "a training step");
    if (groups.world.rank() == stall_rank && step + 1 == stall_step)
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    runner.wait_for_slowest_rank();
    double counts[2] = {0, 0};  // kept targets, dropped by the loss mask
    {
      ScopedPhase sp(&prof, Phase::Data);
      // All micro-batches of the step first, so the loss normaliser (kept targets over the whole
      // global batch) is known before any backward.
      for (int m = 0; m < t.grad_accum; ++m)
        train_loader.next_batch(inputs.data() + size_t(m) * B * T, targets.data() + size_t(m) * B * T);
      for (int m = 0; m < t.grad_accum; ++m)
        counts[1] += double(apply_loss_mask(loss_mask, targets.data() + size_t(m) * B * T, B, T,
                                            step, m, replicas, slot));
      for (int32_t y : targets) counts[0] += y >= 0;
    }
    runner.sum_over_replicas(counts, 2);
    const double kept = std::max(counts[0], 1.0);
    const double drop_fraction = counts[1] / (counts[0] + counts[1]);
    const double lr = learning_rate(t, step);
    const StepResult sr = runner.run(inputs.data(), targets.data(), kept, lr, step);
    const double loss = sr.loss, gnorm = sr.grad_norm;
    if (sr.verdict != StepVerdict::Apply) {
      result.losses.push_back(loss);
      out << "step " << step + 1 << ": non-finite " << (std::isfinite(loss) ? "gradient" : "loss")
          << " (loss " << loss << ", grad norm " << gnorm << "); step skipped (" << sr.bad_steps
          << " in a row, limit train.max_bad_steps = " << t.max_bad_steps << ")\n";
      if (root) {
        metrics << nlohmann::json{{"step", step + 1}, {"skipped", true}}.dump() << "\n";
        metrics.flush();
        check_metrics();
      }
      if (sr.verdict == StepVerdict::Stop)
        fail("stopping: ", sr.bad_steps, " consecutive non-finite steps; the last good checkpoint (",
             result.last_checkpoint.empty() ? "none written this run" : result.last_checkpoint,
             ") is intact. Lower train.lr or check the data.");
      continue;
    }
    result.losses.push_back(loss);

    const auto t1 = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(t1 - t0).count();
    StepBreakdown bd;
    bd.step = dt;
    bd.compute = prof.compute();
    bd.comm_exposed = prof.seconds[size_t(Phase::Comm)];
    bd.wait = prof.seconds[size_t(Phase::Wait)];
    bd.optimizer = prof.seconds[size_t(Phase::Optimizer)];
    bd.data = prof.seconds[size_t(Phase::Data)];
    bd.comm_issued = prof.comm_issued_s;
    result.breakdowns.push_back(bd);
    const double elapsed = std::chrono::duration<double>(t1 - run_start).count();
    const double tokens_per_s = double(tokens_per_step) / dt;
    const double mfu = flops_tok * tokens_per_s / (peak_gflops * 1e9 * world);
    const double hfu = hw_flops_tok * tokens_per_s / (peak_gflops * 1e9 * world);
    const int64_t done = step + 1;
    const double eta = elapsed / double(done - start_step) * double(t.max_steps - done);
    if (root) {
      nlohmann::json line{{"step", done}, {"loss", loss}, {"lr", lr}, {"grad_norm", gnorm},
                                {"tokens_per_s", tokens_per_s}, {"mfu", mfu},
                                {"mfu_peak", peak_name}, {"mfu_peak_gflops", peak_gflops},
                                {"step_time_s", dt}, {"elapsed_s", elapsed},
                                {"dropped_fraction", drop_fraction},
                                {"t_compute_s", bd.compute}, {"t_comm_exposed_s", bd.comm_exposed},
                                {"t_wait_s", bd.wait}, {"t_optimizer_s", bd.optimizer},
                                {"t_data_s", bd.data}, {"t_comm_issued_s", bd.comm_issued},
                                {"comm_hidden_fraction", bd.hidden_fraction()}};
      if (report_hfu) line["hfu"] = hfu;  // hardware FLOPs (with recomputation) / the same peak
      metrics << line.dump() << "\n";
      metrics.flush();
      check_metrics();
    }
    if (!opt.quiet && (done % t.log_interval == 0 || done == t.max_steps || done == start_step + 1)) {
      out << "step " << std::setw(5) << done << "/" << t.max_steps << " | loss " << std::fixed
          << std::setprecision(4) << loss << " | lr " << std::scientific << std::setprecision(2)
          << lr << " | gnorm " << std::fixed << std::setprecision(3) << gnorm << " | "
          << std::setprecision(0) << tokens_per_s << " tok/s | MFU " << std::setprecision(1)
          << 100 * mfu << "%"
          << (report_hfu ? " | HFU " + fixed1(100 * hfu) + "%" : std::string()) << " | "
          << format_duration(elapsed) << " elapsed, ETA "
          << format_duration(eta)
          << (loss_mask.mode != LossMaskMode::None
                  ? " | dropped " + std::to_string(int(100 * drop_fraction + 0.5)) + "%"
                  : std::string())
          << std::defaultfloat << std::endl;
      auto pct = [&](double s) { return std::to_string(int(100 * s / dt + 0.5)) + "%"; };
      out << "           time: compute " << pct(bd.compute) << " | comm exposed "
          << pct(bd.comm_exposed) << " (" << int(100 * bd.hidden_fraction() + 0.5)
          << "% of comm hidden) | wait " << pct(bd.wait) << " | optimizer " << pct(bd.optimizer)
          << " | data " << pct(bd.data) << std::endl;
    }
    poll_save();
    if (t.eval_interval > 0 && done % t.eval_interval == 0) {
      watchdog.arm(done, "validation");
      validate(done);
    }
    if (t.checkpoint_interval > 0 && done % t.checkpoint_interval == 0 && done < t.max_steps)
      save(done, /*wait=*/false);
    // Every rank stops at the same step: the signal may reach ranks at different times.
    int sig = StopSignals::received();
    if (world > 1) groups.world.allreduce_max(&sig, 1);
    if (sig) {
      out << "received "
          << (sig == SIGTERM   ? "SIGTERM"
              : sig == SIGUSR1 ? "SIGUSR1"
              : sig == SIGCONT ? "SIGCONT from mpirun (it is ending the job; SIGTERM and SIGKILL follow)"
                               : "SIGINT")
          << ": writing a final checkpoint and stopping at step " << done << "\n";
      result.stopped_by_signal = true;
      ++step;
      break;
    }
  }
  result.steps_done = step;
  model.set_profile(nullptr);
  if (!opt.trace_path.empty()) {
    trace_log.recording = false;
    parallel::write_trace(groups.world, trace_log, opt.trace_path);
    if (!opt.quiet) out << "trace: " << opt.trace_path << " (open in https://ui.perfetto.dev)\n";
  }
  watchdog.arm(step, "validation");
  if (t.eval_interval > 0 && step % t.eval_interval != 0 && !result.stopped_by_signal) validate(step);
  save(step, /*wait=*/true);
  model.finish_communication();  // the next step's prefetched gathers: none is left pending
  watchdog.disarm();
  return result;
}

}  // namespace tetrad

namespace tetrad {

double evaluate_checkpoint(const std::string& model_dir, const std::string& data_dir,
                           const std::string& split, int micro_batch, int seq_len, int batches,
                           std::ostream& out, const std::string& grid) {
  const ModelConfig mc = read_hf_config(model_dir);
  const int T = seq_len > 0 ? seq_len : mc.max_seq;
  const DataInfo data = read_data_info(data_dir, mc);
  if (const std::string tok = data::find_tokenizer_file(model_dir); !tok.empty()) {
    const uint64_t id = hash_file(tok);
    if (id != data.tokenizer_identity)
      fail("model '", model_dir, "' was trained with tokenizer ", hex64(id), " but the shards in '",
           data_dir, "' were made with tokenizer ", hex64(data.tokenizer_identity));
  }
  // The one model on the grid ("1,1,1,1": this process alone, each rank of an mpirun by itself).
  InferenceModel im = load_inference_model(model_dir, mc, grid, micro_batch, T);
  parallel::ParallelTransformer& model = *im.model;
  const parallel::ProcessGroups& g = *im.groups;
  data::LoaderOptions lopt;
  lopt.tokenizer_identity = data.tokenizer_identity;
  lopt.model_vocab = mc.vocab_size;
  lopt.shuffle = false;
  data::DataLoader loader(data_dir, split, micro_batch, T, 0, 1, 0, lopt);
  // Every rank reads every micro-batch and evaluates those of its Z x D slot; in the last round
  // a slot without one repeats the round's first and drops its loss, so that every rank makes
  // the same collective calls.
  const int slots = token_slots(g.shape);
  const int slot = token_slot(g.coord, g.shape);
  const size_t n = size_t(micro_batch) * T;
  std::vector<int32_t> x(n), y(n), other_x(n), other_y(n);
  double sum = 0;
  const int64_t count = int64_t(batches) * micro_batch * T;
  for (int round = 0; round * slots < batches; ++round) {
    const bool mine = round * slots + slot < batches;
    for (int s = 0; s < slots && round * slots + s < batches; ++s) {
      if (s == slot || s == 0) loader.next_batch(x.data(), y.data());  // slot 0's, then ours
      else loader.next_batch(other_x.data(), other_y.data());
    }
    const double loss = model.forward_loss(x.data(), y.data(), micro_batch, T);
    if (mine) sum += loss;
  }
  // A slot's loss is the same on its X x Y ranks: the whole sum is the sum over Z x D.
  if (g.tokens().size() > 1) g.tokens().allreduce_sum(&sum, 1);
  out << "evaluated " << count << " tokens of " << data_dir << " (" << split << ") with "
      << model_dir << "\n";
  return sum / double(count);
}

}  // namespace tetrad
