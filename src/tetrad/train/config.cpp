#include "tetrad/train/config.hpp"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <utility>
#include <map>
#include <sstream>
#include <toml++/toml.h>

#include "tetrad/checkpoint/hf_config.hpp"
#include "tetrad/comm/transports.hpp"
#include "tetrad/core/error.hpp"
#include "tetrad/backend/precision.hpp"
#include "tetrad/parallel/gemm_layouts.hpp"
#include "tetrad/parallel/grid.hpp"
#include "tetrad/parallel/layer_split.hpp"
#include "tetrad/train/loss_mask.hpp"

namespace tetrad {

namespace {

// One schema entry: where the value lives and how to read/print it.
struct Field {
  std::string key;  // "section.name"
  std::string type;
  std::string doc;
  std::function<void(RunConfig&, const toml::node&, const std::string& where)> set;
  std::function<std::string(const RunConfig&)> get;
};

std::string toml_quote(const std::string& s) {
  std::ostringstream os;
  os << toml::value<std::string>(s);
  return os.str();
}

// Readers that check the TOML type and name the key on mismatch.
int64_t read_int(const toml::node& n, const std::string& key, const std::string& where) {
  if (auto v = n.value_exact<int64_t>()) return *v;
  // An integer too long for TOML (--set train.seed=18446744073709551615 arrives as a string).
  if (auto s = n.value_exact<std::string>();
      s && !s->empty() && s->find_first_not_of("-+0123456789") == std::string::npos &&
      s->find_first_of("0123456789") != std::string::npos)
    fail(where, ": ", key, " = ", *s, " is out of range: it must be an integer between ",
         std::numeric_limits<int64_t>::min(), " and ", std::numeric_limits<int64_t>::max(),
         " (a TOML integer) and within the key's own range (`tetrad config-doc`)");
  fail(where, ": ", key, " must be an integer, got ", n.type());
}
// An integer into the field's own type: a value that does not fit is an error, never wrapped
// (n_layer = 4294967298 must not become 2).
// The least value of each integer key (every one has one; checked where the value is read).
int64_t least_int(const std::string& key) {
  static const std::map<std::string, int64_t> zero_ok = {
      {"parallel.prefetch_depth", 0}, {"parallel.zero", 0},        {"train.seed", 0},
      {"train.warmup_steps", 0},      {"train.eval_interval", 0},  {"train.checkpoint_interval", 0},
      {"model.n_experts", 0},  {"model.experts_per_token", 0}, {"model.shared_expert_ffn", 0},
      {"train.memory_limit_mib", 0},  {"train.threads", 0},        {"train.goldfish_k", 2},
      {"model.head_dim", 0}};
  const auto it = zero_ok.find(key);
  return it == zero_ok.end() ? 1 : it->second;
}
template <typename T>
T narrow_int(int64_t v, const std::string& key, const std::string& where) {
  if (const int64_t least = least_int(key); v < least)
    fail(where, ": ", key, " must be ",
         least == 1 ? std::string("positive")
                    : least == 0 ? std::string(">= 0") : "at least " + std::to_string(least),
         ", got ", v, " (`tetrad config-doc` lists every key)");
  if (!std::in_range<T>(v))
    fail(where, ": ", key, " = ", v, " is out of range: it must be between ",
         +std::numeric_limits<T>::min(), " and ", +std::numeric_limits<T>::max());
  return static_cast<T>(v);
}
// The range of each number key, checked where the value is read (every value finite; nan and inf
// are refused for every key, whatever later checks would make of them).
struct NumberRange {
  double lo, hi;
  bool lo_open, hi_open;
};
const std::map<std::string, NumberRange>& number_ranges() {
  static const std::map<std::string, NumberRange> r = {
      {"model.norm_eps", {0, 1, true, false}},
      {"model.rope_theta", {0, 1e12, true, false}},
      {"model.rope_factor", {0, 1e6, true, false}},
      {"model.rope_low_freq_factor", {0, 1e6, true, false}},
      {"model.rope_high_freq_factor", {0, 1e6, true, false}},
      {"model.init_std", {0, 10, true, false}},
      {"model.router_aux_loss_coef", {0, 1e3, false, false}},
      {"model.router_z_loss_coef", {0, 1e3, false, false}},
      {"model.moe_capacity_factor", {0, 1e3, false, false}},
      {"model.expert_bias_rate", {0, 1e3, false, false}},
      {"parallel.dp_bucket_mb", {0, 1e6, false, false}},
      {"train.lr", {0, 100, true, false}},
      {"train.min_lr_ratio", {0, 1, false, false}},
      {"train.weight_decay", {0, 1e3, false, false}},
      {"train.beta1", {0, 1, false, true}},
      {"train.beta2", {0, 1, false, true}},
      {"train.adam_eps", {0, 1, true, false}},
      {"train.grad_clip", {0, 1e9, false, false}},
      {"train.step_timeout", {0, 1e7, false, false}},
      {"train.comm_timeout", {0, 1e7, false, false}},
  };
  return r;
}
double read_double(const toml::node& n, const std::string& key, const std::string& where) {
  double v = 0;
  if (auto d = n.value_exact<double>()) v = *d;
  else if (auto i = n.value_exact<int64_t>()) v = double(*i);
  else fail(where, ": ", key, " must be a number, got ", n.type());
  const auto it = number_ranges().find(key);
  if (it == number_ranges().end()) {
    if (!std::isfinite(v)) fail(where, ": ", key, " = ", v, " is not a finite number");
    return v;
  }
  const NumberRange& r = it->second;
  const bool ok = std::isfinite(v) && (r.lo_open ? v > r.lo : v >= r.lo) &&
                  (r.hi_open ? v < r.hi : v <= r.hi);
  if (!ok) {
    std::ostringstream range;
    range << (r.lo_open ? "(" : "[") << r.lo << ", " << r.hi << (r.hi_open ? ")" : "]");
    fail(where, ": ", key, " = ", v, std::isfinite(v) ? " is out of range" : " is not a finite number",
         ": expected a finite number in ", range.str(), " (`tetrad config-doc` lists every key)");
  }
  return v;
}
bool read_bool(const toml::node& n, const std::string& key, const std::string& where) {
  if (auto v = n.value_exact<bool>()) return *v;
  fail(where, ": ", key, " must be true or false, got ", n.type());
}
std::string read_string(const toml::node& n, const std::string& key, const std::string& where) {
  if (auto v = n.value_exact<std::string>()) return *v;
  fail(where, ": ", key, " must be a string, got ", n.type());
}

// Shortest text that reads back to the same value of the field's own type (float or double).
template <typename F>
std::string fmt_double(F v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

#define INT_FIELD(KEY, EXPR, DOC)                                                              \
  Field{KEY, "integer", DOC,                                                                   \
        [](RunConfig& c, const toml::node& n, const std::string& w) {                          \
          EXPR = narrow_int<std::remove_reference_t<decltype(EXPR)>>(read_int(n, KEY, w), KEY, w); \
        },                                                                                     \
        [](const RunConfig& c) { return std::to_string(EXPR); }}
#define FLOAT_FIELD(KEY, EXPR, DOC)                                                            \
  Field{KEY, "number", DOC,                                                                    \
        [](RunConfig& c, const toml::node& n, const std::string& w) {                          \
          EXPR = static_cast<std::remove_reference_t<decltype(EXPR)>>(read_double(n, KEY, w)); \
        },                                                                                     \
        [](const RunConfig& c) { return fmt_double(EXPR); }}
#define BOOL_FIELD(KEY, EXPR, DOC)                                                             \
  Field{KEY, "bool", DOC,                                                                      \
        [](RunConfig& c, const toml::node& n, const std::string& w) {                          \
          EXPR = read_bool(n, KEY, w);                                                         \
        },                                                                                     \
        [](const RunConfig& c) { return std::string(EXPR ? "true" : "false"); }}
#define STRING_FIELD(KEY, EXPR, DOC)                                                           \
  Field{KEY, "string", DOC,                                                                    \
        [](RunConfig& c, const toml::node& n, const std::string& w) {                          \
          EXPR = read_string(n, KEY, w);                                                       \
        },                                                                                     \
        [](const RunConfig& c) { return toml_quote(EXPR); }}

// The keys of [model], [data] and [run], in the order to_toml writes them.
std::vector<Field> model_data_run_fields() {
  return {
      // model.name is handled first (it selects the base that the other model keys override).
      STRING_FIELD("model.name", c.model_name,
                   "named base configuration: tiny, small, gpt2-124m, llama-tiny, llama-small, llama-1b, "
                   "qwen2-tiny, qwen3-tiny, mixtral-tiny, mixtral-small, mixtral-small-dense, "
                   "qwen2-moe-tiny, qwen3-moe-tiny"),
      Field{"model.family", "string", "\"gpt2\", \"llama\", \"qwen2\", \"qwen3\", \"mixtral\", \"qwen2_moe\" or \"qwen3_moe\"",
            [](RunConfig& c, const toml::node& n, const std::string& w) {
              c.model.family = parse_family(read_string(n, "model.family", w));
            },
            [](const RunConfig& c) { return toml_quote(family_name(c.model.family)); }},
      INT_FIELD("model.n_layer", c.model.n_layer, "transformer blocks"),
      INT_FIELD("model.n_embd", c.model.n_embd, "hidden size"),
      INT_FIELD("model.n_head", c.model.n_head, "attention heads"),
      INT_FIELD("model.n_kv_head", c.model.n_kv_head,
                "key/value heads (grouped-query attention when < n_head; Llama only)"),
      INT_FIELD("model.head_dim", c.model.explicit_head_dim,
                "width of one attention head; 0: n_embd / n_head (another value: Llama, Qwen3)"),
      INT_FIELD("model.ffn", c.model.ffn, "MLP inner size"),
      INT_FIELD("model.vocab_size", c.model.vocab_size,
                "vocabulary size (must be >= the tokenizer's)"),
      INT_FIELD("model.max_seq", c.model.max_seq, "longest sequence (GPT-2: learned positions)"),
      FLOAT_FIELD("model.norm_eps", c.model.norm_eps, "LayerNorm / RMSNorm epsilon"),
      FLOAT_FIELD("model.rope_theta", c.model.rope_theta, "rotary base (Llama)"),
      STRING_FIELD("model.rope_type", c.model.rope_type,
                   "rotary frequencies (Llama): \"default\" or \"llama3\" (Llama 3.1's scaling with the four rope_* keys below, Hugging Face's rope_type llama3)"),
      FLOAT_FIELD("model.rope_factor", c.model.rope_factor, "llama3 rope: factor low frequencies are divided by"),
      FLOAT_FIELD("model.rope_low_freq_factor", c.model.rope_low_freq_factor, "llama3 rope: low_freq_factor"),
      FLOAT_FIELD("model.rope_high_freq_factor", c.model.rope_high_freq_factor, "llama3 rope: high_freq_factor"),
      INT_FIELD("model.rope_original_max_position", c.model.rope_original_max_position,
                "llama3 rope: original_max_position_embeddings (context length before scaling)"),
      BOOL_FIELD("model.tie_embeddings", c.model.tie_embeddings,
                 "output head shares the token embedding (always true for GPT-2)"),
      FLOAT_FIELD("model.init_std", c.model.init_std, "standard deviation of the initial weights"),
      INT_FIELD("model.n_experts", c.model.n_experts,
                "mixture of experts (\"mixtral\"): experts per block, each a SwiGLU MLP of width ffn (0: dense)"),
      INT_FIELD("model.experts_per_token", c.model.experts_per_token,
                "mixture of experts: the router's top k (at most n_experts)"),
      BOOL_FIELD("model.norm_topk_prob", c.model.norm_topk_prob,
                 "mixture of experts: renormalise the k chosen experts' softmax weights to sum 1 (Mixtral: true)"),
      STRING_FIELD("model.moe_balance", c.model.moe_balance,
                   "mixture of experts' load balancing: \"aux_loss\" (Switch / Mixtral auxiliary loss, weight router_aux_loss_coef), \"expert_bias\" (DeepSeek-V3's aux-loss-free bias on the top-k selection, step expert_bias_rate), \"both\" or \"none\""),
      FLOAT_FIELD("model.expert_bias_rate", c.model.expert_bias_rate,
                  "mixture of experts with the expert bias: after each optimizer step bias_e += rate x sign(mean load - load_e) (DeepSeek-V3's gamma)"),
      INT_FIELD("model.shared_expert_ffn", c.model.shared_expert_ffn,
                "mixture of experts: width of the shared expert every token goes through (Qwen2-MoE's form: SwiGLU, output scaled by sigmoid(x . w_gate)); 0: none"),
      FLOAT_FIELD("model.router_aux_loss_coef", c.model.router_aux_loss_coef,
                  "mixture of experts: weight of the auxiliary load-balancing loss (mean over layers, per token like the loss)"),
      FLOAT_FIELD("model.router_z_loss_coef", c.model.router_z_loss_coef,
                  "mixture of experts: weight of the router z-loss (mean squared log-sum-exp of the router logits)"),
      FLOAT_FIELD("model.moe_capacity_factor", c.model.moe_capacity_factor,
                  "mixture of experts: 0 dropless; > 0 each expert takes at most ceil(factor x tokens x k / n_experts) tokens of a micro-batch, the rest dropped and counted"),
      STRING_FIELD("data.dir", c.data_dir, "folder written by `tetrad prepare`"),
      BOOL_FIELD("data.document_mask", c.document_mask,
                 "attention stays inside each document of a packed sequence (block-diagonal "
                 "causal); needs shards that record document boundaries (prepared by this build)"),
      BOOL_FIELD("data.document_positions", c.document_positions,
                 "positions (rotary or learned) restart at 0 at each document's first token; "
                 "needs shards that record document boundaries (prepared by this build)"),
      STRING_FIELD("run.dir", c.run_dir,
                   "run folder: resolved config, metrics.jsonl, checkpoints"),
      STRING_FIELD("run.init_from", c.init_from,
                   "Hugging Face model folder to start from (fine-tuning); when no model.* key is set "
                   "anywhere, the model is the one its config.json describes; empty: random init"),
  };
}

// The keys of [parallel].
std::vector<Field> parallel_fields() {
  return {
      STRING_FIELD("parallel.grid", c.grid,
                   "process grid \"x,y,z,d\", \"x,y,z,p,d\" or named extents \"d=2,x=2\" "
                   "(axes not named are 1; the context axis only by name, \"c=2\", and the expert "
                   "fold of a mixture of experts, \"d=2,e=2\", which adds no ranks): tensor "
                   "parallelism over X, Y, Z (Z shards weights), context parallelism over C "
                   "(each sequence cut into 2c chunks), pipeline stages over P, data parallelism "
                   "over D; the product must equal the "
                   "number of ranks. \"auto\": the planner's first choice for this run "
                   "(docs/planner.md); empty (not set): 1,1,1,1 on one rank, on more the "
                   "planner's choice as for \"auto\""),
      STRING_FIELD("parallel.machine", c.machine,
                   "machine description the planner uses for grid = \"auto\": a TOML file or "
                   "a shipped name (machines/*.toml: local, perlmutter, frontier, alps, dgx-a100)"),
      BOOL_FIELD("parallel.overlap_backward_allreduce", c.overlap.backward_allreduce,
                 "backward: the input-gradient all-reduce runs while the weight-gradient GEMM "
                 "computes"),
      BOOL_FIELD("parallel.overlap_reduce_scatter", c.overlap.reduce_scatter,
                 "backward: a layer's weight-gradient reduce-scatter over Z runs during earlier "
                 "layers' backward"),
      INT_FIELD("parallel.prefetch_depth", c.overlap.prefetch_depth,
                "Z all-gathers of weights issued this many layers ahead (forward and backward; "
                "0: gather when needed); one gathered layer of memory each"),
      BOOL_FIELD("parallel.prefetch_across_steps", c.overlap.prefetch_across_steps,
                 "the optimizer updates the weights the next forward gathers first (embedding, "
                 "head, layers 0..prefetch_depth) first and starts their Z all-gathers while it "
                 "updates the rest (needs prefetch_depth >= 1; no effect without Z or with a "
                 "pipeline axis)"),
      BOOL_FIELD("parallel.cache_gathered_weights", c.overlap.cache_gathered_weights,
                 "keep every layer's gathered weights for the whole step (one gather per layer "
                 "per step, instead of per micro-batch and pass; costs Gz x the layer weights)"),
      BOOL_FIELD("parallel.overlap_dp_allreduce", c.overlap.dp_overlap,
                 "data-parallel gradient all-reduce in buckets started during the last "
                 "micro-batch's backward, as soon as each bucket is final (no effect with "
                 "parallel.zero >= 1 or a pipeline axis: they reduce at the end of the step)"),
      FLOAT_FIELD("parallel.dp_bucket_mb", c.overlap.dp_bucket_mb,
                  "data-parallel bucket size in MiB (0: one all-reduce per tensor, in place); "
                  "used with or without overlap, so it never changes results between the two"),
      INT_FIELD("parallel.forward_chunks", c.overlap.forward_chunks,
                "forward: GEMM and all-reduce in this many row chunks, each chunk's all-reduce "
                "behind the next chunk's GEMM (1: off)"),
      Field{"parallel.progress_thread", "bool or \"auto\"",
            "true: a helper thread calls MPI every ~50 us during GEMMs while collectives are "
            "pending (Open MPI progresses only inside MPI calls); false: MPI_Test polls between "
            "kernels only; \"auto\": the thread when every rank has a core to spare for it "
            "(ranks on the node x (train.threads + 1) <= cores), else polling (on a full node the "
            "thread takes its time from the kernels)",
            [](RunConfig& c, const toml::node& n, const std::string& w) {
              if (auto b = n.value_exact<bool>()) {
                c.overlap.progress_thread = *b ? "true" : "false";
                return;
              }
              const auto s = n.value_exact<std::string>();
              if (s && (*s == "auto" || *s == "true" || *s == "false")) {
                c.overlap.progress_thread = *s;
                return;
              }
              if (s) fail(w, ": parallel.progress_thread must be true, false or \"auto\", got \"", *s, "\"");
              fail(w, ": parallel.progress_thread must be true, false or \"auto\", got ", n.type());
            },
            [](const RunConfig& c) {
              return c.overlap.progress_thread == "auto" ? toml_quote("auto")
                                                         : c.overlap.progress_thread;
            }},
      STRING_FIELD("parallel.schedule", c.schedule,
                   "pipeline schedule (Gp > 1): \"1f1b\" or \"interleaved\" (needs "
                   "train.grad_accum divisible by Gp); micro-batches = train.grad_accum"),
      INT_FIELD("parallel.expert_parallel", c.expert_parallel,
                "mixture of experts: E, the experts split over E of the data (and context) ranks, "
                "folded over them as Megatron's parallel folding (no ranks of their own: E divides "
                "Gd x Gc and model.n_experts), the tokens dispatched to their experts' ranks by "
                "all-to-all (docs/moe.md); the same as e=E in parallel.grid (\"d=2,e=2\")"),
      INT_FIELD("parallel.virtual_stages", c.virtual_stages,
                "model chunks per pipeline stage (\"interleaved\" only; 1 with \"1f1b\"); the "
                "layers split over Gp x virtual_stages as parallel.pipeline_layers says"),
      STRING_FIELD("parallel.pipeline_layers", c.pipeline_layers,
                   "how the layers split into the Gp x virtual_stages virtual stages: \"even\" "
                   "(the first L % V one layer more), \"balanced\" (fewest FLOPs on the busiest "
                   "virtual stage, counting the embedding on the first and the output head + "
                   "loss on the last), or layer counts per virtual stage, e.g. \"3,1\""),
      STRING_FIELD("parallel.cp_comm", c.cp_comm,
                   "how attention on the context axis (grid c > 1) reaches the other ranks' keys "
                   "and values: \"allgather\" (all-gathered, dK/dV reduce-scattered back) or "
                   "\"ring\" (blocks passed peer to peer round the C group, overlapped with the "
                   "attention on those already there, merged by their log-sum-exp)"),
      INT_FIELD("parallel.zero", c.zero,
                "ZeRO stage over the data axis: 0 replicates optimizer state over D; 1 shards the "
                "Adam moments over D (gradients reduce-scattered, updated parameters "
                "all-gathered); 2 shards the gradients too"),
      BOOL_FIELD("parallel.sparse_embedding_grad", c.sparse_embedding_grad,
                 "with Z > 1, exchange the token embedding's gradient as the rows the batch "
                 "touched (all-gather of tokens x C/Gx over Z) instead of reduce-scattering the "
                 "whole vocabulary block, when that moves less (Gz x tokens per rank < V/Gy); "
                 "not with a pipeline axis or ZeRO 2"),
      BOOL_FIELD("parallel.sequence_shard", c.sequence_shard,
                 "split the residual stream (norms, residual adds, the stored block outputs) "
                 "along the tokens over Y, Megatron's sequence parallelism: reduce-scatter + "
                 "all-gather in place of the all-reduces over Y, 1/Gy of the stored block "
                 "outputs' memory; fp32 results change at rounding level"),
  };
}

// The keys of [train].
std::vector<Field> train_fields() {
  return {
      INT_FIELD("train.seed", c.train.seed, "seed of weight init and data order"),
      INT_FIELD("train.micro_batch", c.train.micro_batch,
                "sequences per micro-batch of the whole job (split over the Z x D ranks)"),
      INT_FIELD("train.seq_len", c.train.seq_len, "tokens per sequence (<= model.max_seq)"),
      INT_FIELD("train.grad_accum", c.train.grad_accum, "micro-batches per optimizer step"),
      INT_FIELD("train.max_steps", c.train.max_steps, "optimizer steps"),
      FLOAT_FIELD("train.lr", c.train.lr, "peak learning rate"),
      FLOAT_FIELD("train.min_lr_ratio", c.train.min_lr_ratio,
                  "final learning rate as a fraction of the peak (cosine decay)"),
      INT_FIELD("train.warmup_steps", c.train.warmup_steps, "linear warm-up steps"),
      FLOAT_FIELD("train.weight_decay", c.train.weight_decay, "AdamW decoupled weight decay"),
      FLOAT_FIELD("train.beta1", c.train.beta1, "AdamW beta1"),
      FLOAT_FIELD("train.beta2", c.train.beta2, "AdamW beta2"),
      FLOAT_FIELD("train.adam_eps", c.train.adam_eps, "AdamW epsilon"),
      FLOAT_FIELD("train.grad_clip", c.train.grad_clip, "global gradient-norm clip (0: off)"),
      BOOL_FIELD("train.decay_embeddings", c.train.decay_embeddings,
                 "apply weight decay to embeddings"),
      BOOL_FIELD("train.decay_norms", c.train.decay_norms, "apply weight decay to norm weights"),
      BOOL_FIELD("train.decay_biases", c.train.decay_biases, "apply weight decay to biases"),
      INT_FIELD("train.log_interval", c.train.log_interval, "steps between progress lines"),
      INT_FIELD("train.eval_interval", c.train.eval_interval,
                "steps between validation passes (0: off)"),
      INT_FIELD("train.eval_batches", c.train.eval_batches, "micro-batches per validation pass"),
      INT_FIELD("train.checkpoint_interval", c.train.checkpoint_interval,
                "steps between checkpoints (0: only at the end)"),
      INT_FIELD("train.keep_checkpoints", c.train.keep_checkpoints, "checkpoints kept"),
      BOOL_FIELD("train.async_checkpoint", c.train.async_checkpoint,
                 "write checkpoints on a background thread from a snapshot while training goes on "
                 "(false: training waits for the write)"),
      FLOAT_FIELD("train.step_timeout", c.train.step_timeout,
                  "watchdog: seconds a training step, validation pass or checkpoint phase may "
                  "take before the rank reports the stall (naming itself and the phase) and ends "
                  "the job (0: off)"),
      FLOAT_FIELD("train.comm_timeout", c.train.comm_timeout,
                  "seconds any collective may wait for its peers before the job ends with an "
                  "error naming the operation and group (0: TETRAD_COMM_TIMEOUT, else 300)"),
      INT_FIELD("train.max_bad_steps", c.train.max_bad_steps,
                "consecutive non-finite steps (skipped) before the run stops"),
      STRING_FIELD("train.recompute", c.train.recompute,
                   "activation recomputation: \"none\", \"selective\" (attention recomputed "
                   "in the backward from the stored q|k|v) or \"full\" (each block keeps only "
                   "its input and reruns its forward before its backward)"),
      STRING_FIELD("train.precision", c.train.precision,
                   "GEMM precision: \"fp32\", \"bf16\" (bf16 operands, fp32 accumulation; fp32 master weights, gradients, optimizer, norms, softmax, loss) or \"auto\" (the faster of the two on this machine, measured once and cached: docs/precision.md)"),
      STRING_FIELD("train.attention_precision", c.train.attention_precision,
                   "attention's products (QK^T, PV and the backward's): \"auto\" (bf16 in bf16 runs where the bf16 attention kernel is the faster one, i.e. on CPUs with AMX; else fp32), \"fp32\" or \"bf16\" (bf16 operands, fp32 accumulation and softmax statistics)"),
      STRING_FIELD("train.activation_precision", c.train.activation_precision,
                   "storage of the activations in bf16 runs: \"auto\" (the tensors that only feed GEMMs (norm outputs, the MLP activation) and the tensors a block keeps for its backward (q|k|v, the attention output, the mid-block residual, the MLP input projection) in bf16: half their memory) or \"fp32\" (all kept in fp32: more memory, the GEMM operands still rounded to bf16 at each call; the backward reads the forward's fp32 values, so runs on different grids agree to fp32 accuracy); no effect in fp32 runs"),
      STRING_FIELD("train.gemm_layouts", c.train.gemm_layouts,
                   "layout of each bf16 GEMM (forward, input and weight gradient of every linear layer): \"auto\" (tune where bf16 GEMMs run natively, on AMX-BF16 or AVX512-BF16, else rule), \"rule\" (fixed forms, the same in every process), \"tune\" (each product's realizable forms timed at start-up on this rank's shapes, rank 0's choice used by every rank, the plan kept in checkpoints and reused on resume), or a plan as a checkpoint's meta.json records it (\"qkv:1024:768:2304:NT:TN:NN proj:...\", one site:N:k_in:n_out:fwd:dx:dw per site)"),
      STRING_FIELD("train.grad_comm_precision", c.train.grad_comm_precision,
                   "gradient reduce-scatters (over Z, ZeRO over D) and data-parallel all-reduces: \"fp32\" or \"bf16\" (each rank's contribution rounded to bf16 once, bf16 on the wire: half the bytes; summed in fp32; the gradients stay fp32; blocking, not on NCCL; docs/precision.md)"),
      STRING_FIELD("train.device", c.train.device,
                   "where the model computes: \"cpu\", \"cpu-strict\" (the CPU's arithmetic on "
                   "device memory the host cannot read) or, in a CUDA build with a GPU, "
                   "\"cuda\" (the node-local rank's GPU) / \"cuda:N\""),
      STRING_FIELD("train.comm", c.train.comm,
                   "the model's communicator: \"auto\" (nccl where train.device is cuda, the "
                   "build has NCCL, there is more than one rank, each with a GPU of its own, and "
                   "no pipeline axis; else mpi), \"nccl\" (collectives on GPU memory) or "
                   "\"mpi\" (device buffers staged through host memory)"),
      INT_FIELD("train.memory_limit_mib", c.train.memory_limit_mib,
                "MiB of device memory this rank may use, checked against the memory formula "
                "before the first step (0: what the device has free, shared among its ranks)"),
      STRING_FIELD("train.loss_mask", c.train.loss_mask,
                   "targets dropped from the loss: \"none\", \"goldfish\" (hashed, Hans et al. "
                   "2024), \"static\" (every k-th) or \"random\" (per position)"),
      INT_FIELD("train.goldfish_k", c.train.goldfish_k, "drop about 1 in k targets (>= 2)"),
      INT_FIELD("train.goldfish_h", c.train.goldfish_h,
                "Goldfish context width: tokens hashed to decide each drop"),
      INT_FIELD("train.threads", c.train.threads, "OpenMP threads per rank (0: OMP_NUM_THREADS, else the cores divided among the ranks of the node)"),
  };
}

const std::vector<Field>& schema() {
  static const std::vector<Field> fields = [] {
    std::vector<Field> all = model_data_run_fields();
    for (auto* section : {parallel_fields, train_fields}) {
      std::vector<Field> f = section();
      all.insert(all.end(), f.begin(), f.end());
    }
    return all;
  }();
  return fields;
}

const Field* find_field(const std::string& key) {
  for (const auto& f : schema())
    if (f.key == key) return &f;
  return nullptr;
}

[[noreturn]] void unknown_key(const std::string& key, const std::string& where) {
  std::string section = key.substr(0, key.find('.'));
  std::string known;
  for (const auto& f : schema())
    if (f.key.rfind(section + ".", 0) == 0) known += (known.empty() ? "" : ", ") + f.key;
  if (known.empty())
    fail(where, ": unknown section '", section, "'; expected model, data, run, parallel or train");
  fail(where, ": unknown key '", key, "'; keys of [", section, "] are: ", known);
}

// Flattens a parsed table into "section.key" -> node, rejecting nesting deeper than one level.
void collect(const toml::table& root, const std::string& where,
             std::vector<std::pair<std::string, const toml::node*>>& out) {
  for (const auto& [k, v] : root) {
    const std::string section(k.str());
    const toml::table* t = v.as_table();
    if (!t) fail(where, ": top-level key '", section, "' must be a [section] table");
    for (const auto& [k2, v2] : *t) out.emplace_back(section + "." + std::string(k2.str()), &v2);
  }
}

void apply(RunConfig& c, const std::string& key, const toml::node& n, const std::string& where) {
  const Field* f = find_field(key);
  if (!f) unknown_key(key, where);
  f->set(c, n, where);
}

}  // namespace

parallel::GridShape with_expert_fold(parallel::GridShape grid, int expert_parallel) {
  if (expert_parallel == 1) return grid;
  if (grid.e() > 1 && grid.e() != expert_parallel)
    fail("parallel.expert_parallel = ", expert_parallel, " and the grid's e=", grid.e(),
         " (parallel.grid or --grid) disagree: set one of them");
  return grid.set_e(expert_parallel);
}

RunSettings resolve_settings(const RunConfig& cfg) {
  const TrainConfig& t = cfg.train;
  RunSettings s;
  parallel::ParallelOptions& m = s.model;
  if (t.recompute != "none" && t.recompute != "selective" && t.recompute != "full")
    fail("train.recompute must be \"none\", \"selective\" or \"full\", got \"", t.recompute, "\"");
  m.recompute = parallel::parse_recompute(t.recompute);
  if (cfg.zero < 0 || cfg.zero > 2) fail("parallel.zero must be 0, 1 or 2, got ", cfg.zero);
  m.zero = cfg.zero;
  if (cfg.schedule != "1f1b" && cfg.schedule != "interleaved")
    fail("parallel.schedule must be \"1f1b\" or \"interleaved\", got \"", cfg.schedule, "\"");
  s.schedule = parallel::parse_pipeline_schedule(cfg.schedule);
  if (cfg.virtual_stages < 1)
    fail("parallel.virtual_stages must be at least 1, got ", cfg.virtual_stages);
  if (cfg.schedule == "1f1b" && cfg.virtual_stages != 1)
    fail("parallel.virtual_stages = ", cfg.virtual_stages,
         " needs parallel.schedule = \"interleaved\"");
  m.virtual_stages = cfg.virtual_stages;
  parallel::check_layer_split_spec(cfg.pipeline_layers);
  m.pipeline_layers = cfg.pipeline_layers;
  m.sparse_embedding_grad = cfg.sparse_embedding_grad;
  m.sequence_shard = cfg.sequence_shard;
  if (cfg.cp_comm != "allgather" && cfg.cp_comm != "ring")
    fail("parallel.cp_comm = \"", cfg.cp_comm, "\": expected \"allgather\" or \"ring\"");
  m.cp_comm = cfg.cp_comm == "ring" ? parallel::ContextComm::Ring : parallel::ContextComm::AllGather;
  // With a fixed pipeline grid the split can be checked against the model now (an explicit list
  // of the wrong length or sum); chosen grids ("auto", none named) are checked when chosen.
  if (cfg.grid != "auto" && !cfg.grid.empty()) {
    s.grid = with_expert_fold(parallel::parse_grid(cfg.grid), cfg.expert_parallel);
    if (s.grid->p() > 1)
      (void)parallel::resolve_layer_split(cfg.pipeline_layers, cfg.model, t.seq_len, s.grid->p(),
                                          cfg.virtual_stages);
  }
  if (t.precision != "auto") backend::parse_precision(t.precision);  // throws naming the choices
  s.precision = t.precision;
  if (t.attention_precision != "auto" && t.attention_precision != "fp32" &&
      t.attention_precision != "bf16")
    fail("train.attention_precision = \"", t.attention_precision,
         "\": expected \"auto\", \"fp32\" or \"bf16\"");
  if (t.attention_precision != "auto")
    m.attention_precision = t.attention_precision == "bf16" ? backend::Precision::BF16
                                                            : backend::Precision::FP32;
  if (t.activation_precision != "auto" && t.activation_precision != "fp32")
    fail("train.activation_precision = \"", t.activation_precision,
         "\": expected \"auto\" or \"fp32\"");
  m.bf16_activations = t.activation_precision == "auto";
  if (t.gemm_layouts.find(':') != std::string::npos) {  // a plan's text: refused naming the bad part
    (void)parallel::GemmLayoutPlan::parse(t.gemm_layouts, "given");
    m.gemm_layout_plan = t.gemm_layouts;
  } else if (t.gemm_layouts != "auto" && t.gemm_layouts != "rule" && t.gemm_layouts != "tune") {
    fail("train.gemm_layouts = \"", t.gemm_layouts, "\": expected \"auto\", \"rule\", \"tune\" "
         "or a plan (site:N:k_in:n_out:fwd:dx:dw for each of qkv, proj, fc, fcproj, head, as a "
         "checkpoint's meta.json records it)");
  } else {
    s.gemm_layouts = t.gemm_layouts;
  }
  if (t.grad_comm_precision != "fp32" && t.grad_comm_precision != "bf16")
    fail("train.grad_comm_precision = \"", t.grad_comm_precision, "\": expected \"fp32\" or \"bf16\"");
  m.grad_comm_bf16 = t.grad_comm_precision == "bf16";
  m.document_mask = cfg.document_mask;
  m.document_positions = cfg.document_positions;
  // Whether this build and machine can run it is checked when the run starts (backend::create).
  if (!(t.device == "cpu" || t.device == "cpu-strict" || t.device == "cuda" ||
        t.device.rfind("cuda:", 0) == 0))
    fail("train.device: expected \"cpu\", \"cpu-strict\", \"cuda\" or \"cuda:N\", got \"",
         t.device, "\"");
  // The model's transport (comm/transports.hpp); a grid chosen by auto is checked once chosen.
  comm::check_transport(t.comm, t.device, s.grid ? s.grid->p() : 0);
  return s;
}

void RunConfig::validate() const {
  model.validate();
  const auto& t = train;
  auto positive = [](const char* key, int64_t v) {
    if (v <= 0) fail("train.", key, " must be positive, got ", v);
  };
  positive("micro_batch", t.micro_batch);
  positive("seq_len", t.seq_len);
  positive("grad_accum", t.grad_accum);
  positive("max_steps", t.max_steps);
  positive("log_interval", t.log_interval);
  positive("eval_batches", t.eval_batches);
  positive("keep_checkpoints", t.keep_checkpoints);
  positive("max_bad_steps", t.max_bad_steps);
  if (overlap.prefetch_depth < 0)
    fail("parallel.prefetch_depth must be >= 0, got ", overlap.prefetch_depth);
  if (overlap.forward_chunks < 1)
    fail("parallel.forward_chunks must be >= 1 (1: off), got ", overlap.forward_chunks);
  if (!(overlap.dp_bucket_mb >= 0))
    fail("parallel.dp_bucket_mb must be >= 0 (0: per tensor), got ", overlap.dp_bucket_mb);
  if (t.seq_len > model.max_seq)
    fail("train.seq_len (", t.seq_len, ") is longer than the model's model.max_seq (",
         model.max_seq, ")");
  if (!(t.lr > 0)) fail("train.lr must be positive, got ", t.lr);
  if (!(t.min_lr_ratio >= 0 && t.min_lr_ratio <= 1))
    fail("train.min_lr_ratio must be in [0, 1], got ", t.min_lr_ratio);
  if (t.warmup_steps < 0) fail("train.warmup_steps must be >= 0, got ", t.warmup_steps);
  if (t.weight_decay < 0) fail("train.weight_decay must be >= 0, got ", t.weight_decay);
  if (!(t.beta1 >= 0 && t.beta1 < 1)) fail("train.beta1 must be in [0, 1), got ", t.beta1);
  if (!(t.beta2 >= 0 && t.beta2 < 1)) fail("train.beta2 must be in [0, 1), got ", t.beta2);
  if (!(t.adam_eps > 0)) fail("train.adam_eps must be positive, got ", t.adam_eps);
  if (t.grad_clip < 0) fail("train.grad_clip must be >= 0 (0 disables), got ", t.grad_clip);
  if (t.eval_interval < 0) fail("train.eval_interval must be >= 0, got ", t.eval_interval);
  if (t.checkpoint_interval < 0)
    fail("train.checkpoint_interval must be >= 0, got ", t.checkpoint_interval);
  if (t.threads < 0) fail("train.threads must be >= 0, got ", t.threads);
  if (t.memory_limit_mib < 0)
    fail("train.memory_limit_mib must be >= 0 (MiB per rank; 0: the device's free memory), got ",
         t.memory_limit_mib);
  if (!(t.step_timeout >= 0)) fail("train.step_timeout must be >= 0 (0 disables), got ", t.step_timeout);
  if (!(t.comm_timeout >= 0)) fail("train.comm_timeout must be >= 0 (0: default), got ", t.comm_timeout);
  if (run_dir.empty()) fail("run.dir must not be empty");
  LossMask{parse_loss_mask(t.loss_mask), t.goldfish_k, t.goldfish_h, t.seed}.validate();
  (void)resolve_settings(*this);
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::vector<std::pair<std::string, const toml::node*>> entries;
  toml::table file_table;
  if (!path.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec))
      fail("config '", path, "' ", std::filesystem::exists(path, ec) ? "is not a regular file (a folder?)" : "does not exist",
           ": --config takes a TOML file, e.g. configs/default.toml");
    try {
      file_table = toml::parse_file(path);
    } catch (const toml::parse_error& e) {
      const auto& b = e.source().begin;
      fail("config '", path, "' line ", b.line, ", column ", b.column, ": ",
           std::string(e.description()));
    }
    collect(file_table, "config '" + path + "'", entries);
  }
  // Overrides: parse "a.b=value" as the TOML document "[a]\nb = value"; a bare word that is not
  // valid TOML is taken as a string, so --set data.dir=data/x works without quotes.
  std::vector<toml::table> override_tables;
  override_tables.reserve(overrides.size());
  std::vector<std::pair<std::string, const toml::node*>> override_entries;
  for (const auto& o : overrides) {
    const auto eq = o.find('=');
    const auto dot = o.find('.');
    if (eq == std::string::npos || dot == std::string::npos || dot > eq)
      fail("override '", o, "': expected section.key=value, e.g. train.lr=3e-4");
    const std::string key = o.substr(0, eq), value = o.substr(eq + 1);
    const std::string section = key.substr(0, dot), name = key.substr(dot + 1);
    toml::table t;
    try {
      t = toml::parse("[" + section + "]\n" + name + " = " + value);
    } catch (const toml::parse_error&) {
      t = toml::parse("[" + section + "]\n" + name + " = " + toml_quote(value));
    }
    override_tables.push_back(std::move(t));
  }
  for (size_t i = 0; i < override_tables.size(); ++i)
    collect(override_tables[i], "override '" + overrides[i] + "'", override_entries);

