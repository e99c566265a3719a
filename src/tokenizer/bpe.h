// Byte-pair merging of one pre-tokenized piece.
//
// A piece starts as one symbol per byte (the id of that byte's byte-level
// token). Repeatedly, the adjacent pair with the lowest merge rank is replaced
// by its merged token, the leftmost one first when ranks tie — the order the
// Hugging Face BPE model uses. A min-heap of candidate pairs over a linked
// list of symbols makes this O(n log n) in the piece length.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace moeserve::tok {

class BpeMerger {
 public:
  // Later additions of an already known pair are ignored (the first, lowest
  // rank wins), as in the reference implementations.
  void add_merge(int32_t left, int32_t right, int32_t merged, int32_t rank);
  size_t merge_count() const { return merges_.size(); }

  // Replaces `symbols` (initial ids) by the merged ids.
  void merge(std::vector<int32_t>& symbols) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  static uint64_t key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  const Merge* find(int32_t left, int32_t right) const;

  std::unordered_map<uint64_t, Merge> merges_;
};

}  // namespace moeserve::tok
