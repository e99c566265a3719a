// moeserve inspect FILE [--json] [--all-keys]: what a GGUF file holds —
// header, hyperparameters, tokenizer summary and tensor table — without
// reading tensor data. Long arrays (the 150k-entry vocabulary) are summarized
// unless --all-keys asks for everything.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/devices.h"
#include "format/gguf.h"
#include "split/layer_split.h"
#include "tools/moeserve/commands.h"

namespace moeserve::tools {
namespace {

using nlohmann::json;

struct InspectOptions {
  std::string path;
  bool json = false;
  bool all_keys = false;
  std::string layer_split;  // print this split's plan instead
};

constexpr GgufDisplayOptions kFullDisplay{std::numeric_limits<size_t>::max(), std::numeric_limits<size_t>::max()};

std::string human_bytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(n);
  size_t u = 0;
  while (v >= 1024.0 && u + 1 < std::size(units)) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", n) : fmt::format("{:.2f} {}", v, units[u]);
}

std::string human_count(uint64_t n) {
  if (n >= 1'000'000'000) return fmt::format("{:.2f} B", double(n) / 1e9);
  if (n >= 1'000'000) return fmt::format("{:.2f} M", double(n) / 1e6);
  if (n >= 1'000) return fmt::format("{:.2f} K", double(n) / 1e3);
  return fmt::format("{}", n);
}

// general.*, {arch}.* and split.* are listed by default; --all-keys lists all.
bool is_listed_key(const GgufFile& file, std::string_view key, bool all_keys) {
  if (all_keys || key.starts_with("general.") || key.starts_with("split.")) return true;
  const std::string_view arch = file.architecture();
  return !arch.empty() && key.size() > arch.size() && key.starts_with(arch) && key[arch.size()] == '.';
}

struct TypeTotals {
  uint64_t tensors = 0;
  uint64_t params = 0;
  uint64_t bytes = 0;
};

struct Totals {
  TypeTotals all;
  std::map<std::string, TypeTotals> by_type;  // sorted by type name
};

Totals tensor_totals(const GgufFile& file) {
  Totals t;
  for (const GgufTensorInfo& info : file.tensors()) {
    for (TypeTotals* tt : {&t.all, &t.by_type[std::string(dtype_name(info.type))]}) {
      tt->tensors += 1;
      tt->params += uint64_t(info.n_elements());
      tt->bytes += info.nbytes;
    }
  }
  return t;
}

// ---- tokenizer summary ----------------------------------------------------------

struct SpecialToken {
  const char* label;
  const char* key;
};
constexpr SpecialToken kSpecialTokens[] = {
    {"bos", "tokenizer.ggml.bos_token_id"},
    {"eos", "tokenizer.ggml.eos_token_id"},
    {"eot", "tokenizer.ggml.eot_token_id"},
    {"pad", "tokenizer.ggml.padding_token_id"},
};

bool has_tokenizer(const GgufFile& file) {
  for (const GgufKV& kv : file.kvs()) {
    if (kv.key.starts_with("tokenizer.")) return true;
  }
  return false;
}

// The token text of a special id, or nullptr when the id or vocabulary is missing.
const std::string* token_text(const GgufFile& file, int64_t id) {
  const std::vector<std::string>* tokens = file.get_string_array("tokenizer.ggml.tokens");
  if (tokens == nullptr || id < 0 || uint64_t(id) >= tokens->size()) return nullptr;
  return &(*tokens)[size_t(id)];
}

size_t array_len(const GgufFile& file, std::string_view key) {
  const GgufValue* v = file.find(key);
  return v ? v->array_size() : 0;
}

void print_tokenizer(const GgufFile& file) {
  if (!has_tokenizer(file)) {
    fmt::print("\ntokenizer: none\n");
    return;
  }
  auto str = [&](std::string_view key) { return std::string(file.get_string(key).value_or("(none)")); };
  fmt::print("\ntokenizer:\n");
  fmt::print("  model:          {}\n", str("tokenizer.ggml.model"));
  fmt::print("  pre:            {}\n", str("tokenizer.ggml.pre"));
  fmt::print("  vocab size:     {}\n", array_len(file, "tokenizer.ggml.tokens"));
  fmt::print("  merges:         {}\n", array_len(file, "tokenizer.ggml.merges"));
  for (const SpecialToken& s : kSpecialTokens) {
    const std::optional<int64_t> id = file.get_int(s.key);
    if (!id) continue;
    const std::string* text = token_text(file, *id);
    fmt::print("  {:<16}{} {}\n", fmt::format("{}:", s.label), *id, text ? gguf_escape(*text) : "(not in vocab)");
  }
  if (auto add_bos = file.get_bool("tokenizer.ggml.add_bos_token")) {
    fmt::print("  add bos:        {}\n", *add_bos);
  }
  const std::optional<std::string_view> tmpl = file.get_string("tokenizer.chat_template");
  fmt::print("  chat template:  {}\n", tmpl ? fmt::format("yes ({} bytes)", tmpl->size()) : "no");
}

json tokenizer_json(const GgufFile& file) {
  if (!has_tokenizer(file)) return nullptr;
  json j;
  auto str = [&](std::string_view key) -> json {
    if (auto s = file.get_string(key)) return std::string(*s);
    return nullptr;
  };
  j["model"] = str("tokenizer.ggml.model");
  j["pre"] = str("tokenizer.ggml.pre");
  j["vocab_size"] = array_len(file, "tokenizer.ggml.tokens");
  j["merges"] = array_len(file, "tokenizer.ggml.merges");
  for (const SpecialToken& s : kSpecialTokens) {
    const std::optional<int64_t> id = file.get_int(s.key);
    if (!id) continue;
    const std::string* text = token_text(file, *id);
    j[std::string(s.label)] = {{"id", *id}, {"text", text ? json(*text) : json(nullptr)}};
  }
  if (auto add_bos = file.get_bool("tokenizer.ggml.add_bos_token")) j["add_bos"] = *add_bos;
  const std::optional<std::string_view> tmpl = file.get_string("tokenizer.chat_template");
  j["chat_template_bytes"] = tmpl ? json(tmpl->size()) : json(nullptr);
  return j;
}

// ---- text output -----------------------------------------------------------------

void print_header(const GgufFile& file) {
  fmt::print("file:          {} ({})\n", file.name(), human_bytes(file.size()));
  fmt::print("version:       {}\n", file.version());
  fmt::print("alignment:     {}\n", file.alignment());
  fmt::print("data offset:   {}\n", file.data_offset());
  const std::string_view arch = file.architecture();
  fmt::print("architecture:  {}\n", arch.empty() ? "(none)" : arch);
}

void print_metadata(const GgufFile& file, bool all_keys) {
  size_t key_width = 0, type_width = 0;
  for (const GgufKV& kv : file.kvs()) {
    if (!is_listed_key(file, kv.key, all_keys)) continue;
    key_width = std::max(key_width, kv.key.size());
    type_width = std::max(type_width, kv.value.type_name().size());
  }
  fmt::print("\nmetadata ({} keys{}):\n", file.kvs().size(), all_keys ? "" : "; general.* and architecture keys");
  size_t hidden = 0;
  for (const GgufKV& kv : file.kvs()) {
    if (!is_listed_key(file, kv.key, all_keys)) {
      ++hidden;
      continue;
    }
    const std::string value = all_keys ? kv.value.to_display(kFullDisplay) : kv.value.to_display();
    fmt::print("  {:<{}}  {:<{}}  {}\n", kv.key, key_width, kv.value.type_name(), type_width, value);
  }
  if (hidden > 0) fmt::print("  ({} more keys, tokenizer.* among them; --all-keys lists them)\n", hidden);
}

void print_tensors(const GgufFile& file) {
  size_t name_width = 4, shape_width = 5;
  for (const GgufTensorInfo& t : file.tensors()) {
    name_width = std::max(name_width, t.name.size());
    shape_width = std::max(shape_width, t.shape_string().size());
  }
  fmt::print("\ntensors ({}):\n", file.tensors().size());
  fmt::print("  {:<{}}  {:<5}  {:<{}}  {:>14}\n", "name", name_width, "type", "shape", shape_width, "bytes");
  for (const GgufTensorInfo& t : file.tensors()) {
    fmt::print("  {:<{}}  {:<5}  {:<{}}  {:>14}\n", t.name, name_width, dtype_name(t.type), t.shape_string(),
               shape_width, t.nbytes);
  }
  const Totals totals = tensor_totals(file);
  fmt::print("\ntotals: {} tensors, {} params ({}), {} ({} bytes)\n", totals.all.tensors,
             human_count(totals.all.params), totals.all.params, human_bytes(totals.all.bytes), totals.all.bytes);
  for (const auto& [type, tt] : totals.by_type) {
    fmt::print("  {:<5}  {:>6} tensors  {:>10} params  {:>12}\n", type, tt.tensors, human_count(tt.params),
               human_bytes(tt.bytes));
  }
}

void print_text(const GgufFile& file, const InspectOptions& options) {
  print_header(file);
  print_metadata(file, options.all_keys);
  print_tokenizer(file);
  print_tensors(file);
  for (const std::string& w : file.warnings()) fmt::print("warning: {}\n", w);
}

// ---- JSON output -----------------------------------------------------------------

// An f32 as the double with the same shortest text (1e-06, not 9.99999997e-07).
double f32_for_json(double v) { return std::strtod(fmt::format("{}", float(v)).c_str(), nullptr); }

json value_json(const GgufValue& v, bool full) {
  json out = {{"type", v.type_name()}};
  if (v.is_array()) {
    out["count"] = v.array_size();
    if (!full && v.array_size() > GgufDisplayOptions{}.max_array_elems) return out;  // summarized
    json elems = json::array();
    if (const auto* strings = v.as_string_array()) {
      for (const std::string& s : *strings) elems.push_back(s);
    } else if (auto ints = v.as_int_array()) {
      elems = std::move(*ints);
    } else if (auto floats = v.as_float_array()) {
      if (v.elem_type() == GgufType::kF32) {
        for (double& f : *floats) f = f32_for_json(f);
      }
      elems = std::move(*floats);
    } else if (const auto* bytes = v.array_data<uint8_t>()) {  // bool
      for (uint8_t b : *bytes) elems.push_back(b != 0);
    } else if (const auto* u64 = v.array_data<uint64_t>()) {   // past int64
      elems = *u64;
    }
    out["value"] = std::move(elems);
  } else if (auto i = v.as_int()) {
    out["value"] = *i;
  } else if (auto u = v.as_uint()) {
    out["value"] = *u;
  } else if (auto f = v.as_float()) {
    out["value"] = v.type() == GgufType::kF32 ? f32_for_json(*f) : *f;
  } else if (auto b = v.as_bool()) {
    out["value"] = *b;
  } else if (const std::string* s = v.as_string()) {
    out["value"] = *s;
  }
  return out;
}

json tensors_json(const GgufFile& file) {
  json tensors = json::array();
  for (const GgufTensorInfo& t : file.tensors()) {
    tensors.push_back({{"name", t.name},
                       {"type", std::string(dtype_name(t.type))},
                       {"shape", std::vector<int64_t>(t.ne, t.ne + t.n_dims)},
                       {"bytes", t.nbytes},
                       {"offset", t.offset}});
  }
  return tensors;
}

json totals_json(const GgufFile& file) {
  const Totals totals = tensor_totals(file);
  auto one = [](const TypeTotals& t) { return json{{"tensors", t.tensors}, {"params", t.params}, {"bytes", t.bytes}}; };
  json out = one(totals.all);
  out["by_type"] = json::object();
  for (const auto& [type, tt] : totals.by_type) out["by_type"][type] = one(tt);
  return out;
}

void print_json(const GgufFile& file, const InspectOptions& options) {
  json j;
  j["file"] = file.name();
  j["size"] = file.size();
  j["version"] = file.version();
  j["alignment"] = file.alignment();
  j["data_offset"] = file.data_offset();
  j["architecture"] = std::string(file.architecture());
  json metadata = json::object();
  for (const GgufKV& kv : file.kvs()) {
    if (is_listed_key(file, kv.key, options.all_keys)) metadata[kv.key] = value_json(kv.value, options.all_keys);
  }
  j["kv_count"] = file.kvs().size();
  j["metadata"] = std::move(metadata);
  j["tokenizer"] = tokenizer_json(file);
  j["tensors"] = tensors_json(file);
  j["totals"] = totals_json(file);
  j["warnings"] = file.warnings();
  // Token texts need not be valid UTF-8 (byte tokens): replace, never throw.
  fmt::print("{}\n", j.dump(2, ' ', false, json::error_handler_t::replace));
}

// `inspect --layer-split SPEC FILE`: the plan, and for GPU shards whether
// their weights fit the device's free memory now.
void print_layer_split(const GgufFile& file, const std::string& spec) {
  auto fail = [](const Status& st) {
    fmt::print(stderr, "error: {}\n", st.message());
    set_exit_code(1);
  };
  Result<std::vector<split::ShardSpec>> shards = split::parse_layer_split(spec);
  if (!shards.is_ok()) return fail(shards.status());
  Result<std::vector<split::ShardPlan>> plan = split::plan_layer_split(file, *shards);
  if (!plan.is_ok()) return fail(plan.status());
  fmt::print("layer split of {} ({} shards):\n{}", file.name(), plan->size(), split::describe_layer_split(*plan));
  bool fits = true;
  for (size_t i = 0; i < plan->size(); ++i) {
    const split::ShardPlan& p = (*plan)[i];
    Result<backend::DeviceSpec> d = backend::parse_device_spec(p.shard.device);
    if (!d.is_ok() || d->kind != backend::DeviceKind::kCuda) continue;
    Result<std::unique_ptr<backend::Device>> gpu = backend::open_cuda_device(d->index);
    if (!gpu.is_ok()) {
      fmt::print("  shard {}: {} is not available here ({}): memory not checked\n", i, p.shard.device,
                 gpu.status().message());
      continue;
    }
    const uint64_t need = p.layer_bytes + p.io_bytes, free = (*gpu)->memory_info().free_bytes;
    const bool ok = need < free;
    fits = fits && ok;
    fmt::print("  shard {}: {} has {} free, the shard's weights take {}: {}\n", i, p.shard.device, human_bytes(free),
               human_bytes(need), ok ? "fits (plus its KV cache)" : "does NOT fit: move layers to another shard");
  }
  if (!fits) set_exit_code(1);
}

void run_inspect(const InspectOptions& options) {
  Result<GgufFile> file = GgufFile::open(options.path);
  if (!file.is_ok()) {
    fmt::print(stderr, "error: {}\n", file.status().message());
    set_exit_code(1);
    return;
  }
  if (!options.layer_split.empty()) {
    print_layer_split(*file, options.layer_split);
  } else if (options.json) {
    print_json(*file, options);
  } else {
    print_text(*file, options);
  }
  std::fflush(stdout);
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto options = std::make_shared<InspectOptions>();
  CLI::App* cmd = app.add_subcommand(
      "inspect",
      "Show what a GGUF model file holds: version, alignment, architecture, the general.* and\n"
      "architecture hyperparameters, a tokenizer summary (model, vocab size, merges, special\n"
      "tokens, chat template) and the tensor table with totals by type. The file is validated\n"
      "(a broken or truncated file is an error, exit code 1) but tensor data is not read.");
  cmd->add_option("file", options->path, "GGUF file to inspect")->required();
  cmd->add_flag("--json", options->json, "Print one JSON object instead of text");
  cmd->add_option("--layer-split", options->layer_split,
                  "Print the plan of this layer split (see serve --help) for the file: layer ranges and bytes per "
                  "shard, and whether each GPU shard fits its device");
  cmd->add_flag("--all-keys", options->all_keys,
                "List every metadata key with its full value (long arrays such as the vocabulary included)");
  cmd->callback([options] { run_inspect(*options); });
}

}  // namespace moeserve::tools
