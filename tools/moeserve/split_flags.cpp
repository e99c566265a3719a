#include "tools/moeserve/split_flags.h"

#include <fmt/format.h>

#include "core/log.h"
#include "moe/moe_shape.h"
#include "split/layer_split.h"

namespace moeserve::tools {

void add_layer_split_flag(CLI::App* cmd, std::string* spec) {
  cmd->add_option(
      "--layer-split", *spec,
      "Spread the model's layers over devices: a comma list of shards DEVICE, DEVICE=WEIGHT or "
      "DEVICE=A:B (layers A..B-1). DEVICE: cpu or cuda:N in this process, proc:cpu or proc:cuda:N "
      "in a child process started and supervised here (`moeserve shard`), proc:unix:PATH a shard "
      "started by hand; e.g. cuda:0,cpu (halves by weight bytes), cuda:0=3,cpu=1, "
      "cuda:0=0:36,cpu=36:48, cuda:0=0:36,proc:cpu=36:48. The embedding goes with the first shard, "
      "the output head with the last; only the boundary activation crosses. `inspect --layer-split` "
      "shows the plan");
}

Status apply_layer_split(const std::string& model_path, const std::string& spec, const std::string& device,
                         runtime::ModelLoadOptions* load, LayerSplitProcesses* processes) {
  if (spec.empty()) return Status::ok();
  if (!device.empty() && device != "auto") {
    return make_error(StatusCode::kInvalidArgument,
                      "--layer-split names its devices; drop --device {} (or put it in the split)", device);
  }
  MOESERVE_ASSIGN_OR_RETURN(std::vector<split::ShardSpec> shards, split::parse_layer_split(spec));
  MOESERVE_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(model_path));
  MOESERVE_ASSIGN_OR_RETURN(std::vector<split::ShardPlan> plan, split::plan_layer_split(file, shards));
  MOESERVE_LOG_INFO("layer split of {}:\n{}", model_path, split::describe_layer_split(plan));
  load->layer_shards = split::layer_shards(plan);
  for (size_t i = 0; i < shards.size(); ++i) {
    const split::ShardSpec& sp = shards[i];
    if (sp.kind != split::ShardKind::kProcess) continue;
    if (processes == nullptr)
      return make_error(StatusCode::kUnsupported, "--layer-split: '{}': no shard processes here", sp.device);
    runtime::LayerShard& shard = load->layer_shards[i];
    ipc::ShardClientOptions co;
    co.name = sp.device;
    co.spawn = sp.attach_socket.empty();
    co.socket_path = sp.attach_socket;
    if (co.spawn) {
      MOESERVE_ASSIGN_OR_RETURN(co.exe, ipc::self_executable());
    }
    co.model_path = model_path;
    co.device = sp.process_device;
    co.threads = load->n_threads;
    co.begin = shard.begin, co.end = shard.end;
    co.model_fingerprint = ipc::fingerprint_value(moe::model_fingerprint(file));
    co.n_layer = int64_t(plan.back().shard.end);
    MOESERVE_LOG_INFO("starting layer shard {} (layers {}:{})...", sp.device, shard.begin, shard.end);
    MOESERVE_ASSIGN_OR_RETURN(std::unique_ptr<ipc::ShardClient> client, ipc::ShardClient::create(co));
    shard.remote = client.get();
    processes->shards.push_back(std::move(client));
  }
  return Status::ok();
}

}  // namespace moeserve::tools
