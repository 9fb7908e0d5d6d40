#include "tetrad/train/checkpointer.hpp"

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "tetrad/checkpoint/atomic_file.hpp"
#include "tetrad/checkpoint/finite_weights.hpp"
#include "tetrad/checkpoint/hf.hpp"
#include "tetrad/checkpoint/run_checkpoint.hpp"
#include "tetrad/checkpoint/sharded.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/hash.hpp"
#include "tetrad/data/tokenizer.hpp"

namespace fs = std::filesystem;

namespace tetrad {

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

nlohmann::json health_record(const std::vector<double>& losses, double& best, int vocab) {
  const LossRecord rec = loss_record(losses, best, vocab);
  nlohmann::json health = nlohmann::json::object();
  if (rec.known) {
    health["loss"] = std::isfinite(rec.loss) ? nlohmann::json(rec.loss) : nlohmann::json(nullptr);
    health["healthy"] = rec.healthy;
    if (rec.healthy) best = std::min(best, rec.loss);
  }
  if (std::isfinite(best)) health["best_loss"] = best;
  return health;
}

namespace {

ShardedSaver::Options saver_options(const RunConfig& cfg, const DataInfo& data) {
  ShardedSaver::Options so;
  so.run_dir = cfg.run_dir;
  so.tokenizer_path = data.tokenizer_path;
  so.keep_last = cfg.train.keep_checkpoints;
  so.async = cfg.train.async_checkpoint;
  return so;
}

}  // namespace

Checkpointer::Checkpointer(const Parts& parts)
    : p_(parts), saver_(parts.world, saver_options(parts.cfg, parts.data.info())) {}

// Host copies of device memory (not on the CPU backend, whose memory is host memory).
void Checkpointer::to_device(float* dev, const float* host, size_t n) {
  if (n) p_.device.queue().copy_to_device(dev, host, n * sizeof(float));
  p_.device.queue().synchronize();
}

// ---- resume or initialise ------------------------------------------------------------------

Checkpointer::Start Checkpointer::resume_or_init(bool resume, bool allow_data_change) {
  Start s;
  if (resume) {
    // Rank 0 lists the usable checkpoints (latest first, cleaning up after an interrupted save)
    // and offers them one at a time; every rank loads its part of the offered one (sharded:
    // only the chunks it needs, each checksum-verified). If any rank fails (a damaged chunk, a
    // mismatching config), all agree to refuse it and go on to the previous one.
    const bool root = p_.world.rank() == 0;
    const std::string& run_dir = p_.cfg.run_dir;
    std::vector<FoundCheckpoint> candidates;
    if (root) {
      std::ostringstream why;
      candidates = resume_candidates(run_dir, why);
      p_.out << why.str();
    }
    std::string last_error;
    for (size_t k = 0;; ++k) {
      int64_t chosen = root && k < candidates.size() ? candidates[k].step : -1;
      if (p_.world.size() > 1) p_.world.broadcast(&chosen, 1, 0);
      if (chosen < 0) {
        if (k == 0) {
          p_.out << "resume: no checkpoint in " << run_dir << "/checkpoints; starting from scratch\n";
          break;
        }
        fail("resume: no checkpoint in ", run_dir, "/checkpoints could be loaded",
             last_error.empty() ? std::string() : "; the last error: " + last_error);
      }
      const std::string dir = run_dir + "/checkpoints/" + checkpoint_folder_name(chosen);
      int failed = 0;  // 1: this checkpoint is unusable; 2: the run's data changed (all are)
      std::string error;
      try {
        if (is_sharded_checkpoint(dir)) load_sharded(dir, s, allow_data_change);
        else load_legacy(dir, s, allow_data_change);
      } catch (const DataChangeRefused& e) {
        failed = 2;
        error = e.what();
      } catch (const Error& e) {
        failed = 1;
        error = e.what();
      }
      if (p_.world.size() > 1) p_.world.allreduce_max(&failed, 1);
      if (failed == 2)
        fail(error.empty() ? "resume refused by another rank: the data changed (see its message)"
                           : error);
      if (!failed) {
        s.loaded = true;
        s.resumed_from = dir;
        p_.out << "resumed from " << dir << " at step " << s.step << "\n";
        say_unchecked(dir, s.data_unchecked);
        break;
      }
      if (!error.empty()) {
        last_error = error;
        std::cerr << "tetrad: rank " << p_.world.rank() << ": checkpoint " << dir
                  << " refused: " << error << std::endl;
      }
      p_.out << "resume: " << dir << " refused" << (error.empty() ? " by another rank (see its message)" : "")
             << "; trying the previous checkpoint\n";
    }
  }
  if (!s.loaded) init_fresh();
  return s;
}

// The sharded format: the files hold the moments laid out like the parameters; with ZeRO this
// rank keeps its D piece of each tensor (optimizer_layout()). On a device the files are read
// into host memory and copied over.
void Checkpointer::load_sharded(const std::string& dir, Start& s, bool allow_data_change) {
  // The data settings first, before any weight is read (a damaged meta.json: the load reports it).
  nlohmann::json meta;
  try {
    meta = read_sharded_meta(dir);
  } catch (const Error&) {
  }
  if (meta.is_object()) {
    uint64_t tokenizer = 0;
    if (meta.contains("tokenizer_identity") && meta["tokenizer_identity"].is_string())
      tokenizer = std::strtoull(meta["tokenizer_identity"].get<std::string>().c_str(), nullptr, 16);
    nlohmann::json data = meta.value("data", nlohmann::json::object());
    // A record from before the seed was kept: the seed of the run folder's config.toml.
    const std::string run_config = p_.cfg.run_dir + "/config.toml";
    if (data.is_object() && !data.empty() && !data.contains("seed") && fs::is_regular_file(run_config))
      try {
        TrainingData::complete_from_config(data, read_small_file(run_config), "as in " + run_config);
      } catch (const Error&) {
      }
    s.data_unchecked.clear();
    s.data_changes = p_.data.check_continuity(data, tokenizer, dir, allow_data_change,
                                              &s.data_unchecked);
    for (const std::string& c : s.data_changes)
      p_.out << "resume: continuing with a change (--allow-data-change): " << c << "\n";
  }
  parallel::ParallelTransformer& model = p_.model;
  AdamW& adam = p_.adam;
  const parallel::OptimizerLayout& ol = model.optimizer_layout();
  const bool host_memory = p_.device.capabilities().host_visible;
  const bool pieces = p_.cfg.zero >= 1;
  const size_t np = size_t(model.num_local_params());
  std::vector<float> m_full(pieces || !host_memory ? np : 0), v_full(m_full.size()),
      p_host(host_memory ? 0 : np);
  const ShardedCheckpointInfo info = load_sharded_checkpoint(
      dir, p_.cfg.model, p_.data.info().tokenizer_identity, model.plan(),
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
  s.step = info.step;
  restore_records(info.extra, s);
  p_.data.restore(info.data, dir);
}

// The previous format (one HF folder + trainer_state.bin), tensor by tensor.
void Checkpointer::load_legacy(const std::string& dir, Start& s, bool allow_data_change) {
  parallel::ParallelTransformer& model = p_.model;
  auto keep = [&](float* local) {
    return [&model, local](size_t i, const float* d) { model.scatter_tensor(local, i, d); };
  };
  auto keep_state = [&](float* local) {
    return [&model, local](size_t i, const float* d) { model.scatter_state_tensor(local, i, d); };
  };
  // The data settings first, before any weight is read, as for the sharded format: the record
  // it keeps, or what an older one holds (the configuration it recorded; the tokenizer it
  // carries).
  const nlohmann::json data = TrainingData::legacy_record(verify_trainer_state(dir + "/trainer_state.bin").info);
  if (!data.contains("epoch") || !data.contains("cursor"))
    fail("checkpoint '", dir, "' lacks the data position (data_epoch, data_cursor)");
  const std::string tok = dir + "/tokenizer.model";
  s.data_unchecked.clear();
  s.data_changes = p_.data.check_continuity(data, fs::is_regular_file(tok) ? hash_file(tok) : 0, dir,
                                            allow_data_change, &s.data_unchecked);
  for (const std::string& c : s.data_changes)
    p_.out << "resume: continuing with a change (--allow-data-change): " << c << "\n";
  TrainerState st = load_run_checkpoint_streamed(dir, p_.cfg.model, model.table(),
                                                 keep(model.params()), keep_state(p_.adam.m()),
                                                 keep_state(p_.adam.v()));
  s.step = st.step;
  if (st.info.is_object() && st.info.contains("best_loss") && st.info["best_loss"].is_number())
    best_loss_ = st.info["best_loss"].get<double>();
  p_.data.restore(data, dir);
}

// What a checkpoint from an older tetrad does not record cannot be compared with this run: said
// once, after the load, rather than passed over.
void Checkpointer::say_unchecked(const std::string& dir, const std::vector<std::string>& what) {
  if (what.empty()) return;
  std::string list;
  for (size_t i = 0; i < what.size(); ++i) list += (i ? "; " : "") + what[i];
  p_.out << "resume: checkpoint " << dir << " was written by an older tetrad and does not record "
         << list << ": not compared with this run, which continues as configured (checkpoints "
            "from here on record them)\n";
}

// The best loss, and a tuned GEMM layout plan: the checkpoint's on resume (the same sums as the
// run that wrote it, so a resumed run is bit-identical to an uninterrupted one); re-tuned only
// where the local shapes changed (another grid or micro-batch). rule stays rule.
void Checkpointer::restore_records(const nlohmann::json& rec, Start& s) {
  if (rec.is_object() && rec.contains("best_loss") && rec["best_loss"].is_number())
    best_loss_ = rec["best_loss"].get<double>();
  if (p_.plan.model.gemm_layouts != parallel::GemmLayouts::Tune || !rec.is_object() ||
      !rec.contains("gemm_layouts") || !rec["gemm_layouts"].is_string())
    return;
  const std::string src = rec.value("gemm_layouts_source", std::string());
  if (src != "tuned" && src != "checkpoint") return;  // that run had no tuned plan
  const parallel::GemmLayoutPlan saved =
      parallel::GemmLayoutPlan::parse(rec["gemm_layouts"].get<std::string>(), "checkpoint");
  s.layouts_resumed = p_.model.set_gemm_layout_plan(saved)
                          ? "the checkpoint's"
                          : "re-tuned: the checkpoint's plan was for other shapes (" +
                                saved.to_string() + ")";
}

void Checkpointer::init_fresh() {
  const RunConfig& cfg = p_.cfg;
  parallel::ParallelTransformer& model = p_.model;
  if (cfg.init_from.empty()) {
    model.init_weights(cfg.train.seed);
    return;
  }
  // Fine-tuning: the data must be made with the model's own tokenizer.
  const uint64_t data_id = p_.data.info().tokenizer_identity;
  if (const std::string tok = data::find_tokenizer_file(cfg.init_from); !tok.empty()) {
    const uint64_t id = hash_file(tok);
    if (id != data_id)
      fail("run.init_from '", cfg.init_from, "' has tokenizer ", hex64(id), " (", tok,
           ") but the shards in '", cfg.data_dir, "' were made with tokenizer ", hex64(data_id),
           "; prepare the data with --tokenizer ", cfg.init_from);
  }
  // Weights that are not finite would train into NaN from the first step: refused by name (every
  // rank reads the whole tensor, so every rank refuses together).
  load_hf_params_streamed(cfg.init_from, cfg.model, model.table(),
                          [&](size_t i, const float* data) {
                            check_finite_weights("run.init_from '" + cfg.init_from + "'",
                                                 model.table().specs[i], data);
                            model.scatter_tensor(model.params(), i, data);
                          });
  p_.out << "initialised from " << cfg.init_from << "\n";
}

// ---- save ----------------------------------------------------------------------------------

void Checkpointer::report_save() {
  last_checkpoint_ = saver_.last_dir();
  const SaveTimings& st = saver_.last_timings();
  blocked_s_ += st.blocked_s;
  if (!p_.quiet)
    p_.out << "checkpoint " << saver_.last_dir() << ": " << std::fixed << std::setprecision(2)
           << double(st.bytes) / 1e6 << " MB by " << p_.world.size()
           << " rank(s); rank 0 wrote its shard in " << std::setprecision(3) << st.write_s << " s"
           << (p_.cfg.train.async_checkpoint ? " in the background" : "") << ", visible after "
           << st.total_s << " s; training blocked " << st.blocked_s << " s (snapshot "
           << st.snapshot_s << " s, completion " << st.commit_s << " s)\n"
           << std::defaultfloat;
}

void Checkpointer::poll() {
  if (saver_.pending() && saver_.poll()) report_save();
}

bool Checkpointer::save(int64_t step, bool wait, const std::vector<double>& losses) {
  // Never replace a good checkpoint with weights that are no longer finite.
  double sq = sum_squares(p_.model.param_data(), p_.model.num_local_params(), p_.device);
  if (p_.world.size() > 1) p_.world.allreduce_sum(&sq, 1);
  if (!std::isfinite(sq)) {
    if (saver_.pending()) {  // an earlier save of finite weights: committed, it is the latest
      saver_.finish();
      report_save();
    }
    p_.out << "not writing a checkpoint at step " << step << ": the weights are not finite\n";
    return false;
  }
  p_.watchdog.arm(step, "checkpoint");
  const nlohmann::json health = health_record(losses, best_loss_, p_.cfg.model.vocab_size);
  if (saver_.pending()) {  // the previous one is still being written: wait for it
    saver_.finish();
    report_save();
  }
  // ZeRO >= 1 (Adam moments in D pieces): the sharded format writes every rank's local buffers
  // as laid out by the shard plan, which the pieces do not match (see save_streamed).
  if (p_.cfg.zero >= 1) save_streamed(step, health);
  else save_sharded(step, wait, health);
  return true;
}

// These save streamed one tensor at a time (synchronously): rank 0 writes, every rank takes part
// in each tensor's gather, in the writer's order (params, then m, then v, each in table order).
// (A pipeline grid saves sharded: each stage writes the layers it stores.)
void Checkpointer::save_streamed(int64_t step, const nlohmann::json& health) {
  const RunConfig& cfg = p_.cfg;
  parallel::ParallelTransformer& model = p_.model;
  const ParamTable& table = model.table();
  const auto t0 = std::chrono::steady_clock::now();
  auto gather = [&model](const float* local) {
    return [&model, local](size_t i, float* out) { model.gather_tensor(local, i, out); };
  };
  auto gather_state = [&model](const float* local) {
    return [&model, local](size_t i, float* out) { model.gather_state_tensor(local, i, out); };
  };
  if (p_.world.rank() == 0) {
    const auto ls = p_.data.state();
    nlohmann::json info = {{"data_epoch", ls.epoch}, {"data_cursor", ls.cursor}, {"data", p_.data.position()},
                           {"tokens_seen", step * p_.plan.tokens_per_step},
                           {"grid", p_.plan.grid.to_string()}, {"config", to_toml(cfg)}};
    info.update(health);
    CheckpointOptions co;
    co.tokenizer_path = p_.data.info().tokenizer_path;
    co.keep_last = cfg.train.keep_checkpoints;
    last_checkpoint_ = save_run_checkpoint_streamed(
        cfg.run_dir, cfg.model, table, gather(model.param_data()), gather_state(p_.adam.m()),
        gather_state(p_.adam.v()), step, {}, info, co);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!p_.quiet) p_.out << "checkpoint " << last_checkpoint_ << " (" << std::fixed
                          << std::setprecision(2) << dt << " s)\n" << std::defaultfloat;
  } else {
    std::vector<float> tensor;
    for (size_t i = 0; i < table.specs.size(); ++i) {
      tensor.resize(size_t(table.specs[i].numel));
      model.gather_tensor(model.param_data(), i, tensor.data());
    }
    for (const float* local : {(const float*)p_.adam.m(), (const float*)p_.adam.v()})
      for (size_t i = 0; i < table.specs.size(); ++i) {
        tensor.resize(size_t(table.specs[i].numel));
        model.gather_state_tensor(local, i, tensor.data());
      }
  }
  if (p_.world.size() > 1) p_.world.barrier();  // the checkpoint is complete before anyone goes on
}

// Every rank writes its own shards (sharded.hpp), on a background thread from a snapshot unless
// train.async_checkpoint is off; the checkpoint becomes visible once every rank's file is on
// disk (ShardedSaver::poll, once per step while a save is pending).
void Checkpointer::save_sharded(int64_t step, bool wait, const nlohmann::json& health) {
  const RunConfig& cfg = p_.cfg;
  parallel::ParallelTransformer& model = p_.model;
  ShardedCheckpointInfo info;
  info.step = step;
  info.virtual_stages = cfg.virtual_stages;  // which layers each pipeline stage stores
  info.pipeline_layers = model.layer_split().counts();
  info.tokenizer_identity = p_.data.info().tokenizer_identity;
  info.data = p_.data.position();
  // The loop keeps no random generator state: data order and loss masks are functions of
  // (seed, epoch, step), so the seed is the whole random state.
  info.rng = {{"seed", cfg.train.seed}, {"generators", nlohmann::json::array()}};
  info.extra = {{"tokens_seen", step * p_.plan.tokens_per_step}, {"grid", p_.plan.grid.to_string()},
                {"config", to_toml(cfg)},
                {"gemm_layouts", model.gemm_layout_plan().to_string()},
                {"gemm_layouts_source", model.gemm_layout_plan().source}};
  info.extra.update(health);
  if (p_.device.capabilities().host_visible) {
    saver_.begin(cfg.model, model.table(), model.plan(), model.param_data(), p_.adam.m(),
                 p_.adam.v(), info);
  } else {  // the snapshot is taken from host copies (pinned memory on a GPU)
    const size_t np = size_t(model.num_local_params());
    auto to_host = [&](const float* dev) {
      backend::DeviceArray<float> h(p_.device, np, backend::MemoryKind::HostStaging);
      if (np) p_.device.queue().copy_to_host(h.data(), dev, np * sizeof(float));
      p_.device.queue().synchronize();
      return h;
    };
    const backend::DeviceArray<float> hp = to_host(model.param_data()), hm = to_host(p_.adam.m()),
                                      hv = to_host(p_.adam.v());
    saver_.begin(cfg.model, model.table(), model.plan(), hp.data(), hm.data(), hv.data(), info);
  }
  if (wait || !cfg.train.async_checkpoint) {
    saver_.finish();
    report_save();
  }
}

}  // namespace tetrad
