// moeserve serve -m FILE [--host H] [--port P] [--parallel N] [--ctx-size N]
//                [--api-key KEY] [--threads N] ...: the OpenAI-compatible
// HTTP server. It listens at once (GET /health says "loading"), loads the
// model, prints "moeserve serve: ready at http://HOST:PORT/" and serves
// until SIGINT/SIGTERM.
#include <fmt/core.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <system_error>
#include <thread>

#include "chat/chat_template.h"
#include "core/mapped_file.h"
#include "moe/plan.h"
#include "runtime/batch_engine.h"
#include "runtime/expert_promotion.h"
#include "runtime/memory_plan.h"
#include "runtime/model.h"
#include "runtime/prefix_disk.h"
#include "server/api_service.h"
#include "server/http_server.h"
#include "server/web_page.h"
#include "spec/drafter_factory.h"
#include "tools/moeserve/commands.h"
#include "tools/moeserve/expert_flags.h"
#include "tools/moeserve/expert_worker_flags.h"
#include "tools/moeserve/spec_flags.h"
#include "tools/moeserve/split_flags.h"

namespace moeserve::tools {
namespace {

struct ServeCliOptions {
  std::string model_path;
  std::string alias;
  std::string api_key;
  server::HttpOptions http;
  int parallel = 4;
  int64_t ctx_size = 0;
  int64_t batch = 512;
  int64_t prefill_chunk = 0;
  int threads = 0;
  bool no_pack = false;
  std::string device = "auto";
  moe::ExpertPolicyOptions experts;   // --placement, --n-cpu-moe, --cpu-moe, --gpu-mem
  runtime::PromotionFlags promotion;  // --expert-promotion, -min, -margin (checked in run_serve)
  size_t queue = 64;
  int max_running_per_client = 0;  // --max-running-per-client
  size_t prefix_cache_mb = 256;
  std::string kv_cache_dir;         // --kv-cache-dir: the prefix cache's disk tier ("": none)
  std::string kv_disk_mem;          // --kv-disk-mem SIZE ("": runtime::kDefaultPrefixDiskBytes)
  std::string kv_mem;               // --kv-mem SIZE: paged KV pool ("": a region of --ctx-size per slot)
  int64_t kv_block = 32;            // --kv-block N: positions per block
  std::string swap_space;           // --swap-space SIZE: preempted sequences' rows in host memory
  std::string kv_host_mem;          // --kv-host-mem SIZE: evicted shared prefix blocks in host memory
  int64_t kv_state_interval = 512;  // --kv-state-interval N: recurrent states kept every N prompt positions
  size_t max_body_kb = 1024;
  std::string special_tokens_in_content = "text";
  std::string chat_template_file;  // --chat-template: overrides the model file's template
  ExpertWorkerCliOptions worker;   // --expert-worker ...
  int max_connections = 0;         // 0: HttpOptions' default
  SpecCliOptions spec;             // --spec ...
  LayerSplitFlags layer_split;     // --layer-split SPEC, --micro-batches N
};

server::HttpServer* g_server = nullptr;

void on_signal(int) {
  // stop() only sets a flag and writes to an eventfd: safe in a signal handler.
  if (g_server != nullptr) g_server->stop();
}

// --chat-template FILE: read and parsed before anything starts, so a
// template that does not parse is a start-up error naming the file and line.
Result<std::string> read_chat_template(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(StatusCode::kNotFound, "--chat-template {}: cannot open the file", path);
  std::ostringstream text;
  text << in.rdbuf();
  auto parsed = chat::ChatTemplate::parse(text.str());
  if (!parsed.is_ok()) {
    return make_error(StatusCode::kInvalidArgument, "--chat-template {}: {}", path,
                      parsed.status().message());
  }
  return text.str();
}

// --kv-cache-dir / --kv-disk-mem into the engine's options; the folder is
// created and checked here, before the model loads.
Status apply_kv_disk_flags(const ServeCliOptions& o, runtime::EngineOptions* eo) {
  if (o.kv_cache_dir.empty()) {
    if (!o.kv_disk_mem.empty())
      return make_error(StatusCode::kInvalidArgument, "--kv-disk-mem needs --kv-cache-dir DIR");
    return Status::ok();
  }
  if (o.prefix_cache_mb == 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "--kv-cache-dir needs the prefix cache: drop --prefix-cache-mb 0 or give a size");
  }
  if (!o.kv_disk_mem.empty()) {
    MOESERVE_ASSIGN_OR_RETURN(eo->kv_disk_bytes, moe::parse_size(o.kv_disk_mem, "--kv-disk-mem"));
  }
  eo->kv_cache_dir = o.kv_cache_dir;
  return runtime::PrefixDiskTier::prepare_dir(o.kv_cache_dir);
}

Status run_serve(ServeCliOptions o) {
  // Flags are checked before anything starts: a bad value is an error, not a server.
  MOESERVE_ASSIGN_OR_RETURN(const runtime::PromotionSchedule promotion,
                            runtime::parse_promotion_flags(o.promotion));
  runtime::EngineOptions eo;
  MOESERVE_RETURN_IF_ERROR(apply_kv_disk_flags(o, &eo));
  if (!o.swap_space.empty() && o.kv_mem.empty()) {
    return make_error(StatusCode::kInvalidArgument, "--swap-space needs --kv-mem SIZE (paged KV)");
  }
  if (!o.kv_host_mem.empty() && o.kv_mem.empty()) {
    return make_error(StatusCode::kInvalidArgument, "--kv-host-mem needs --kv-mem SIZE (paged KV)");
  }
  MOESERVE_ASSIGN_OR_RETURN(const runtime::SpecConfig spec_config, resolve_spec_flags(o.spec));
  o.http.max_body_bytes = o.max_body_kb * 1024;
  std::string chat_template;
  if (!o.chat_template_file.empty()) {
    MOESERVE_ASSIGN_OR_RETURN(chat_template, read_chat_template(o.chat_template_file));
  }
  if (o.max_connections > 0) o.http.max_connections = o.max_connections;
  // Connections cost no thread; the handler threads are what a plain
  // generation holds until its answer: one per slot, and a few more so that
  // the next requests are already queued in the engine when a slot frees.
  o.http.handler_threads = o.parallel + 8;
  o.http.max_waiting_requests = int(std::min<size_t>(o.queue, 1 << 20));
  // ApiService answers GET routes (health, models, metrics, the page) from
  // memory: they run on the event loop, with no thread hop.
  o.http.light_requests_inline = true;
  if (int64_t(o.parallel) + int64_t(o.queue) > o.http.max_connections) {
    fmt::print(
        stderr,
        "moeserve serve: serving at most {} connections at once (--max-connections), fewer than --parallel "
        "{} + --queue {} requests; more get 503\n",
        o.http.max_connections, o.parallel, o.queue);
  }
  // Every weight page is faulted in at load: the first requests would
  // otherwise pay for it (a page fault per 4 KiB) in their latency.
  runtime::ModelLoadOptions load{
      .n_threads = o.threads, .pack_weights = !o.no_pack, .populate = true, .device = o.device};
  moe::ExpertPolicyOptions experts = o.experts;
  experts.ctx_size = o.ctx_size > 0 ? o.ctx_size : 4096;
  experts.parallel = o.parallel;
  experts.with_expert_worker = !o.worker.worker.empty();
  // A bad placement (file, flags, budget) is refused before the port opens.
  MOESERVE_RETURN_IF_ERROR(apply_expert_flags(o.model_path, experts, &load));
  LayerSplitProcesses shard_processes;  // declared before the model: it outlives it
  MOESERVE_RETURN_IF_ERROR(apply_layer_split(o.model_path, o.layer_split, o.device, &load, &shard_processes));
  server::HttpServer http(o.http);
  MOESERVE_ASSIGN_OR_RETURN(const int port, http.bind());
  g_server = &http;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  Status served;
  std::thread listener;
  try {
    listener = std::thread([&] { served = http.run(); });
  } catch (const std::system_error& e) {
    g_server = nullptr;
    return make_error(StatusCode::kResourceExhausted, "could not start the listener thread: {}", e.what());
  }
  auto stop_listener = [&] {
    http.stop();
    listener.join();
    g_server = nullptr;
  };
  fmt::print(stderr, "moeserve serve: listening on http://{}:{}/ (loading {})\n", o.http.host, port,
             o.model_path);
  // Declared before the model: it outlives it.
  Result<std::unique_ptr<ipc::WorkerExpertBackend>> worker =
      apply_expert_worker_flags(o.model_path, experts.placement_path, o.worker, &load);
  if (!worker.is_ok()) {
    stop_listener();
    return worker.status();
  }
  auto model = runtime::Model::load(o.model_path, load);
  if (!model.is_ok()) {
    stop_listener();
    return model.status();
  }
  eo.n_slots = o.parallel;
  eo.promotion = promotion;  // a model without split layers never promotes
  const int64_t trained = (*model)->info().n_ctx_train;
  eo.n_ctx = o.ctx_size > 0 ? o.ctx_size : std::min<int64_t>(trained > 0 ? trained : 4096, 4096);
  eo.n_batch = o.batch;
  eo.prefill_chunk = o.prefill_chunk;
  eo.max_queue = o.queue;
  eo.max_running_per_client = o.max_running_per_client;
  eo.prefix_cache_bytes = o.prefix_cache_mb << 20;
  if (!o.kv_mem.empty()) {
    auto bytes = moe::parse_size(o.kv_mem, "--kv-mem");
    if (!bytes.is_ok()) {
      stop_listener();
      return bytes.status();
    }
    if ((*model)->pages_kv()) {
      eo.kv_pool_bytes = *bytes;
      eo.kv_block_rows = o.kv_block;
      if (!o.swap_space.empty()) {
        auto swap = moe::parse_size(o.swap_space, "--swap-space");
        if (!swap.is_ok()) {
          stop_listener();
          return swap.status();
        }
        eo.kv_swap_bytes = *swap;
      }
      eo.kv_state_interval = o.kv_state_interval;
      if (!o.kv_host_mem.empty()) {
        auto host = moe::parse_size(o.kv_host_mem, "--kv-host-mem");
        if (!host.is_ok()) {
          stop_listener();
          return host.status();
        }
        eo.kv_host_bytes = *host;
      }
    } else {
      fmt::print(stderr,
                 "moeserve serve: --kv-mem is ignored: a device of this placement cannot read KV block "
                 "tables; each slot keeps --ctx-size positions\n");
    }
  }
  eo.spec = spec_config;  // requests may choose their own ("speculative")
  eo.spec_adaptive = !o.spec.fixed;
  auto draft_model = load_draft_model(o.spec, (*model)->net(), o.model_path);
  if (!draft_model.is_ok()) {
    stop_listener();
    return draft_model.status();
  }
  eo.make_drafter = spec::drafter_factory(*draft_model);
  // A step's verify rows: 16 keep the GPU's row-count-independent kernels;
  // a larger draft tree asked for gets its rows.
  eo.spec_step_rows = std::max<int64_t>(16, 1 + std::max(spec_config.max_draft, spec_config.tree_nodes));
  const runtime::MemoryPlanRequest want{
      .n_sequences = eo.n_slots,
      .n_ctx = eo.n_ctx,
      .n_batch = eo.n_batch,
      .prefix_cache_bytes = eo.prefix_cache_bytes,
      .extra_bytes_per_token = *draft_model != nullptr ? (*draft_model)->context_bytes_per_token() : 0,
      .kv_pool_bytes = eo.kv_pool_bytes};
  auto plan = runtime::plan_device_memory(**model, want);
  if (!plan.is_ok() && o.ctx_size == 0) {
    // No --ctx-size given: take the largest default context that fits.
    const int64_t fits = runtime::largest_fitting_context(**model, want);
    if (fits > 0) {
      fmt::print(stderr, "moeserve serve: context lowered from {} to {} tokens per slot to fit memory ({})\n",
                 eo.n_ctx, fits, plan.status().message());
      eo.n_ctx = fits;
      runtime::MemoryPlanRequest lowered = want;
      lowered.n_ctx = fits;
      plan = runtime::plan_device_memory(**model, lowered);
    }
  }
  if (!plan.is_ok()) {
    stop_listener();
    return plan.status();
  }
  auto engine = std::make_unique<runtime::BatchEngine>(**model, eo);
  if (!engine->status().is_ok()) {
    stop_listener();
    return engine->status();
  }
  server::ServiceConfig sc;
  sc.model_id = !o.alias.empty() ? o.alias : std::filesystem::path(o.model_path).stem().string();
  sc.api_key = o.api_key;
  sc.web_page = std::string(server::web_page());
  sc.special_tokens_in_content = server::special_tokens_policy_from_name(o.special_tokens_in_content)
                                     .value_or(server::SpecialTokensInContent::kText);
  sc.chat_template = std::move(chat_template);
  std::vector<const ipc::ShardClient*> shards;
  for (const auto& c : shard_processes.shards) shards.push_back(c.get());
  if (ipc::WorkerExpertBackend* w = worker->get(); w != nullptr || !shards.empty()) {
    sc.extra_metrics = [w, shards] {
      return (w != nullptr ? ipc::prometheus_text(w->metrics()) : std::string()) +
             ipc::prometheus_text(shards);
    };
  }
  auto service = std::make_unique<server::ApiService>(**model, *engine, sc);
  http.set_service(service.get());
  fmt::print(stderr, "moeserve serve: model '{}', {} slots x {} tokens of context, {} threads\n", sc.model_id,
             eo.n_slots, eo.n_ctx, (*model)->pool().size());
  if (const runtime::EngineStats es = engine->stats(); es.kv_pool_blocks > 0) {
    fmt::print(stderr,
               "moeserve serve: paged KV: {} blocks of {} positions ({} positions shared by all slots)\n",
               es.kv_pool_blocks, es.kv_block_rows, es.kv_capacity_tokens);
  }
  if (spec_config.enabled()) {
    fmt::print(stderr,
               "moeserve serve: speculative decoding {} (up to {} draft tokens a step; requests may choose "
               "with \"speculative\")\n",
               runtime::spec_mode_name(spec_config.mode), spec_config.max_draft);
  }
  fmt::print(stderr, "moeserve serve: device {}: {} ({})\n", (*model)->device().name(),
             (*model)->device().description(), (*model)->device_reason());
  fmt::print(stdout, "moeserve serve: ready at http://{}:{}/\n", o.http.host, port);
  std::fflush(stdout);
  listener.join();
  g_server = nullptr;
  http.set_service(nullptr);
  engine.reset();  // finishes what is still running (as cancelled) before the service goes
  service.reset();
  fmt::print(stderr, "moeserve serve: stopped\n");
  return served;
}

// Promotion applies to layers with experts on both the GPU and the CPU
// (as --placement or --gpu-mem may leave them; --n-cpu-moe and --cpu-moe
// leave none). The values are strings, so that idle and off fit and a bad
// one gets runtime::parse_promotion_flags' error naming the flag.
void add_promotion_flags(CLI::App* cmd, runtime::PromotionFlags* f) {
  cmd->add_option("--expert-promotion", f->every,
                  "When experts on the CPU may swap places with experts on the GPU: N (every N tokens\n"
                  "served), idle (between requests: once no request is running or waiting) or off (0 too)")
      ->type_name("N|idle|off")
      ->group("MoE experts (GPU)")
      ->capture_default_str();
  cmd->add_option("--expert-promotion-min", f->min_selections,
                  "A CPU expert swaps in only if it was selected at least N times since the last promotion\n"
                  "(at least 1)")
      ->type_name("N")
      ->group("MoE experts (GPU)")
      ->capture_default_str();
  cmd->add_option(
         "--expert-promotion-margin", f->margin,
         "A CPU expert swaps in only if it was also selected (1 + X) times as often as the GPU expert\n"
         "it replaces, since the last promotion (0.5: 1.5x as often)")
      ->type_name("X")
      ->group("MoE experts (GPU)")
      ->capture_default_str();
}

}  // namespace

