// The identity of a model file for reusing its KV rows (the prefix cache's
// disk tier): rows computed by one file are valid for another only if both
// compute the same function. Names, types and shapes are not enough — two
// fine-tunes of one architecture at one quantization have identical
// layouts — so the fingerprint also covers the metadata (RoPE base, norm
// epsilon, ...) and samples every tensor's data.
#pragma once

#include <cstdint>

#include "format/gguf.h"

namespace moeserve::runtime {

// Bumped when the meaning of stored rows changes (the f16 K/V layout, the
// recurrent state order): files of older versions stop matching.
inline constexpr uint64_t kKvFormatVersion = 1;

// hash64 over the file's header (metadata and tensor infos: name, type,
// shape, offset), each tensor's first, middle and last 4 KiB of data (all
// of a smaller tensor) and kKvFormatVersion. Reads a few pages per tensor
// of the mapping: milliseconds at load.
uint64_t kv_fingerprint(const GgufFile& file);

}  // namespace moeserve::runtime
