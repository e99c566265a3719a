// moeserve bench -m FILE [-p 512] [-n 128] [-r 3]: prefill (pp) and decode
// (tg) throughput measured separately, as llama-bench does: pp runs p prompt
// tokens from an empty cache in chunks of --batch; tg decodes n tokens one at
// a time from an empty cache. Each is repeated r times: mean +- stddev tok/s.
#include <fmt/format.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/memory_bandwidth.h"
#include "kernels/gpu_api.h"
#include "runtime/generator.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "spec/drafter_factory.h"
#include "tools/moeserve/bench_hybrid.h"
#include "tools/moeserve/bench_parallel.h"
#include "tools/moeserve/bench_spec.h"
#include "tools/moeserve/commands.h"
#include "tools/moeserve/expert_flags.h"
#include "tools/moeserve/expert_worker_flags.h"
#include "tools/moeserve/spec_flags.h"
#include "tools/moeserve/split_flags.h"

namespace moeserve::tools {
namespace {

struct BenchOptions {
  std::string model_path;
  int64_t n_prompt = 512, n_gen = 128, batch = 512;
  int repetitions = 3, threads = 0;
  bool json = false, profile = false, no_pack = false;
  std::string device = "auto";
  moe::ExpertPolicyOptions experts;  // --placement, --n-cpu-moe, --cpu-moe, --gpu-mem
  ExpertWorkerCliOptions worker;     // --expert-worker ...
  std::string expert_backend = "tiled";
  std::vector<int64_t> parallel;  // aggregate decode with this many sequences
  int64_t parallel_prompt = 16;   // ... each holding this many positions first
  int64_t parallel_chunk = 0;     // ... each step beside a prompt chunk of this many rows
  int64_t kv_block = 0;           // ... in a paged pool of blocks of this many positions (0: contiguous)
  SpecCliOptions spec;            // --spec ...: speculative against plain decoding
  LayerSplitFlags layer_split;    // --layer-split SPEC, --micro-batches N
  std::string spec_prompts;       // --spec-prompts FILE
};

struct Stats {
  double mean = 0, stddev = 0;
};

Stats stats(const std::vector<double>& v) {
  Stats s;
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= double(v.size());
  for (double x : v) s.stddev += (x - s.mean) * (x - s.mean);
  s.stddev = v.size() > 1 ? std::sqrt(s.stddev / double(v.size() - 1)) : 0.0;
  return s;
}

double peak_rss_gib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / (1024.0 * 1024.0);  // ru_maxrss is KiB on Linux
}

// CPU time the hypervisor gave to other guests ("steal", /proc/stat), as a
// share of all CPU time since `since` was read: on a shared VM, runs with
// much steal measure the neighbours, not us. -1 when unknown.
struct CpuTimes {
  uint64_t steal = 0, total = 0;
  bool ok = false;
};
CpuTimes read_cpu_times() {
  CpuTimes t;
  std::FILE* f = std::fopen("/proc/stat", "r");
  if (f == nullptr) return t;
  unsigned long long v[8] = {};
  t.ok = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
                     &v[5], &v[6], &v[7]) == 8;
  std::fclose(f);
  for (unsigned long long x : v) t.total += x;
  t.steal = v[7];
  return t;
}
double steal_percent(const CpuTimes& since) {
  const CpuTimes now = read_cpu_times();
  if (!since.ok || !now.ok || now.total <= since.total) return -1.0;
  return 100.0 * double(now.steal - since.steal) / double(now.total - since.total);
}

// Decode reads every active weight once per token, so the read bandwidth of
// the moment bounds it: bound = bandwidth / active bytes per token.
void print_decode_bound(double bw_before, double bw_after, double active_gb, double tg_tok_s) {
  const double lo = std::min(bw_before, bw_after), hi = std::max(bw_before, bw_after);
  if (lo <= 0.0 || active_gb <= 0.0) return;
  fmt::print("memory read bandwidth before/after the runs: {:.1f} / {:.1f} GB/s", bw_before, bw_after);
  if (tg_tok_s > 0.0) {
    fmt::print("; decode bound {:.0f}-{:.0f} tok/s, tg is {:.0f}-{:.0f}% of it", lo / active_gb,
               hi / active_gb, 100.0 * tg_tok_s * active_gb / hi, 100.0 * tg_tok_s * active_gb / lo);
  }
  fmt::print("\n");
}

