#include "runtime/expert_promotion.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <system_error>

namespace moeserve::runtime {

std::vector<ExpertSwap> plan_swaps(const backend::ExpertSplit& split, int layer, const PromotionOptions& o) {
  std::vector<ExpertSwap> out;
  const std::span<const int32_t> local = split.local();
  if (local.empty() || split.all_local()) return out;
  std::vector<int32_t> cold;
  for (int32_t e = 0; e < int32_t(split.n_expert()); ++e) {
    if (!split.is_local(e)) cold.push_back(e);
  }
  std::vector<size_t> slots(local.size());
  for (size_t i = 0; i < slots.size(); ++i) slots[i] = i;
  // Busiest cold first, idlest hot first; ties to the lower id (deterministic).
  std::stable_sort(cold.begin(), cold.end(), [&](int32_t a, int32_t b) {
    return split.window_selections(a) > split.window_selections(b);
  });
  std::stable_sort(slots.begin(), slots.end(), [&](size_t a, size_t b) {
    const int64_t ca = split.window_selections(local[a]), cb = split.window_selections(local[b]);
    return ca != cb ? ca < cb : local[a] < local[b];
  });
  const size_t n = std::min({cold.size(), slots.size(), size_t(std::max(o.max_swaps_per_layer, 0))});
  for (size_t i = 0; i < n; ++i) {
    const int64_t in = split.window_selections(cold[i]), out_count = split.window_selections(local[slots[i]]);
    if (in < o.min_selections || double(in) < (1.0 + o.margin) * double(out_count)) break;
    out.push_back({layer, slots[i], cold[i], local[slots[i]], in, out_count});
  }
  return out;
}

namespace {

// A whole number, the whole text (no sign, spaces or suffix).
bool parse_count(const std::string& text, int64_t* out) {
  if (text.empty() || text[0] == '-' || text[0] == '+') return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

}  // namespace

Result<PromotionSchedule> parse_promotion_flags(const PromotionFlags& flags) {
  PromotionSchedule s;
  int64_t every = 0;
  if (flags.every == "idle") {
    s.between_requests = true;
  } else if (flags.every != "off" && !parse_count(flags.every, &every)) {
    return make_error(StatusCode::kInvalidArgument,
                      "--expert-promotion {}: expected a number of tokens, idle (between requests) or off",
                      flags.every);
  }
  s.every_tokens = every;
  if (!parse_count(flags.min_selections, &s.thresholds.min_selections) || s.thresholds.min_selections < 1) {
    return make_error(StatusCode::kInvalidArgument,
                      "--expert-promotion-min {}: expected a whole number of selections, at least 1",
                      flags.min_selections);
  }
  // Decimal text only (strtod would also take spaces, hex, nan and inf).
  const std::string& m = flags.margin;
  char* end = nullptr;
  const double margin = std::strtod(m.c_str(), &end);
  if (m.empty() || m.find_first_not_of("0123456789.eE+-") != std::string::npos ||
      end != m.c_str() + m.size() || !std::isfinite(margin) || margin < 0.0) {
    return make_error(
        StatusCode::kInvalidArgument,
        "--expert-promotion-margin {}: expected a number of at least 0 (0.5: a cold expert must "
        "be selected 1.5x as often as the hot one it replaces)",
        m);
  }
  s.thresholds.margin = margin;
  return s;
}

}  // namespace moeserve::runtime
