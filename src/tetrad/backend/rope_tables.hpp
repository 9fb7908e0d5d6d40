// The rotary embedding's frequencies and its cos/sin tables, computed on the host for every backend
// (a GPU copies them to its memory: the model builds them once); defined with the CPU kernels
// (backend/cpu/ops.cpp), which apply them.
#pragma once
#include <cstdint>
#include <vector>

namespace tetrad::kernels {

// The frequencies: inv_freq[i] = theta^(-2i/hd) (Hugging Face's "default" rope type), or with
// Llama 3.1's scaling (rope type "llama3": `factor` > 0 below) as transformers computes it:
// with wavelen = 2 pi / inv_freq, low = original_max_position / low_freq_factor and
// high = original_max_position / high_freq_factor,
//   wavelen < high:  inv_freq unchanged (high frequencies)
//   wavelen > low:   inv_freq / factor (low frequencies)
//   otherwise:       (1 - s) inv_freq / factor + s inv_freq,
//                    s = (original_max_position / wavelen - low_freq_factor)
//                        / (high_freq_factor - low_freq_factor)  (the smooth band).
struct RopeFrequencies {
  double theta = 10000;
  double factor = 0;  // 0: no scaling (default rope); > 0: llama3 scaling with the fields below
  double low_freq_factor = 1, high_freq_factor = 4, original_max_position = 8192;
};
// The hd/2 inverse frequencies.
std::vector<double> rope_inv_freq(int64_t hd, const RopeFrequencies& f);
template <typename T>
void rope_tables(T* cos_table, T* sin_table, int64_t max_pos, int64_t hd,
                 const RopeFrequencies& f);
template <typename T>
void rope_tables(T* cos_table, T* sin_table, int64_t max_pos, int64_t hd, double theta);

}  // namespace tetrad::kernels
