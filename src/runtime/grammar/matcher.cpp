#include "runtime/grammar/matcher.h"

#include <algorithm>
#include <cstring>

namespace moeserve::runtime::grammar {
namespace {

// Buffers reused by every feed on a thread: a feed runs per candidate byte
// while masking the vocabulary, so it must not allocate in the common case.
struct Scratch {
  std::vector<uint32_t> pending;  // stacks to expand, each followed by its length
  std::vector<uint32_t> cur;      // the stack being expanded
  std::vector<uint32_t> out;      // expanded stacks: length, then positions
  std::vector<uint32_t> seen;     // kLoop guard: length, rule, positions
  std::vector<uint32_t> spans;    // offsets of the stacks in `out`
  std::vector<uint32_t> canon;    // the new canonical set, before it replaces the old
};
thread_local Scratch t_scratch;
thread_local uint64_t t_steps = 0;

// Whether the loop of `rule` was already entered with this stack below it in
// this closure; if not, records it. Going round again could only produce the
// stacks the first round produces.
bool loop_seen(Scratch& s, uint32_t rule) {
  const std::vector<uint32_t>& c = s.cur;
  for (size_t i = 0; i < s.seen.size(); i += 2 + s.seen[i]) {
    if (s.seen[i] == c.size() && s.seen[i + 1] == rule &&
        std::equal(c.begin(), c.end(), s.seen.begin() + ptrdiff_t(i + 2))) {
      return true;
    }
  }
  s.seen.push_back(uint32_t(c.size()));
  s.seen.push_back(rule);
  s.seen.insert(s.seen.end(), c.begin(), c.end());
  return false;
}

// Expands every pending stack until its top is a byte set (or it is empty),
// appending the results to s.out. False when a bound was passed.
bool closure(const Grammar& g, Scratch& s) {
  size_t steps = 0;
  struct Meter {  // counts the steps however the closure ends
    size_t& steps;
    ~Meter() { t_steps += steps; }
  } meter{steps};
  while (!s.pending.empty()) {
    const uint32_t len = s.pending.back();
    s.pending.pop_back();
    s.cur.assign(s.pending.end() - len, s.pending.end());
    s.pending.resize(s.pending.size() - len);
    while (true) {
      if (++steps > GrammarState::kMaxClosureSteps) return false;
      if (s.cur.empty()) {
        s.out.push_back(0);
        break;
      }
      const uint32_t pos = s.cur.back();
      const uint32_t e = g.elem(pos);
      const ElemKind kind = elem_kind(e);
      if (kind == ElemKind::kEnd) {  // the rule returns to the position below
        s.cur.pop_back();
        continue;
      }
      if (kind == ElemKind::kBytes) {
        s.out.push_back(uint32_t(s.cur.size()));
        s.out.insert(s.out.end(), s.cur.begin(), s.cur.end());
        break;
      }
      // A rule: its return position replaces it, except in a tail call
      // (nothing follows it), which keeps right recursion at constant depth.
      s.cur.pop_back();
      if (elem_kind(g.elem(pos + 1)) != ElemKind::kEnd) s.cur.push_back(pos + 1);
      const uint32_t rule = elem_index(e);
      if (kind == ElemKind::kLoop && loop_seen(s, rule)) break;
      const auto alts = g.alternatives(rule);
      if (alts.empty() || s.cur.size() >= GrammarState::kMaxStackDepth) return false;
      steps += alts.size() - 1;
      for (size_t i = 1; i < alts.size(); ++i) {
        s.pending.insert(s.pending.end(), s.cur.begin(), s.cur.end());
        s.pending.push_back(alts[i]);
        s.pending.push_back(uint32_t(s.cur.size() + 1));
      }
      s.cur.push_back(alts[0]);
      if (s.pending.size() + s.out.size() > GrammarState::kMaxClosureWords) return false;
    }
  }
  return true;
}

// Sorts and deduplicates the stacks of s.out into `to`.
bool canonical(Scratch& s, std::vector<uint32_t>& to) {
  s.spans.clear();
  for (size_t i = 0; i < s.out.size(); i += 1 + s.out[i]) s.spans.push_back(uint32_t(i));
  const uint32_t* base = s.out.data();
  const auto less = [base](uint32_t a, uint32_t b) {
    if (base[a] != base[b]) return base[a] < base[b];
    return std::lexicographical_compare(base + a + 1, base + a + 1 + base[a], base + b + 1,
                                        base + b + 1 + base[b]);
  };
  const auto equal = [base](uint32_t a, uint32_t b) {
    return base[a] == base[b] && std::memcmp(base + a + 1, base + b + 1, base[a] * sizeof(uint32_t)) == 0;
  };
  std::sort(s.spans.begin(), s.spans.end(), less);
  s.spans.erase(std::unique(s.spans.begin(), s.spans.end(), equal), s.spans.end());
  if (s.spans.size() > GrammarState::kMaxStacks) return false;
  to.clear();
  for (const uint32_t at : s.spans) to.insert(to.end(), base + at, base + at + 1 + base[at]);
  return true;
}

// Gives memory back after a pathological closure, keeping ordinary sizes.
void trim(Scratch& s) {
  constexpr size_t kKeep = size_t(1) << 16;
  if (s.pending.capacity() > kKeep) std::vector<uint32_t>().swap(s.pending);
  if (s.out.capacity() > kKeep) std::vector<uint32_t>().swap(s.out);
  if (s.seen.capacity() > kKeep) std::vector<uint32_t>().swap(s.seen);
  if (s.canon.capacity() > kKeep) std::vector<uint32_t>().swap(s.canon);
}

}  // namespace

uint64_t closure_steps_on_this_thread() { return t_steps; }

GrammarState::GrammarState(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
  if (!grammar_) return;
  Scratch& s = t_scratch;
  s.pending.clear();
  s.out.clear();
  s.seen.clear();
  for (const uint32_t alt : grammar_->alternatives(grammar_->root())) {
    s.pending.push_back(alt);
    s.pending.push_back(1);
  }
  if (!closure(*grammar_, s) || !canonical(s, stacks_)) stacks_.clear();
  trim(s);
}

bool GrammarState::feed(uint8_t byte) {
  if (!grammar_) return false;
  const Grammar& g = *grammar_;
  Scratch& s = t_scratch;
  s.pending.clear();
  s.out.clear();
  s.seen.clear();
  for (size_t i = 0; i < stacks_.size(); i += 1 + stacks_[i]) {
    const uint32_t len = stacks_[i];
    if (len == 0) continue;
    const uint32_t top = stacks_[i + len];
    if (!g.byte_set(elem_index(g.elem(top))).test(byte)) continue;
    s.pending.insert(s.pending.end(), stacks_.begin() + ptrdiff_t(i + 1),
                     stacks_.begin() + ptrdiff_t(i + len));
    s.pending.push_back(top + 1);
    s.pending.push_back(len);
  }
  if (s.pending.empty()) return false;
  const bool ok = closure(g, s) && canonical(s, s.canon) && !s.canon.empty();
  if (ok) stacks_.assign(s.canon.begin(), s.canon.end());  // reuses the state's buffer
  trim(s);
  return ok;
}

bool GrammarState::feed_all(std::string_view bytes) {
  GrammarState next = *this;
  for (const char c : bytes) {
    if (!next.feed(uint8_t(c))) return false;
  }
  *this = std::move(next);
  return true;
}

ByteSet GrammarState::next_bytes() const {
  ByteSet out;
  for (size_t i = 0; i < stacks_.size(); i += 1 + stacks_[i]) {
    if (stacks_[i] > 0) out |= grammar_->byte_set(elem_index(grammar_->elem(stacks_[i + stacks_[i]])));
  }
  return out;
}

size_t GrammarState::stack_count() const {
  size_t n = 0;
  for (size_t i = 0; i < stacks_.size(); i += 1 + stacks_[i]) ++n;
  return n;
}

uint64_t GrammarState::fingerprint() const {
  uint64_t h = 0x84222325CBF29CE4ull ^ stacks_.size();
  for (const uint32_t w : stacks_) {
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
  }
  return h;
}

}  // namespace moeserve::runtime::grammar
