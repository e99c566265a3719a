#include "tokenizer/bpe.h"

#include <queue>

namespace moeserve::tok {
namespace {

struct Symbol {
  int32_t id;
  int32_t prev;  // index into the symbol array, -1 at the ends
  int32_t next;
  bool alive;
};

// A merge candidate as it was when pushed; it is stale (skipped) if either
// symbol has since been merged into something else.
struct Candidate {
  int32_t rank;
  int32_t left;  // symbol index
  int32_t left_id;
  int32_t right_id;
  bool operator>(const Candidate& other) const {
    return rank != other.rank ? rank > other.rank : left > other.left;
  }
};

}  // namespace

void BpeMerger::add_merge(int32_t left, int32_t right, int32_t merged, int32_t rank) {
  merges_.try_emplace(key(left, right), Merge{rank, merged});
}

const BpeMerger::Merge* BpeMerger::find(int32_t left, int32_t right) const {
  auto it = merges_.find(key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeMerger::merge(std::vector<int32_t>& ids) const {
  if (ids.size() < 2) return;
  const auto n = static_cast<int32_t>(ids.size());
  std::vector<Symbol> symbols(ids.size());
  for (int32_t i = 0; i < n; ++i) symbols[i] = Symbol{ids[i], i - 1, i + 1 < n ? i + 1 : -1, true};

  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push_pair = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    if (const Merge* m = find(symbols[left].id, symbols[right].id)) {
      queue.push(Candidate{m->rank, left, symbols[left].id, symbols[right].id});
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = symbols[c.left];
    if (!left.alive || left.id != c.left_id || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    if (right.id != c.right_id) continue;
    // Checking ids is enough: a merge only ever makes a symbol's token longer,
    // so a symbol still holding the pushed id has not been touched since.
    left.id = find(c.left_id, c.right_id)->merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.left;
    push_pair(left.prev);
    push_pair(c.left);
  }

  ids.clear();
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].id);
}

}  // namespace moeserve::tok
