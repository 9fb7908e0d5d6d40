#include "tetrad/train/evaluate.hpp"

#include <cstdint>
#include <ostream>
#include <vector>

#include "tetrad/checkpoint/hf.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/core/hash.hpp"
#include "tetrad/data/loader.hpp"
#include "tetrad/data/tokenizer.hpp"
#include "tetrad/parallel/context_split.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"
#include "tetrad/parallel/process_groups.hpp"
#include "tetrad/train/inference.hpp"
#include "tetrad/train/training_data.hpp"

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
  if (const int c = parallel::parse_grid(grid).c(); c > 1 && T % (2 * c) != 0)
    fail("eval on grid '", grid, "': the context axis cuts each sequence into 2 x c = ", 2 * c,
         " chunks, but the sequence length ", T, " is not divisible by ", 2 * c, " (give --seq-len ",
         "a multiple of ", 2 * c, ", e.g. ", T / (2 * c) * 2 * c > 0 ? T / (2 * c) * 2 * c : 2 * c,
         ", or another c)");
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
  // A context axis: each rank evaluates its two chunks of every sequence (ContextSplit::take),
  // the losses summed over C with those of Z x D (tokens()).
  const parallel::ContextSplit cs = parallel::ContextSplit::of(g.shape, g.coord);
  const int Tl = cs.local_len(T);
  std::vector<int32_t> xl(cs.active() ? size_t(micro_batch) * Tl : 0), yl(xl.size());
  double sum = 0;
  const int64_t count = int64_t(batches) * micro_batch * T;
  for (int round = 0; round * slots < batches; ++round) {
    const bool mine = round * slots + slot < batches;
    for (int s = 0; s < slots && round * slots + s < batches; ++s) {
      if (s == slot || s == 0) loader.next_batch(x.data(), y.data());  // slot 0's, then ours
      else loader.next_batch(other_x.data(), other_y.data());
    }
    if (cs.active()) {
      cs.take(x.data(), T, micro_batch, T, xl.data());
      cs.take(y.data(), T, micro_batch, T, yl.data());
    }
    const double loss = cs.active() ? model.forward_loss(xl.data(), yl.data(), micro_batch, Tl)
                                    : model.forward_loss(x.data(), y.data(), micro_batch, T);
    if (mine) sum += loss;
  }
  // A slot's loss is the same on its X x Y ranks: the whole sum is the sum over Z x C x D.
  if (g.tokens().size() > 1) g.tokens().allreduce_sum(&sum, 1);
  out << "evaluated " << count << " tokens of " << data_dir << " (" << split << ") with "
      << model_dir << "\n";
  return sum / double(count);
}

}  // namespace tetrad