  RunConfig c;
  // The base model first: the last model.name given (file, then overrides) wins.
  for (auto* list : {&entries, &override_entries})
    for (const auto& [key, node] : *list)
      if (key == "model.name") c.model_name = read_string(*node, key, "model.name");
  c.model = named_model(c.model_name);
  const std::string file_where = "config '" + path + "'";
  for (const auto& [key, node] : entries)
    if (key != "model.name") apply(c, key, *node, file_where);
  for (size_t i = 0; i < override_entries.size(); ++i) {
    const auto& [key, node] = override_entries[i];
    if (key != "model.name") apply(c, key, *node, "command line");
  }
  // Fine-tuning with no [model] key anywhere: the model is the one run.init_from's config.json
  // describes (what a user of a published model expects); any model key given means the config
  // describes the model itself, and a mismatch with the folder is refused when it is loaded.
  bool model_keys = false;
  for (auto* list : {&entries, &override_entries})
    for (const auto& e : *list)
      if (e.first.rfind("model.", 0) == 0) model_keys = true;
  if (!c.init_from.empty() && !model_keys) {
    c.model = read_hf_config(c.init_from);
    // The named base only matters for reading a saved config back: every model field is
    // written out, so this base is fully overridden.
    c.model_name = c.model.family == Family::Llama   ? "llama-tiny"
                   : c.model.family == Family::Qwen2   ? "qwen2-tiny"
                   : c.model.family == Family::Qwen3   ? "qwen3-tiny"
                   : c.model.family == Family::Mixtral ? "mixtral-tiny"
                   : c.model.family == Family::Qwen2Moe ? "qwen2-moe-tiny"
                   : c.model.family == Family::Qwen3Moe ? "qwen3-moe-tiny"
                                                       : "tiny";
  }
  c.validate();
  return c;
}

std::string to_toml(const RunConfig& cfg) {
  std::ostringstream os;
  std::string section;
  for (const auto& f : schema()) {
    const std::string s = f.key.substr(0, f.key.find('.'));
    if (s != section) {
      os << (section.empty() ? "" : "\n") << "[" << s << "]\n";
      section = s;
    }
    os << f.key.substr(f.key.find('.') + 1) << " = " << f.get(cfg) << "\n";
  }
  return os.str();
}

std::string config_reference_markdown() {
  RunConfig defaults;
  defaults.model = named_model(defaults.model_name);
  std::ostringstream os;
  os << "| key | type | default | meaning |\n| --- | --- | --- | --- |\n";
  for (const auto& f : schema())
    os << "| `" << f.key << "` | " << f.type << " | `" << f.get(defaults) << "` | " << f.doc
       << " |\n";
  return os.str();
}

}  // namespace tetrad
