#include "spec/ngram_drafter.h"

#include <algorithm>

namespace moeserve::spec {

void NgramDrafter::draft(std::span<const int32_t> context, int64_t max_tokens, std::vector<int32_t>& out) {
  out.clear();
  const int64_t len = int64_t(context.size());
  if (max_tokens <= 0) return;
  for (int64_t n = std::min<int64_t>(max_, len - 1); n >= min_; --n) {
    const std::span<const int32_t> suffix = context.subspan(size_t(len - n));
    // The latest earlier occurrence: recent text predicts best (an edit
    // repeats the lines just above, not the file's first copy).
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (context[size_t(start)] != suffix[0] ||
          !std::equal(suffix.begin(), suffix.end(), context.begin() + start)) {
        continue;
      }
      const int64_t from = start + n;
      const int64_t count = std::min(max_tokens, len - from);
      out.assign(context.begin() + from, context.begin() + from + count);
      return;
    }
  }
}

runtime::DrafterFactory drafter_factory() {
  return [](const runtime::SpecConfig& c) -> std::unique_ptr<runtime::Drafter> {
    if (c.mode == runtime::SpecMode::kNgram || c.mode == runtime::SpecMode::kAuto) {
      return std::make_unique<NgramDrafter>(c.ngram_min, c.ngram_max);
    }
    return nullptr;
  };
}

}  // namespace moeserve::spec
