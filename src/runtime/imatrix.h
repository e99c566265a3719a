// moeserve imatrix: the importance matrix of a model over a text
// (format/imatrix.h has the file). The text is cut into chunks of n_ctx
// tokens, as `moeserve perplexity` and llama.cpp's imatrix tool do (the
// first token of a chunk replaced by BOS when the vocabulary adds one); each
// chunk is run through the model from an empty cache, and for every weight
// of a layer ("blk.*") the inputs of its products are summed per column:
// x_j^2 and the number of rows, per expert for the stacked expert tensors
// (only the rows routed to an expert count toward it).
//
// The sums are taken by a backend::ActivationObserver on the CPU device, and
// a product's weight is recognised by its view's data pointer, which is the
// tensor's bytes in the file: so the model must run on the CPU with every
// weight in place (ModelLoadOptions: device "cpu", pack_weights false).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "core/status.h"
#include "format/imatrix.h"
#include "runtime/model.h"

namespace moeserve::runtime {

struct ImatrixOptions {
  int64_t n_ctx = 512;      // tokens per chunk (llama.cpp's -c)
  int64_t n_batch = 512;    // rows per forward
  int64_t max_chunks = -1;  // -1: every whole chunk of the text
  std::string dataset{};    // recorded in imatrix.datasets (the text's path)
};

// After each chunk: its index (from 0) and the number of chunks.
using ImatrixProgress = std::function<void(int64_t chunk, int64_t n_chunks)>;

// kInvalidArgument when the text has fewer than n_ctx tokens or n_ctx < 2;
// kUnsupported when the model is not on the CPU with its weights in place.
Result<Imatrix> collect_imatrix(Model& model, std::span<const int32_t> tokens, const ImatrixOptions& o,
                                const ImatrixProgress& progress = {});

}  // namespace moeserve::runtime
