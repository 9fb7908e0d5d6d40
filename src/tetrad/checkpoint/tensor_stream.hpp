// Callbacks for writing and reading checkpoints one tensor at a time, so that no process has to
// hold the whole model (or its Adam moments) in memory: a rank of a parallel run gathers or
// scatters one tensor per call.
//
// `index` is the tensor's position in the ParamTable (table.specs[index]); the data is in
// tetrad's internal layout ([out, in] linear weights, as in the flat parameter buffer), numel =
// table.specs[index].numel floats. Functions taking these document the order of the calls; it is
// part of their contract (callers may run a collective per call).
#pragma once
#include <cstddef>
#include <functional>

namespace tetrad {

// fetch(i, out): fill out[table.specs[i].numel] with tensor i.
using TensorSource = std::function<void(size_t index, float* out)>;
// sink(i, data): receives tensor i (numel floats); `data` is valid only during the call.
using TensorSink = std::function<void(size_t index, const float* data)>;

}  // namespace tetrad
