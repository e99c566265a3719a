#include "split/layer_split.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>

#include "backend/devices.h"
#include "format/model_keys.h"

namespace moeserve::split {
namespace {

Status bad(std::string_view part, std::string_view why) {
  return make_error(
      StatusCode::kInvalidArgument,
      "--layer-split: '{}': {} (shards are DEVICE, DEVICE=WEIGHT or DEVICE=A:B, DEVICE one of cpu, "
      "cuda:N, proc:DEVICE, mpi:R; e.g. cuda:0,cpu or cuda:0=0:36,cpu=36:48)",
      part, why);
}

std::optional<int64_t> integer(std::string_view t) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (ec != std::errc() || end != t.data() + t.size() || v < 0) return std::nullopt;
  return v;
}

Result<ShardSpec> parse_shard(std::string_view part) {
  ShardSpec s;
  const size_t eq = part.find('=');
  s.device = std::string(part.substr(0, eq));
  std::string_view device = s.device;
  if (device.starts_with("proc:unix:")) {
    s.kind = ShardKind::kProcess;
    s.attach_socket = std::string(device.substr(10));
    if (s.attach_socket.empty()) return bad(part, "proc:unix:PATH needs the shard's socket path");
    device = "cpu";  // (the shard says what it runs on)
  } else if (device.starts_with("proc:")) {
    s.kind = ShardKind::kProcess;
    device.remove_prefix(5);
  } else if (device.starts_with("mpi:")) {
    // mpi:R or mpi:R:DEVICE (the rank's device; cpu when not given).
    s.kind = ShardKind::kMpi;
    device.remove_prefix(4);
    const size_t colon = device.find(':');
    const auto rank = integer(device.substr(0, colon));
    if (!rank || *rank > 1 << 20) return bad(part, "an MPI rank is a number (mpi:R or mpi:R:DEVICE)");
    s.mpi_rank = int(*rank);
    device = colon == std::string_view::npos ? std::string_view("cpu") : device.substr(colon + 1);
  }
  Result<backend::DeviceSpec> d = backend::parse_device_spec(device);
  if (device.empty() || device == "auto" || !d.is_ok()) return bad(part, "unknown device");
  if (s.kind == ShardKind::kCpu && d->kind == backend::DeviceKind::kCuda) s.kind = ShardKind::kCuda;
  if (s.kind == ShardKind::kCuda) s.device = d->to_string();  // "cuda" -> "cuda:0"
  if (s.kind == ShardKind::kProcess || s.kind == ShardKind::kMpi) s.process_device = d->to_string();
  if (eq == std::string_view::npos) return s;
  const std::string_view value = part.substr(eq + 1);
  if (const size_t colon = value.find(':'); colon != std::string_view::npos) {
    const auto a = integer(value.substr(0, colon)), b = integer(value.substr(colon + 1));
    if (!a || !b || *b <= *a) return bad(part, "a range is A:B with A < B (layers A to B-1)");
    s.range = std::pair{*a, *b};
    return s;
  }
  char* end = nullptr;
  const std::string text(value);
  s.weight = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !(s.weight > 0.0) || !std::isfinite(s.weight))
    return bad(part, "a weight is a positive number");
  return s;
}

// Bytes of each layer's tensors ("blk.N."), and of the embedding and the head.
struct FileBytes {
  std::vector<uint64_t> layer;
  uint64_t embedding = 0, head = 0;
};

Result<FileBytes> file_bytes(const GgufFile& f) {
  MOESERVE_ASSIGN_OR_RETURN(int64_t n_layer, f.require_int(f.arch_key(keys::kBlockCount)));
  if (n_layer < 1 || n_layer > (1 << 20))
    return make_error(StatusCode::kInvalidFormat, "{}: block_count {}", f.name(), n_layer);
  FileBytes b;
  b.layer.assign(size_t(n_layer), 0);
  for (const GgufTensorInfo& t : f.tensors()) {
    if (t.name.starts_with("blk.")) {
      const size_t dot = t.name.find('.', 4);
      const auto l = integer(std::string_view(t.name).substr(4, dot - 4));
      if (l && *l < n_layer) b.layer[size_t(*l)] += t.nbytes;
    } else if (t.name == keys::kTokenEmbd) {
      b.embedding += t.nbytes;
    } else {
      b.head += t.nbytes;  // output_norm, output (a tied head reads the embedding: counted there)
    }
  }
  return b;
}

}  // namespace

