#include "server/spec_metrics.h"

#include <fmt/format.h>

#include "server/api/metrics.h"

namespace moeserve::server {

std::string speculative_prometheus(const runtime::EngineStats& stats) {
  using runtime::SpecCounters;
  using runtime::SpecMode;
  struct Series {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const SpecCounters&);
  };
  static const Series kSeries[] = {
      {"spec_steps_total", "counter", "Decode steps that verified a draft, by speculative mode.",
       [](const SpecCounters& c) { return double(c.steps); }},
      {"spec_draft_tokens_total", "counter", "Draft tokens verified.",
       [](const SpecCounters& c) { return double(c.drafted); }},
      {"spec_accepted_tokens_total", "counter", "Draft tokens accepted (kept in the output).",
       [](const SpecCounters& c) { return double(c.accepted); }},
      {"spec_rollbacks_total", "counter",
       "Recurrent-state rollbacks (snapshot restored, accepted tokens fed again).",
       [](const SpecCounters& c) { return double(c.replays); }},
      {"spec_acceptance_length", "gauge", "Mean tokens a verify step yields (accepted drafts + 1).",
       [](const SpecCounters& c) { return c.mean_acceptance_length(); }},
      {"spec_draft_seconds_total", "counter", "Seconds spent drafting.",
       [](const SpecCounters& c) { return c.draft_seconds; }},
      {"spec_verify_seconds_total", "counter", "Seconds of forward time spent on draft rows.",
       [](const SpecCounters& c) { return c.verify_seconds; }},
  };
  std::string out;
  for (const Series& s : kSeries) {
    out += fmt::format("# HELP moeserve_{} {}\n# TYPE moeserve_{} {}\n", s.name, s.help, s.name, s.type);
    for (SpecMode m : {SpecMode::kNgram, SpecMode::kDflash, SpecMode::kAuto}) {
      out += fmt::format("moeserve_{}{{mode=\"{}\"}} {}\n", s.name, runtime::spec_mode_name(m),
                         api::format_metric_value(s.value(stats.spec[size_t(m)])));
    }
  }
  return out;
}

}  // namespace moeserve::server