void register_serve(CLI::App& app) {
  auto o = std::make_shared<ServeCliOptions>();
  CLI::App* cmd = app.add_subcommand("serve",
                                     "OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, "
                                     "/v1/responses, /v1/models, /metrics, web chat at /) that also speaks "
                                     "Anthropic's Messages API (/v1/messages) for coding agents");
  cmd->add_option("-m,--model", o->model_path,
                  "GGUF model file (qwen3moe, qwen3, qwen35moe, qwen35 or laguna)")
      ->required();
  cmd->add_option("--host", o->http.host, "Address to listen on (0.0.0.0: every interface)")
      ->capture_default_str();
  cmd->add_option("--port", o->http.port, "TCP port (0: pick a free one; the ready line tells which)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--parallel", o->parallel, "Sequences decoded together (continuous batching slots)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("-c,--ctx-size", o->ctx_size, "Context per slot in tokens (0: the model's, at most 4096)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20));
  cmd->add_option("-b,--batch", o->batch, "Tokens per forward step (decode rows + a prompt chunk)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 16));
  cmd->add_option("--prefill-chunk", o->prefill_chunk,
                  "Prompt tokens a step takes at most while other sequences decode (0: the rest of --batch). "
                  "Smaller keeps running streams' inter-token latency low while a long prompt arrives; "
                  "prompts alone still take all of --batch")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(0), int64_t(1) << 16));
  cmd->add_option(
      "--api-key", o->api_key,
      "Require 'Authorization: Bearer KEY' or 'x-api-key: KEY' (except /health and the web page)");
  cmd->add_option("-t,--threads", o->threads, "Compute threads (0: one per physical core)")
      ->capture_default_str();
  cmd->add_option("--device", o->device,
                  "Device: auto (the first CUDA GPU when this binary has CUDA and one is visible, else the "
                  "CPU), cpu, cuda or cuda:N")
      ->capture_default_str();
  add_expert_flags(cmd, &o->experts);
  add_expert_worker_flags(cmd, &o->worker);
  add_spec_flags(cmd, &o->spec);
  add_layer_split_flag(cmd, &o->layer_split);
  add_promotion_flags(cmd, &o->promotion);
  cmd->add_flag("--no-pack", o->no_pack,
                "Use every weight in place from the file (zero-copy), without the packed copy the AVX-512 "
                "kernels are fastest with (saves the Q4_K/Q6_K weights' size in RAM; slower)");
  cmd->add_option("--queue", o->queue, "Requests that may wait for a slot; more get 429")
      ->capture_default_str()
      ->check(CLI::Range(size_t(0), size_t(100000)));
  cmd->add_option(
         "--max-running-per-client", o->max_running_per_client,
         "Sequences one client (its API key, else its address) may run at once; its further requests "
         "wait while other clients' are admitted (default 0: no limit). Waiting requests go by their "
         "\"priority\" field (lower first), then arrival")
      ->check(CLI::Range(0, 65536));
  cmd->add_option("--prefix-cache-mb", o->prefix_cache_mb, "Memory for reusable prompt prefixes (0: off)")
      ->capture_default_str();
  cmd->add_option(
         "--kv-cache-dir", o->kv_cache_dir,
         "Keep reusable prompt prefixes on disk in DIR too (created when missing): what the memory\n"
         "tiers evict, and all of it when the server stops, so a restarted server with the same model\n"
         "file reuses them (another model's files there are left alone). With --kv-mem: the blocks\n"
         "--kv-host-mem pushes out (DIR/blocks); otherwise entries of --prefix-cache-mb")
      ->type_name("DIR");
  cmd->add_option("--kv-disk-mem", o->kv_disk_mem,
                  "Disk space --kv-cache-dir may take, e.g. 8G, 512M (default 8G); the least recently used\n"
                  "files go first")
      ->type_name("SIZE");
  cmd->add_option("--kv-mem", o->kv_mem,
                  "Paged KV: one pool of this size (e.g. 4G) for every sequence's keys and values, taken in\n"
                  "blocks as sequences grow, instead of --ctx-size positions reserved per slot; --parallel\n"
                  "then counts sequences. When it runs short the newest sequence is paused (its rows go to\n"
                  "host memory) and resumes later with the same output. On the CPU and on CUDA GPUs")
      ->type_name("SIZE");
  cmd->add_option("--swap-space", o->swap_space,
                  "With --kv-mem: host memory paused sequences' rows may take (default 4G, as vLLM's); past\n"
                  "it a paused sequence's rows are dropped and computed again when it resumes")
      ->type_name("SIZE");
  cmd->add_option("--kv-host-mem", o->kv_host_mem,
                  "With --kv-mem: host memory (e.g. 8G) for shared prompt-prefix blocks the pool gives back\n"
                  "under pressure; a later prompt with the same prefix gets them copied back instead of\n"
                  "computing them (default: --prefix-cache-mb's size; 0: none)")
      ->type_name("SIZE");
  cmd->add_option(
         "--kv-state-interval", o->kv_state_interval,
         "With --kv-mem, models with Gated DeltaNet layers (Qwen3.5): keep their recurrent state every N\n"
         "prompt positions (whole blocks), so prompts that share a start resume from there; smaller\n"
         "shares more, each snapshot takes host memory within --prefix-cache-mb")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  cmd->add_option("--kv-block", o->kv_block, "Positions per paged-KV block (a power of two)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(4096)));
  cmd->add_option("--timeout", o->http.timeout_seconds,
                  "Seconds a socket may stay silent before it is closed")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  cmd->add_option("--max-body-kb", o->max_body_kb, "Largest request body accepted, in KiB (larger: 413)")
      ->capture_default_str()
      ->check(CLI::Range(size_t(1), size_t(1) << 20));
  cmd->add_option("--alias", o->alias, "Model id for /v1/models and requests (default: the file name)");
  cmd->add_option("--max-connections-per-client", o->http.max_connections_per_client,
                  "Open connections one client address may hold; more get 429 (default 0: no limit)")
      ->check(CLI::Range(0, 65536));
  cmd->add_option(
         "--max-connections", o->max_connections,
         fmt::format("Open connections, idle ones included (they cost memory, no thread); more get 503 "
                     "(default {})",
                     server::HttpOptions{}.max_connections))
      ->check(CLI::Range(1, 65536));
  cmd->add_option(
      "--chat-template", o->chat_template_file,
      "Jinja chat template FILE to use instead of the model file's (a checkpoint's\n"
      "chat_template.jinja, a fixed or tool-calling variant); one that does not parse is an error\n"
      "at start naming the line");
  cmd->add_option(
         "--special-tokens-in-content", o->special_tokens_in_content,
         "Control-token text (<|im_start|>, <|im_end|>, ...) inside chat messages, tools or\n"
         "template arguments: 'text' (default) keeps it plain text, so a user cannot end their turn\n"
         "or forge a system turn; 'parse' lets it act as control tokens (trusted clients that build\n"
         "turns themselves). /v1/completions always parses its raw prompt.")
      ->check(CLI::IsMember({"text", "parse"}))
      ->capture_default_str();
  cmd->callback([o] {
    const Status st = run_serve(*o);
    if (!st.is_ok()) {
      fmt::print(stderr, "error: {}\n", st.message());
      set_exit_code(1);
    }
  });
}

}  // namespace moeserve::tools