Result<std::vector<ShardSpec>> parse_layer_split(std::string_view spec) {
  std::vector<ShardSpec> out;
  size_t start = 0;
  while (start <= spec.size()) {
    const size_t comma = spec.find(',', start);
    const std::string_view part =
        spec.substr(start, comma == std::string_view::npos ? spec.npos : comma - start);
    if (part.empty()) return bad(spec, "an empty shard");
    MOESERVE_ASSIGN_OR_RETURN(ShardSpec s, parse_shard(part));
    out.push_back(std::move(s));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (out.size() < 2) return bad(spec, "a split needs at least two shards");
  const bool ranged = out.front().range.has_value();
  for (const ShardSpec& s : out) {
    if (s.range.has_value() != ranged) return bad(spec, "give every shard a range A:B, or none");
  }
  return out;
}

Result<std::vector<ShardPlan>> plan_layer_split(const GgufFile& file, std::span<const ShardSpec> specs) {
  for (size_t i = 0; i < specs.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (specs[i].kind == ShardKind::kMpi && specs[j].kind == ShardKind::kMpi &&
          specs[i].mpi_rank == specs[j].mpi_rank) {
        return make_error(StatusCode::kInvalidArgument, "--layer-split: rank {} is named twice ('{}', '{}')",
                          specs[i].mpi_rank, specs[j].device, specs[i].device);
      }
    }
  }
  MOESERVE_ASSIGN_OR_RETURN(FileBytes bytes, file_bytes(file));
  const int64_t n_layer = int64_t(bytes.layer.size()), n = int64_t(specs.size());
  if (n > n_layer) {
    return make_error(StatusCode::kInvalidArgument, "--layer-split: {} shards for the {} layers of {}", n,
                      n_layer, file.name());
  }
  std::vector<ShardPlan> plan(static_cast<size_t>(n));
  if (specs.front().range) {
    int64_t next = 0;
    for (int64_t i = 0; i < n; ++i) {
      const auto [a, b] = *specs[size_t(i)].range;
      if (a != next || b > n_layer) {
        return make_error(
            StatusCode::kInvalidArgument,
            "--layer-split: '{}={}:{}': the ranges must follow each other from 0 to {} (the layers of "
            "{}), without gaps or overlaps",
            specs[size_t(i)].device, a, b, n_layer, file.name());
      }
      plan[size_t(i)].shard = {specs[size_t(i)].device, a, b};
      next = b;
    }
    if (next != n_layer) {
      return make_error(StatusCode::kInvalidArgument,
                        "--layer-split: the ranges end at layer {}; {} has {} layers", next, file.name(),
                        n_layer);
    }
  } else {
    // Cut where the running bytes cross each shard's share of the total,
    // leaving every later shard at least one layer.
    double total = double(bytes.embedding + bytes.head), weights = 0.0;
    for (uint64_t b : bytes.layer) total += double(b);
    for (const ShardSpec& s : specs) weights += s.weight;
    double bound = 0.0, running = double(bytes.embedding);
    int64_t l = 0;
    for (int64_t i = 0; i < n; ++i) {
      bound += specs[size_t(i)].weight / weights * total;
      const int64_t begin = l;
      if (i == n - 1) {
        l = n_layer;  // the last shard takes the rest
      } else {
        const int64_t last_allowed = n_layer - (n - 1 - i);  // later shards keep a layer each
        running += double(bytes.layer[size_t(l++)]);         // at least one layer
        // A layer goes here while its middle stays within this shard's share.
        while (l < last_allowed && running + double(bytes.layer[size_t(l)]) / 2 <= bound) {
          running += double(bytes.layer[size_t(l++)]);
        }
      }
      plan[size_t(i)].shard = {specs[size_t(i)].device, begin, l};
    }
  }
  for (ShardPlan& p : plan) {
    for (int64_t l = p.shard.begin; l < p.shard.end; ++l) p.layer_bytes += bytes.layer[size_t(l)];
  }
  plan.front().io_bytes += bytes.embedding;
  plan.back().io_bytes += bytes.head;
  return plan;
}

std::string describe_layer_split(std::span<const ShardPlan> plan) {
  std::string out;
  for (size_t i = 0; i < plan.size(); ++i) {
    const ShardPlan& p = plan[i];
    std::string extra;
    if (i == 0) extra += " + the embedding";
    if (i + 1 == plan.size()) extra += " + the output head";
    out +=
        fmt::format("  shard {}: {:<8} layers {:>3}:{:<3} ({} layers) {:8.2f} MiB of layer weights{}{}\n", i,
                    p.shard.device, p.shard.begin, p.shard.end, p.shard.end - p.shard.begin,
                    double(p.layer_bytes) / double(1 << 20), extra,
                    p.io_bytes > 0 ? fmt::format(" ({:.2f} MiB)", double(p.io_bytes) / double(1 << 20)) : "");
  }
  return out;
}

std::vector<runtime::LayerShard> layer_shards(std::span<const ShardPlan> plan) {
  std::vector<runtime::LayerShard> out;
  for (const ShardPlan& p : plan) out.push_back(p.shard);
  return out;
}

}  // namespace moeserve::split
