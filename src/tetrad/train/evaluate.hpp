// `tetrad eval`'s measurement: the validation loss of a saved model on a prepared split, on one
// rank or on a grid under mpirun. Apart from the trainer (whose in-run validation is
// train/validator.hpp): it loads a model folder, checks the data's tokenizer against it, and
// deals the split's micro-batches out over the grid's Z x D slots.
#pragma once
#include <iosfwd>
#include <string>

namespace tetrad {

// Validation loss of a model given by folder (HF-format folder or checkpoint) on a prepared split:
// the mean loss per token of the split's first `batches` micro-batches (in order, unshuffled).
// On a grid (inference_grid's "x,y,z,d"; collective over MPI_COMM_WORLD unless "1,1,1,1") the
// one model evaluates the same micro-batches, dealt out over the Z x D slots (batch i to slot
// i mod Gz*Gd; with a context axis each C rank evaluates its two chunks of every sequence), and
// every rank returns the whole figure. Throws Error when the shards were made
// with another tokenizer than the model's.
double evaluate_checkpoint(const std::string& model_dir, const std::string& data_dir,
                           const std::string& split, int micro_batch, int seq_len, int batches,
                           std::ostream& out, const std::string& grid = "1,1,1,1");

}  // namespace tetrad
