// The activation spec list's sizes and the views laid out from them (activation_layout.hpp).
#include "tetrad/parallel/activation_layout.hpp"

#include "tetrad/core/error.hpp"

namespace tetrad::parallel {

int64_t act_width(ActWidth w, const LocalDims& d) {
  switch (w) {
    case ActWidth::One: return 1;
    case ActWidth::Cx: return d.Cx;
    case ActWidth::Ay: return d.Ay;
    case ActWidth::QKVy: return d.QKVy;
    case ActWidth::Nhy: return d.nhy;
    case ActWidth::Nqk: return d.nqk;
    case ActWidth::QKn: return d.QKn;
    // The dense MLP's (fc, fc_act and their gradients): none in a mixture of experts, whose
    // experts' rows are kFW and kF wide.
    case ActWidth::FWy: return d.E > 0 ? 0 : d.FWy;
    case ActWidth::Fy: return d.E > 0 ? 0 : d.Fy;
    case ActWidth::Vy: return d.Vy;
    case ActWidth::MaxLinearOut: return d.max_linear_out();
    case ActWidth::E: return d.E;
    case ActWidth::kC: return d.kC;
    case ActWidth::kFW: return d.kFW;
    case ActWidth::kF: return d.kF;
    case ActWidth::sFW: return 2 * d.sF;
    case ActWidth::sF: return d.sF;
    case ActWidth::sC: return d.sF > 0 ? d.Cx : 0;
    case ActWidth::sG: return d.sF > 0 ? 1 : 0;
  }
  TETRAD_CHECK(false, "unknown activation width");
  return 0;
}

bool act_in_bf16(ActStore s, const LocalDims& d, bool bf16_activations) {
  if (!bf16_activations) return false;
  switch (s) {
    case ActStore::F32: return false;
    case ActStore::Bf16WithActs: case ActStore::OnlyBf16: return true;
    case ActStore::Bf16WithActsDense: case ActStore::Bf16Stash: return d.E == 0;
  }
  return false;
}

int64_t act_floats(int64_t N, ActWidth w, ActStore s, const LocalDims& d, bool bf16_activations) {
  const int64_t n = N * act_width(w, d);
  if (act_in_bf16(s, d, bf16_activations)) return (n + 1) / 2;
  return s == ActStore::OnlyBf16 ? 0 : n;
}

void check_sequence_shard(const ParallelOptions& o, const GridShape& g, int64_t tokens) {
  if (!o.sequence_shard || g.y() == 1) return;
  if (tokens % g.y() != 0)
    fail("parallel.sequence_shard: the ", tokens, " tokens of a micro-batch on this rank do not "
         "split evenly over Gy = ", g.y(), "; use a micro-batch x sequence length divisible by ",
         g.y(), " or parallel.sequence_shard = false");
  if (o.overlap.forward_chunks > 1)
    fail("parallel.sequence_shard with parallel.forward_chunks = ", o.overlap.forward_chunks,
         " is not implemented; set parallel.forward_chunks = 1 or parallel.sequence_shard = false");
}

ActRows act_rows(const LayerActSpec& t) {
  for (auto m : kSeqShardedLayerActs)
    if (t.f32 == m) return ActRows::SeqShard;
  return ActRows::All;
}

ActRows act_rows(const GlobalActSpec& t) {
  if (t.f32 == &ParallelActivations::dfull) return ActRows::OnlySeqShard;
  for (auto m : kSeqShardedGlobalActs)
    if (t.f32 == m) return ActRows::SeqShard;
  return ActRows::All;
}

int64_t act_rows_of(int64_t N, ActRows rows, int seq_shard) {
  TETRAD_CHECK(seq_shard >= 1 && N % seq_shard == 0, "sequence shard ", seq_shard, " of ", N, " tokens");
  switch (rows) {
    case ActRows::All: return N;
    case ActRows::SeqShard: return N / seq_shard;
    case ActRows::OnlySeqShard: return seq_shard > 1 ? N : 0;
  }
  return N;
}

bool act_kept(ActKeep k, Recompute mode) {
  switch (k) {
    case ActKeep::UnlessFull: return mode != Recompute::Full;
    case ActKeep::UnlessRecompute: return mode == Recompute::None;
    case ActKeep::Output: return true;
  }
  return true;
}

std::vector<LayerSlots> layer_slots(int n_layer, const LayerSplit& split, int p, int stage) {
  std::vector<LayerSlots> s(size_t(n_layer), p == 1 ? LayerSlots::Full : LayerSlots::None);
  if (p == 1) return s;
  for (int l = 0; l < n_layer; ++l)
    if (split.stage_of(l, p) == stage) s[size_t(l)] = LayerSlots::Full;
  for (int l = 0; l + 1 < n_layer; ++l)
    if (s[size_t(l)] == LayerSlots::None && s[size_t(l) + 1] == LayerSlots::Full)
      s[size_t(l)] = LayerSlots::Input;
  return s;
}

ActivationSizes activation_sizes(const ModelConfig& cfg, const GridShape& G, int64_t local_batch,
                                 int max_len, bool bf16_acts, Recompute mode,
                                 const std::vector<LayerSlots>& slots, int seq_shard,
                                 bool bf16_stash) {
  const int64_t N = local_batch * (max_len / G.c());  // the context axis cuts each sequence
  const LocalDims dims = LocalDims::of(cfg, G);
  ActivationSizes s;
  for (const LayerActSpec& t : kLayerActs) {
    const int64_t rows = act_rows_of(N, act_rows(t), seq_shard);
    const bool kept = t.keep == ActKeep::Output || act_kept(t.keep, mode);
    // A stashed tensor is bf16 only where a layer keeps it (and the stash is on); recomputed, it
    // lives in the scratch in fp32 like any other.
    const bool stash = t.store == ActStore::Bf16Stash && bf16_stash && kept &&
                       act_in_bf16(t.store, dims, bf16_acts);
    const ActStore store = t.store == ActStore::Bf16Stash && !stash ? ActStore::F32 : t.store;
    const int64_t floats = act_floats(rows, t.width, store, dims, bf16_acts);
    const int64_t work = stash ? rows * act_width(t.width, dims) : 0;
    s.layer.push_back({kept, floats, act_in_bf16(store, dims, bf16_acts), work});
    (kept ? s.layer_kept : s.scratch) += floats;
    s.scratch += work;
    if (t.keep == ActKeep::Output) s.input_slot += floats;
  }
  for (const GlobalActSpec& t : kGlobalActs) {
    const int64_t floats = act_floats(act_rows_of(N, act_rows(t), seq_shard), t.width, t.store, dims, bf16_acts);
    s.globals.push_back(floats);
    s.global += floats;
    if (t.part == ActPart::Embedding) s.embedding_out += floats;
    if (t.part == ActPart::Head) s.head_kept += floats;
  }
  for (LayerSlots k : slots) {
    s.full_layers += k == LayerSlots::Full;
    s.input_layers += k == LayerSlots::Input;
  }
  s.total = s.scratch + s.full_layers * s.layer_kept + s.input_layers * s.input_slot + s.global;
  return s;
}

namespace {
uint16_t* as16(float* p) { return reinterpret_cast<uint16_t*>(p); }

// Points the views of one tensor at p: the bf16 one where it is stored in bf16, else the fp32 one.
template <typename Views, typename Spec>
void point(Views& v, const Spec& t, float* p, int64_t n, bool in_bf16) {
  if (in_bf16) v.*(t.bf16) = as16(p);
  else if (t.f32 && (act_rows(t) != ActRows::OnlySeqShard || n > 0)) v.*(t.f32) = p;
}
}  // namespace

std::vector<StashedTensor> stashed_tensors(const LayerActs& A, int64_t N, const LocalDims& d,
                                           int seq_shard) {
  std::vector<StashedTensor> r;
  for (const LayerActSpec& t : kLayerActs)
    if (t.store == ActStore::Bf16Stash && A.*(t.bf16)) {
      const int64_t n = act_rows_of(N, act_rows(t), seq_shard) * act_width(t.width, d);
      if (n > 0) r.push_back({A.*(t.f32), A.*(t.bf16), n});
    }
  return r;
}

ParallelActivations lay_out_activations(float* base, const ActivationSizes& sz,
                                        const std::vector<LayerSlots>& slots, bool b16) {
  ParallelActivations a;
  float* cur = base;
  auto take = [&](int64_t n) { float* p = cur; cur += n; return p; };
  float* const scratch = take(sz.scratch);
  a.layer.resize(slots.size());
  for (size_t l = 0; l < slots.size(); ++l) {
    LayerActs& A = a.layer[l];
    a.layer_begin.push_back(cur);
    // A pipeline stage holds only the layers it runs, and the output slot of the layer before
    // each of its chunks (the chunk's input arrives there); other layers have no memory here.
    if (slots[l] == LayerSlots::None) continue;
    float* sc = scratch;
    for (size_t i = 0; i < std::size(kLayerActs); ++i) {
      const LayerActSpec& t = kLayerActs[i];
      if (slots[l] == LayerSlots::Input && t.keep != ActKeep::Output) continue;
      // Kept tensors get their own memory per layer; recomputed ones share one layer's scratch.
      float* p;
      if (sz.layer[i].kept) {
        p = take(sz.layer[i].floats);
      } else {
        p = sc;
        sc += sz.layer[i].floats;
      }
      point(A, t, p, sz.layer[i].floats, sz.layer[i].bf16);
      if (t.store == ActStore::Bf16Stash && sz.layer[i].bf16) {
        // Kept in bf16 above; the fp32 working copy in the scratch.
        A.*(t.f32) = sc;
        sc += sz.layer[i].work;
      }
    }
    TETRAD_CHECK(slots[l] == LayerSlots::Input || sc == scratch + sz.scratch);
  }
  a.layer_begin.push_back(cur);  // end of the layers: the top-level activations follow
  for (size_t i = 0; i < std::size(kGlobalActs); ++i) {
    const GlobalActSpec& t = kGlobalActs[i];
    float* p = take(sz.globals[i]);
    point(a, t, p, sz.globals[i], b16 && t.store != ActStore::F32);
    ParallelActivations::Range* r = t.part == ActPart::Embedding ? &a.embedding_end
                                    : t.part == ActPart::Head    ? &a.head_end
                                                                 : nullptr;
    if (r) {
      TETRAD_CHECK(!r->begin || r->begin + r->floats == p, "activation part not contiguous: ", t.name);
      if (!r->begin) r->begin = p;
      r->floats += sz.globals[i];
    }
    if (t.bf16 == &ParallelActivations::dout16) a.dout16_floats = sz.globals[i];
  }
  TETRAD_CHECK(cur == base + sz.total);
  return a;
}

}  // namespace tetrad::parallel
