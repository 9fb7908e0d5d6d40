// The expert-parallel axis E of a mixture-of-experts block (moe_block.hpp; GridShape::e() > 1),
// folded over the replica ranks (C x D) as Megatron's parallel folding does: rank ε of the
// expert group (ProcessGroups::experts(), E ranks holding other tokens) holds experts
// [ε El, (ε + 1) El), El = n_experts / E. After the router, each rank's kept rows (in expert
// order, so the rows for rank j are one block) go to their experts' ranks by a variable
// all-to-all (the counts per expert exchanged first), the local experts run as one grouped GEMM
// each over the rows of every source (reordered source-major -> expert-major), and the outputs
// return by the reverse all-to-all. The backward sends the rows' gradients the same way, and
// recomputes the dispatch: the forward's rows are sent again and the experts' gate|up and SwiGLU
// recomputed on the expert side, so that a layer keeps only its own tokens' activations (the
// rows it sent and got back, in its own layout), whatever the pipeline or recomputation does
// with them; the received rows live in scratch of this object, sized by the largest exchange
// seen (up to E x the local rows under extreme imbalance: every token to one expert, dropless).
//
// On the tensor axes each X/Y rank exchanges its Cx columns of the rows with the ranks of the
// same (x, y) (the expert group varies the replica coordinates only), and the experts' GEMMs
// sum their partial products over X and Y (expert_mlp.hpp).
//
// Expert gradients accumulate into this rank's experts' blocks; the gradient reducer sums them
// over the expert-data group (ProcessGroups::expert_replicas()). Collective over the expert
// group; not thread-safe.
#pragma once
#include <cstdint>
#include <vector>

#include "tetrad/backend/backend.hpp"
#include "tetrad/model/model_config.hpp"
#include "tetrad/parallel/expert_mlp.hpp"
#include "tetrad/parallel/moe_routing.hpp"
#include "tetrad/parallel/step_context.hpp"

namespace tetrad::parallel {

class ExpertParallel {
 public:
  // act16: the experts' SwiGLU output is kept in bf16 (the model's bf16 activations), as on
  // one rank; grad16: the backward's NN form on bf16 gradient copies (ExpertGrad16), kept in
  // the staging rows' memory (free while the experts run).
  ExpertParallel(const StepContext& ctx, const ModelConfig& cfg, bool act16 = false,
                 bool grad16 = false);

  // rows [r.kept, Cx]: this rank's kept choices in expert order (r.rows, r.first over every
  // expert) -> out [r.kept, Cx], the same rows through their experts. w: this rank's experts'
  // gathered weights and the GEMMs' precision.
  void forward(int layer, const MoeRouting& r, const float* rows, const ExpertGemms& w,
               float* out);
  // drows [r.kept, Cx]: in, the gradient of out; out, the gradient of rows. gw13, gw2: this rank's
  // experts' gradient blocks (accumulated).
  void backward(int layer, const MoeRouting& r, const float* rows, float* drows,
                const ExpertGemms& w, float* gw13, float* gw2);

  // The most rows one rank's experts receive in one exchange when each rank of the grid holds
  // `tokens` tokens of the micro-batch: the bound the memory formula sizes the scratch for
  // (parallel::model_memory). A token's k choices are distinct experts, so at most
  // min(k, n_experts / E) of them go to one rank's experts: dropless, E x tokens x that (every
  // token of the expert group routed to this rank's experts, as under a router of zeros); under
  // a capacity factor no more than n_experts / E experts x an expert's capacity of the whole
  // micro-batch (tokens x the token group Z x C x D).
  static int64_t max_rows(const ModelConfig& cfg, const GridShape& shape, int64_t tokens);
  // Bytes of the scratch for `rows` received rows of a rank with local sizes `dims`: staging,
  // input and output rows [rows, C / Gx], the experts' gate|up and its gradient [rows, 2F / Gy],
  // SwiGLU and its gradient [rows, F / Gy].
  static int64_t scratch_bytes(const LocalDims& dims, int64_t rows);
  // What the scratch holds now (sized by the largest exchange so far; 0 before the first).
  int64_t bytes() const { return cap_ * (3 * C_ + 6 * F_) * int64_t(sizeof(float)); }

 private:
  // The exchange's shape from the routing: counts per (rank, expert) both ways, the local
  // experts' rows from every source, the scratch sized.
  void plan(int layer, const MoeRouting& r);
  // rows (this rank's layout) -> em (the local experts' rows, expert-major).
  void dispatch(int layer, const float* rows, float* em, const char* what);
  // em (expert-major) -> rows (this rank's layout): the reverse.
  void combine(int layer, const float* em, float* rows, const char* what);
  void alltoallv(int layer, const float* send, const std::vector<size_t>& sc,
                 const std::vector<size_t>& sd, float* recv, const std::vector<size_t>& rc,
                 const std::vector<size_t>& rd, const char* what);
  void reorder(const float* from, float* to, bool to_expert_major);
  // The SwiGLU output's storage: act_ in fp32, or act_ holding bf16 with dact_ as the fp32
  // scratch of a backend without the bf16 producer.
  ExpertAct act() {
    if (!act16_) return {act_.data(), nullptr};
    return {dact_.data(), reinterpret_cast<uint16_t*>(act_.data())};
  }

  const StepContext& ctx_;
  int64_t C_, F_, El_;  // this rank's widths (Cx, Fy) and experts
  int Ge_;
  bool act16_, grad16_;
  std::vector<int64_t> send_cnt_, recv_cnt_;  // [Ge x El] rows to / from rank s for expert e
  std::vector<size_t> sc_, sd_, rc_, rd_;     // per rank, in floats: rows x C
  std::vector<int64_t> lrows_, lfirst_;       // per local expert, expert-major
  int64_t R_ = 0;                             // rows received (= the local experts' rows)
  int64_t cap_ = 0;                           // rows the scratch holds
  backend::DeviceArray<float> stage_, in_, gu_, act_, out_, dact_, dgu_;
};

}  // namespace tetrad::parallel
