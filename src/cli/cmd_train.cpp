// `tetrad train`: train a model as the config says (train/trainer).
#include <cstdlib>
#include <iostream>
#include <memory>

#include "cli/command.hpp"
#include "tetrad/comm/mpi_env.hpp"
#include "tetrad/train/config.hpp"
#include "tetrad/train/trainer.hpp"

namespace tetrad::cli {

namespace {

struct Options {
  std::string config_path, device, grid;
  std::vector<std::string> overrides;
  TrainOptions topt;
};

Runner setup(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  sub.add_option("-c,--config", o->config_path, "TOML config (docs/config.md)");
  sub.add_option("-s,--set", o->overrides, "override: section.key=value (repeatable)");
  sub.add_flag("--resume", o->topt.resume, "continue from the latest good checkpoint");
  sub.add_flag("--overwrite", o->topt.overwrite,
               "run.dir already holds checkpoints: delete them and start afresh (without "
               "this or --resume such a folder is refused)");
  sub.add_flag("--allow-data-change", o->topt.allow_data_change,
               "with --resume: continue although train.seed or the training data differ from the "
               "checkpoint's (refused without it; recorded in metrics.jsonl; new data is read "
               "from its start)");
  sub.add_option("--device", o->device,
                 "where the model computes: cpu, cpu-strict, cuda, cuda:N (same as --set "
                 "train.device=...)");
  sub.add_option("--grid", o->grid,
                 "process grid x,y,z,d, x,y,z,p,d or named (d=2,x=2; axes not named are "
                 "1), or auto (same as --set parallel.grid=...); run under mpirun -n with "
                 "their product. Not given: 1,1,1,1 on one rank, auto on more");
  sub.add_option("--trace", o->topt.trace_path,
                 "write a Chrome trace-event JSON timeline (every rank's compute and "
                 "communication; open in https://ui.perfetto.dev)");
  sub.add_option("--trace-steps", o->topt.trace_steps, "steps on the timeline")
      ->capture_default_str();
  return [o](Context& ctx) {
    std::vector<std::string> overrides = o->overrides;
    if (!o->grid.empty()) overrides.push_back("parallel.grid=\"" + o->grid + "\"");
    if (!o->device.empty()) overrides.push_back("train.device=\"" + o->device + "\"");
    RunConfig cfg = load_run_config(o->config_path, overrides);
    // Test hook (tests/mpi/watchdog.sh): TETRAD_TEST_STALL_AT=RANK:STEP makes that rank hang in
    // that step, as a stuck kernel or file system would.
    TrainOptions topt = o->topt;
    if (const char* e = std::getenv("TETRAD_TEST_STALL_AT")) topt.step_hook = stall_hook(e);
    TrainResult r = train(cfg, topt, std::cout);
    if (!r.last_checkpoint.empty() && ctx.root())
      std::cout << (r.stopped_by_signal ? "stopped" : "done") << " at step " << r.steps_done
                << "; final checkpoint " << r.last_checkpoint << "\n";
  };
}

}  // namespace

const Command train_command{"train", "train a model as the config says", false, &setup};

}  // namespace tetrad::cli
