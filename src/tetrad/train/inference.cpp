#include "tetrad/train/inference.hpp"

#include "tetrad/checkpoint/hf.hpp"
#include "tetrad/comm/mpi_env.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/train/memory_check.hpp"

namespace tetrad {

int inference_world_size() {
  return comm::MpiEnvironment::is_initialized() ? comm::Communicator::world().size() : 1;
}

std::string inference_grid(const std::string& grid, int world_size, const char* command,
                           bool context) {
  const std::string g = grid.empty() ? "1,1,1," + std::to_string(world_size) : grid;
  const parallel::GridShape s = parallel::parse_grid(g);
  if (s.p() > 1)
    fail("grid '", g, "': a pipeline axis (Gp = ", s.p(), ") is not supported for inference; "
         "give x,y,z,d");
  if (s.c() > 1 && !context)
    fail("grid '", g, "': the context-parallel axis (c = ", s.c(), ") is not supported by `",
         command, "` (`eval` and `logits` run on c grids, where a whole sequence is cut into "
         "chunks; decoding adds one token at a time to a key/value cache, which has no sequence "
         "to cut over C); give x,y,z,d (e.g. --grid d=", s.size(), "), which reads a "
         "checkpoint of any training grid");
  if (s.e() > 1)
    fail("grid '", g, "': the expert-parallel fold (e = ", s.e(), ") is not supported by `",
         command, "` yet (the inference commands' ranks do not step together through every "
         "token's all-to-all); give x,y,z,d (e.g. --grid d=", s.size(), "), which reads a "
         "checkpoint of any training grid");
  return g;
}

InferenceModel load_inference_model(const std::string& dir, const ModelConfig& mc,
                                    const std::string& grid, int local_batch, int max_len) {
  InferenceModel m;
  m.grid = grid;
  const parallel::GridShape shape = parallel::parse_grid(grid);
  if (shape.size() == 1)  // one process, or each rank of an mpirun alone
    m.groups = std::make_unique<parallel::ProcessGroups>();
  else if (!comm::MpiEnvironment::is_initialized())
    fail("grid ", grid, " needs ", shape.size(), " ranks: run under mpirun -n ", shape.size());
  else
    m.groups = std::make_unique<parallel::ProcessGroups>(comm::Communicator::world(), shape);
  parallel::ParallelOptions po;
  po.precision = backend::Precision::FP32;
  // Forward only: no layer's activations need to outlive it (one layer's scratch, as full
  // recomputation lays them out; the forward computes the same values).
  po.recompute = parallel::Recompute::Full;
  check_inference_fits_host(mc, dir, "reading the model", shape, m.groups->coord, local_batch,
                            max_len, po);
  m.model = std::make_unique<parallel::ParallelTransformer>(mc, *m.groups, local_batch, max_len, po);
  parallel::ParallelTransformer& model = *m.model;
  load_hf_params_streamed(dir, mc, model.table(),
                          [&](size_t i, const float* data) { model.set_tensor(i, data); });
  return m;
}

}  // namespace tetrad
