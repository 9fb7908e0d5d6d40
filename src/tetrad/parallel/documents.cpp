// ParallelTransformer's documents (parallel_transformer.hpp, set_documents): the options
// data.document_mask / data.document_positions checked against the backend, and each
// micro-batch's document starts found among the registered tokens, checked and put on the device
// for the attention and rotary ops (StepContext::docs).
#include <cstdint>
#include <functional>

#include "tetrad/core/error.hpp"
#include "tetrad/parallel/context_split.hpp"
#include "tetrad/parallel/parallel_transformer.hpp"

namespace tetrad::parallel {

void ParallelTransformer::check_document_options() const {
  const backend::Backend& be = *ctx_.be;
  if (opt_.document_mask && !be.capabilities().attention_document_mask)
    fail("data.document_mask = true: backend '", be.name(), "' has no document-masked attention "
         "(Capabilities::attention_document_mask); run on a backend that has it or set "
         "data.document_mask = false");
}

void ParallelTransformer::set_documents(const int32_t* tokens, const int32_t* doc_start,
                                        int64_t n) {
  doc_tokens_ = tokens;
  doc_starts_ = doc_start;
  doc_n_ = tokens && doc_start ? n : 0;
}

void ParallelTransformer::select_documents(const int32_t* inputs, int B, int T) {
  MicroBatchDocuments& docs = ctx_.docs;
  docs.mask = opt_.document_mask;
  docs.positions = opt_.document_positions;
  docs.dev = docs.host = nullptr;
  if (!uses_documents()) return;
  const int64_t N = int64_t(B) * T;
  // Inside the registered range? (std::less: a total order on pointers into unrelated arrays.)
  const std::less<const int32_t*> before;
  if (doc_n_ == 0 || before(inputs, doc_tokens_) || before(doc_tokens_ + doc_n_ - N, inputs))
    fail("data.document_mask / data.document_positions: the model ran a batch of ", B, " x ", T,
         " tokens without its documents (ParallelTransformer::set_documents was not given "
         "these tokens)");
  const int32_t* rows = doc_starts_ + (inputs - doc_tokens_);
  // Each token's document begins at or before it, inside its sequence. Starts and positions are
  // of the whole sequence: with a context axis this rank's T tokens are its two chunks of it, at
  // their chunks' offsets (ContextSplit::position), in increasing order.
  const ContextSplit cs = ContextSplit::of(ctx_.shape(), ctx_.g().coord);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const int32_t s = rows[int64_t(b) * T + t];
      const int64_t pos = cs.position(t, T);
      if (s < 0 || s > pos || (t > 0 && s < rows[int64_t(b) * T + t - 1]))
        fail("document starts: token ", pos, " of sequence ", b, " says its document begins at ",
             s, " (expected 0..", pos, ", not before the previous token's)");
    }
  docs.host = rows;
  if (ctx_.be->capabilities().host_visible) {
    docs.dev = rows;
    return;
  }
  if (doc_dev_.bytes() < size_t(N) * sizeof(int32_t))
    doc_dev_ = ctx_.be->alloc(size_t(int64_t(local_batch_) * max_len_) * sizeof(int32_t));
  ctx_.bq().copy_to_device(doc_dev_.data(), rows, size_t(N) * sizeof(int32_t));
  docs.dev = doc_dev_.as<int32_t>();
}

}  // namespace tetrad::parallel