// On a GPU: the HBM roofline of decode (active weight bytes per token over
// the measured device-memory bandwidth). Returns the bandwidth (0: unknown).
double print_device_bound(runtime::Model& model, double active_gb, double tg_tok_s) {
  const std::string name = model.device().name();
  const int index = name.rfind(':') != std::string::npos ? std::stoi(name.substr(name.rfind(':') + 1)) : 0;
  Result<double> bw = gpu::measure_device_bandwidth(index);
  fmt::print("device: {} ({})\n", name, model.device().description());
  if (!bw.is_ok() || active_gb <= 0.0) return 0.0;
  fmt::print("device memory bandwidth (copy, read + write): {:.0f} GB/s", *bw);
  if (tg_tok_s > 0.0) {
    fmt::print("; decode roofline {:.0f} tok/s ({:.3f} GB active per token), tg is {:.1f}% of it",
               *bw / active_gb, active_gb, 100.0 * tg_tok_s * active_gb / *bw);
  }
  fmt::print("\n");
  return *bw;
}

// Each part's share; with `steps` forwards, also the split's boundary copy per forward.
std::string profile_line(const models::ForwardProfile& p, int64_t steps) {
  const double tot = double(std::max<int64_t>(p.total(), 1));
  auto pct = [&](int64_t v) { return 100.0 * double(v) / tot; };
  std::string line = fmt::format(
      "attn_proj {:.1f}% attention {:.1f}% router {:.1f}% experts {:.1f}% dense_ffn {:.1f}% "
      "lm_head {:.1f}% embed {:.1f}% other {:.1f}%",
      pct(p.attn_proj), pct(p.attention), pct(p.router), pct(p.experts), pct(p.dense_ffn), pct(p.lm_head),
      pct(p.embed), pct(p.other));
  if (p.boundary > 0) {
    line += fmt::format(" layer-split boundary {:.1f}% ({:.3f} ms a forward)", pct(p.boundary),
                        double(p.boundary) * 1e-6 / double(std::max<int64_t>(steps, 1)));
  }
  return line;
}

Status run_bench(const BenchOptions& o) {
  using Clock = std::chrono::steady_clock;
  MOESERVE_ASSIGN_OR_RETURN(const runtime::SpecConfig spec_config, resolve_spec_flags(o.spec));
  // The memory bandwidth of the moment: before loading the model (so that the
  // probe's buffer does not add to the peak RSS reported) and after the runs.
  auto read_bandwidth = [&](ThreadPool& pool) {
    Result<double> r = measure_read_bandwidth({.pool = &pool});
    return r.is_ok() ? *r : 0.0;  // a machine short of 256 MiB just gets no bound line
  };
  double bw_before = 0.0;
  {
    ThreadPool probe_pool(o.threads);
    bw_before = read_bandwidth(probe_pool);
  }
  runtime::ModelLoadOptions load{.n_threads = o.threads, .pack_weights = !o.no_pack, .device = o.device};
  moe::ExpertPolicyOptions experts = o.experts;
  experts.with_expert_worker = !o.worker.worker.empty();
  MOESERVE_RETURN_IF_ERROR(apply_expert_flags(o.model_path, experts, &load));
  LayerSplitProcesses shard_processes;  // declared before the model: it outlives it
  MOESERVE_RETURN_IF_ERROR(apply_layer_split(o.model_path, o.layer_split, o.device, &load, &shard_processes));
  MOESERVE_ASSIGN_OR_RETURN(
      std::unique_ptr<ipc::WorkerExpertBackend> worker,
      apply_expert_worker_flags(o.model_path, o.experts.placement_path, o.worker, &load));
  MOESERVE_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Model> model, runtime::Model::load(o.model_path, load));
  MOESERVE_ASSIGN_OR_RETURN(std::shared_ptr<runtime::DraftSource> draft_model,
                            load_draft_model(o.spec, model->net(), o.model_path));
  const models::ModelInfo& info = model->info();
  // The per-expert variant is only for comparing dispatch strategies.
  backend::PerExpertMatmulBackend per_expert(&model->pool());
  if (o.expert_backend == "per-expert") model->cpu_device().set_expert_backend(&per_expert);
  HybridHits hits(*model), pp_hits(*model);
  models::ForwardProfile pp_prof, tg_prof;
  runtime::Generator gen(*model, std::max<int64_t>(o.n_prompt, o.n_gen) + 1);
  MOESERVE_RETURN_IF_ERROR(gen.status());
  std::mt19937 rng(42);
  std::vector<int32_t> prompt(size_t(o.n_prompt));
  for (int32_t& t : prompt) t = int32_t(rng() % uint32_t(model->tokenizer().vocab_size()));
  std::vector<double> pp, tg, ttft;
  // The expert worker's share of the timed runs, per phase.
  ipc::WorkerMetrics pp_worker, tg_worker;
  auto worker_now = [&] { return worker != nullptr ? worker->metrics() : ipc::WorkerMetrics{}; };
  auto add_phase = [](ipc::WorkerMetrics& sum, const ipc::WorkerMetrics& d) {
    sum.batches += d.batches;
    sum.calls += d.calls;
    sum.payload_bytes += d.payload_bytes;
    sum.wait_ns += d.wait_ns;
    sum.worker_us += d.worker_us;
    sum.fallbacks += d.fallbacks;
    sum.restarts += d.restarts;
    sum.stream_batches += d.stream_batches;
  };
  // Prefill and decode end with the greedy choice as `generate --temp 0`
  // does (the arg-max over the logits, on the model's device, is part of a
  // step's cost; only the token id comes back).
  int32_t next = 0;
  const CpuTimes cpu_at_start = read_cpu_times();
  auto set_profile = [&](models::ForwardProfile* p) { gen.set_profile(o.profile ? p : nullptr); };
  // One untimed warm-up of each (page in the weights, grow scratch buffers).
  for (int rep = -1; rep < o.repetitions; ++rep) {
    if (o.n_prompt > 0) {
      set_profile(rep >= 0 ? &pp_prof : nullptr);
      gen.sequence().clear();
      if (rep >= 0) pp_hits.start();
      const ipc::WorkerMetrics w0 = worker_now();
      const auto t0 = Clock::now();
      MOESERVE_RETURN_IF_ERROR(gen.prefill_greedy(prompt, o.batch, &next));
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (rep >= 0) pp_hits.stop();
      if (rep >= 0) add_phase(pp_worker, ipc::difference(worker_now(), w0));
      if (rep >= 0) pp.push_back(double(o.n_prompt) / s), ttft.push_back(s * 1e3);
    }
    if (o.n_gen > 0) {
      set_profile(rep >= 0 ? &tg_prof : nullptr);
      gen.sequence().clear();
      int32_t tok = prompt.empty() ? 0 : prompt[0];
      if (rep >= 0) hits.start();
      const ipc::WorkerMetrics w0 = worker_now();
      const auto t0 = Clock::now();
      for (int64_t i = 0; i < o.n_gen; ++i) {
        MOESERVE_RETURN_IF_ERROR(gen.decode_greedy(tok, &next));
        tok = next;
      }
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (rep >= 0) hits.stop();
      if (rep >= 0) add_phase(tg_worker, ipc::difference(worker_now(), w0));
      if (rep >= 0) tg.push_back(double(o.n_gen) / s);
    }
  }
  set_profile(nullptr);
  const double steal = steal_percent(cpu_at_start);
  const double peak_rss = peak_rss_gib();
  const double bw_after = read_bandwidth(model->pool());
  const Stats pps = stats(pp), tgs = stats(tg), tts = stats(ttft);
  const double size_gib = double(model->file().size()) / double(1 << 30);
  const uint64_t params = info.n_params;
  const double active_gb = double(info.active_bytes_per_token) / 1e9;
  if (o.json) {
    nlohmann::json j = {
        {"model", o.model_path},
        {"arch", info.arch},
        {"device", model->device().name()},
        {"size_bytes", model->file().size()},
        {"params", params},
        {"threads", model->pool().size()},
        {"batch", o.batch},
        {"active_bytes_per_token", info.active_bytes_per_token},
        {"pp",
         {{"n", o.n_prompt},
          {"tok_s_mean", pps.mean},
          {"tok_s_stddev", pps.stddev},
          {"ttft_ms", tts.mean},
          {"samples", pp}}},
        {"tg", {{"n", o.n_gen}, {"tok_s_mean", tgs.mean}, {"tok_s_stddev", tgs.stddev}, {"samples", tg}}},
        {"peak_rss_gib", peak_rss},
        {"cpu_steal_percent", steal},
        {"read_bandwidth_gb_s", {bw_before, bw_after}}};
    fmt::print("{}\n", j.dump(2));
    return Status::ok();
  }
  fmt::print("| model | size | params | threads | test | t/s |\n|---|---:|---:|---:|---:|---:|\n");
  const std::string name = fmt::format("{} {}L", info.arch, info.n_layer);
  if (o.n_prompt > 0) {
    fmt::print("| {} | {:.2f} GiB | {:.2f} B | {} | pp{} | {:.2f} ± {:.2f} |\n", name, size_gib,
               double(params) / 1e9, model->pool().size(), o.n_prompt, pps.mean, pps.stddev);
  }
  if (o.n_gen > 0) {
    fmt::print("| {} | {:.2f} GiB | {:.2f} B | {} | tg{} | {:.2f} ± {:.2f} |\n", name, size_gib,
               double(params) / 1e9, model->pool().size(), o.n_gen, tgs.mean, tgs.stddev);
  }
  fmt::print(
      "\ntime to first token (pp{}): {:.1f} ± {:.1f} ms; peak RSS {:.2f} GiB; active weights {:.3f} "
      "GB/token\n",
      o.n_prompt, tts.mean, tts.stddev, peak_rss, active_gb);
  if (steal >= 0.0) {
    fmt::print(
        "cpu steal during the runs: {:.1f}%{}\n", steal,
        steal > 5.0 ? " (the hypervisor ran other guests on our CPUs: these numbers understate us)" : "");
  }
  double bw = 0.0;  // GB/s of the memory the weights are read from
  if (model->device().host_memory()) {
    print_decode_bound(bw_before, bw_after, active_gb, o.n_gen > 0 ? tgs.mean : 0.0);
    bw = std::min(bw_before, bw_after);
  } else {
    bw = print_device_bound(*model, active_gb, o.n_gen > 0 && !hits.any() ? tgs.mean : 0.0);
    // The better of the two reads: the host's bandwidth swings from run to
    // run on a shared machine, and the bound is what the memory can do.
    hits.print(bw, std::max(bw_before, bw_after), o.n_gen > 0 ? tgs.mean : 0.0);
    if (o.n_prompt > 0) pp_hits.print_prefill(pps.mean, o.n_prompt, o.repetitions);
  }
  for (int64_t n_seq : o.parallel) {
    const ParallelDecodeOptions po{.n_seq = n_seq,
                                   .n_gen = std::max<int64_t>(o.n_gen, 8),
                                   .n_prompt = o.parallel_prompt,
                                   .kv_block_rows = o.kv_block,
                                   .prompt_chunk = o.parallel_chunk};
    MOESERVE_ASSIGN_OR_RETURN(ParallelDecodeResult r, bench_parallel_decode(*model, po));
    const std::string chunk =
        o.parallel_chunk > 0 ? fmt::format(", each step beside a {}-row prompt chunk", o.parallel_chunk) : "";
    fmt::print("decode, {} sequences together{}{}: {:.1f} tok/s aggregate ({:.2f} ms per step of {} rows{})",
               n_seq, o.kv_block > 0 ? fmt::format(" (paged KV, blocks of {})", o.kv_block) : std::string(),
               chunk, r.tok_s, r.step_ms, n_seq,
               o.parallel_chunk > 0 ? fmt::format(" and {} prompt rows", o.parallel_chunk) : std::string());
    const double step_gb = decode_step_bytes(info, n_seq) / 1e9;
    // (No roofline for mixed steps: their prefill is compute, not reads.)
    if (bw > 0.0 && step_gb > 0.0 && o.parallel_chunk == 0) {
      const double roof = double(n_seq) * bw / step_gb;
      fmt::print(
          "; roofline {:.0f} tok/s ({:.3f} GB a step: the dense weights and the expected distinct experts of "
          "{} "
          "rows), {:.1f}% of it",
          roof, step_gb, n_seq, 100.0 * r.tok_s / roof);
    }
    fmt::print("\n");
  }
  if (o.profile) {
    const int64_t pp_forwards = o.batch > 0 ? (o.n_prompt + o.batch - 1) / o.batch : 1;
    fmt::print("pp profile: {}\ntg profile: {}\n", profile_line(pp_prof, o.repetitions * pp_forwards),
               profile_line(tg_prof, o.repetitions * o.n_gen));
  }
  if (spec_config.enabled()) {
    SpecBenchOptions so{.spec = spec_config,
                        .make_drafter = spec::drafter_factory(draft_model),
                        .adaptive = !o.spec.fixed,
                        .n_gen = std::max<int64_t>(o.n_gen, 16),
                        .repetitions = std::max(1, o.repetitions),
                        .prompts_path = o.spec_prompts};
    MOESERVE_ASSIGN_OR_RETURN(SpecBenchResult sr, bench_speculative(*model, so));
    print_spec_bench(sr, spec_config);
  }
  if (worker != nullptr) {
    fmt::print("{}\n", worker->describe());
    if (o.n_prompt > 0) fmt::print("pp: {}\n", worker_metrics_line(pp_worker, o.n_prompt * o.repetitions));
    if (o.n_gen > 0) fmt::print("tg: {}\n", worker_metrics_line(tg_worker, o.n_gen * o.repetitions));
  }
  return Status::ok();
}

}  // namespace

void register_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench",
                                     "Measure prefill (pp) and decode (tg) speed, like llama-bench; also the "
                                     "memory read bandwidth before and "
                                     "after the runs, and the share of that bound the decode reaches");
  cmd->add_option("-m,--model", o->model_path, "GGUF model file")->required();
  cmd->add_option("-p,--n-prompt", o->n_prompt, "Prompt tokens for the pp test (0: skip)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20));
  cmd->add_option("-n,--n-gen", o->n_gen, "Tokens for the tg test (0: skip)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20));
  cmd->add_option("-r,--repetitions", o->repetitions, "Timed runs of each test")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_option("-t,--threads", o->threads, "Worker threads (0: one per physical core)")
      ->capture_default_str();
  cmd->add_option("-b,--batch", o->batch, "Prompt tokens per prefill chunk")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 16));
  cmd->add_flag("--json", o->json, "Print one JSON object instead of the table");
  cmd->add_option(
         "--expert-backend", o->expert_backend,
         "tiled (default: all experts of a layer in one dispatch) or per-expert (3 matmul dispatches "
         "per expert; for comparison)")
      ->check(CLI::IsMember({"tiled", "per-expert"}))
      ->capture_default_str();
  cmd->add_option("--device", o->device,
                  "Device: auto (the first CUDA GPU when this binary has CUDA and one is visible, else the "
                  "CPU), cpu, cuda or cuda:N")
      ->capture_default_str();
  add_expert_flags(cmd, &o->experts);
  add_expert_worker_flags(cmd, &o->worker);
  cmd->add_flag("--no-pack", o->no_pack,
                "Use every weight in place from the file (zero-copy), without the packed copy the AVX-512 "
                "kernels are fastest with (for comparisons)");
  cmd->add_option(
         "--parallel", o->parallel,
         "Also measure aggregate decode with this many sequences decoded together (a list: --parallel 8,32)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t(1), int64_t(1024)));
  cmd->add_option(
         "--parallel-chunk", o->parallel_chunk,
         "With --parallel: every timed step also prefills this many prompt rows of one more sequence "
         "(the server's mixed steps while a prompt arrives); tok/s counts the decode rows only")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(0), int64_t(8192)));
  cmd->add_option("--parallel-prompt", o->parallel_prompt,
                  "With --parallel: positions each sequence holds before the timed steps (its context)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  cmd->add_option(
         "--kv-block", o->kv_block,
         "With --parallel: take the sequences' KV from one paged pool in blocks of this many positions "
         "(as serve --kv-mem; a power of two), 0 for a contiguous region each")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(0), int64_t(4096)));
  add_spec_flags(cmd, &o->spec);
  add_layer_split_flag(cmd, &o->layer_split);
  cmd->add_option("--spec-prompts", o->spec_prompts,
                  "With --spec: prompts to measure, one a line (\\n for a newline, \\\\ for a backslash); "
                  "default: built-in code-editing, "
                  "code-completion and chat prompts");
  cmd->add_flag("--profile", o->profile, "Also print where the forward time goes (timers per part)");
  cmd->callback([o] {
    const Status st = run_bench(*o);
    if (!st.is_ok()) {
      fmt::print(stderr, "error: {}\n", st.message());
      set_exit_code(1);
    }
  });
}

}  // namespace moeserve::tools
