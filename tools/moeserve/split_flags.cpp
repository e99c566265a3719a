#include "tools/moeserve/split_flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>

#include "core/log.h"
#include "ipc/mpi_world.h"
#include "ipc/row_link.h"
#include "ipc/shard_server.h"
#include "moe/moe_shape.h"
#include "split/layer_split.h"

namespace moeserve::tools {

void add_layer_split_flag(CLI::App* cmd, LayerSplitFlags* flags) {
  cmd->add_option(
      "--layer-split", flags->spec,
      "Spread the model's layers over devices: a comma list of shards DEVICE, DEVICE=WEIGHT or "
      "DEVICE=A:B (layers A..B-1). DEVICE: cpu or cuda:N in this process, proc:cpu or proc:cuda:N "
      "in a child process started and supervised here (`moeserve shard`), proc:unix:PATH a shard "
      "started by hand, mpi:R[:DEVICE] an MPI rank; e.g. cuda:0,cuda:1 (shares by weight bytes), "
      "cuda:0=3,cpu=1, cuda:0=0:36,cpu=36:48, cuda:0=0:36,proc:cpu=36:48. The embedding goes with "
      "the first shard, the output head with the last; only the boundary activation crosses. "
      "`inspect --layer-split` shows the plan");
  cmd->add_option("--micro-batches", flags->micro_batches,
                  "With --layer-split over shards that compute at once (GPUs, a GPU and the CPU, other "
                  "processes): a prompt goes through in pipelined micro-batches of --batch tokens, this "
                  "many a forward, so every shard works at the same time (1: one shard at a time)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option(
         "--micro-batch-rows", flags->micro_batch_rows,
         "Rows of one pipelined micro-batch at least: a forward of fewer than --micro-batches times "
         "this many rows is cut into fewer micro-batches (a short prompt: none). Smaller micro-batches "
         "overlap more but compute less efficiently")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--split-rows", flags->rows,
                  "Type of the hidden rows handed to proc: and mpi: shards through sockets or MPI: f32 (the "
                  "output is the unsplit model's), f16 or bf16 (half the bytes, for a slow network; rounds "
                  "the rows, so the output may differ). Rows between GPUs over NCCL stay f32")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str();
}

namespace {

ipc::ShardClientOptions client_options(const std::string& model_path, const GgufFile& file,
                                       std::span<const split::ShardPlan> plan, size_t i,
                                       const split::ShardSpec& sp) {
  ipc::ShardClientOptions co;
  co.name = sp.device;
  co.model_path = model_path;
  co.device = sp.process_device;
  co.begin = plan[i].shard.begin, co.end = plan[i].shard.end;
  co.model_fingerprint = ipc::fingerprint_value(moe::model_fingerprint(file));
  co.n_layer = int64_t(plan.back().shard.end);
  return co;
}

// The CUDA ordinal of `device` ("cuda:1"), or -1.
int cuda_ordinal(std::string_view device) {
  if (!device.starts_with("cuda:")) return -1;
  int n = -1;
  const auto [end, ec] = std::from_chars(device.data() + 5, device.data() + device.size(), n);
  return ec == std::errc() && end == device.data() + device.size() ? n : -1;
}

// Each rank's GPU for an MPI job whose boundary rows go GPU to GPU over
// NCCL, or empty when they go through the host: NCCL built and not turned
// off (MOESERVE_NCCL=0), every other rank's shard on a GPU, and rank 0's
// own shards all on one GPU. Every rank decides alike (the same command
// line, the same binary).
std::vector<int> nccl_devices(std::span<const split::ShardSpec> specs, int world_size) {
  if (!ipc::nccl::built()) return {};
  if (const char* v = std::getenv("MOESERVE_NCCL"); v != nullptr && std::string_view(v) == "0") return {};
  std::vector<int> device(size_t(world_size), -1);
  for (const split::ShardSpec& s : specs) {
    const bool remote = s.kind == split::ShardKind::kMpi && s.mpi_rank > 0;
    const int rank = remote ? s.mpi_rank : 0;
    if (s.kind == split::ShardKind::kProcess) return {};
    const int ordinal = cuda_ordinal(s.kind == split::ShardKind::kMpi ? s.process_device : s.device);
    if (ordinal < 0 || (device[size_t(rank)] >= 0 && device[size_t(rank)] != ordinal)) return {};
    device[size_t(rank)] = ordinal;
  }
  if (std::find(device.begin(), device.end(), -1) != device.end()) return {};
  return device;
}

// The job's row link on every rank (a collective), or null without one.
Result<std::unique_ptr<ipc::RowLink>> open_row_link(std::span<const split::ShardSpec> specs,
                                                    const ipc::mpi::World& world) {
  const std::vector<int> devices = nccl_devices(specs, world.size);
  if (devices.empty()) {
    if (world.rank == 0)
      MOESERVE_LOG_INFO("MPI ranks hand their rows over through the host{}",
                        ipc::nccl::built() ? "" : " (this build has no NCCL)");
    return std::unique_ptr<ipc::RowLink>();
  }
  return ipc::nccl::open({.rank = world.rank,
                          .size = world.size,
                          .cuda_device = devices[size_t(world.rank)],
                          .broadcast = [](std::span<uint8_t> b) { return ipc::mpi::broadcast(b); }});
}

// An MPI job: every rank runs this command. Rank 0 goes on (it serves);
// each other rank runs its layers for rank 0 here and exits when rank 0
// does. Every rank of the job must have a shard, and no shard a rank
// past the job's.
Status start_mpi_ranks(const std::string& model_path, std::span<const split::ShardSpec> specs,
                       std::span<const split::ShardPlan> plan, const runtime::ModelLoadOptions* load,
                       std::unique_ptr<ipc::RowLink>* link) {
  if (std::none_of(specs.begin(), specs.end(),
                   [](const auto& s) { return s.kind == split::ShardKind::kMpi; }))
    return Status::ok();
  MOESERVE_ASSIGN_OR_RETURN(const ipc::mpi::World world, ipc::mpi::init());
  std::vector<int> named(size_t(world.size), 0);
  for (const split::ShardSpec& s : specs) {
    if (s.kind != split::ShardKind::kMpi) continue;
    if (s.mpi_rank >= world.size) {
      return make_error(StatusCode::kInvalidArgument, "--layer-split: '{}': the MPI job has {} ranks (0..{})",
                        s.device, world.size, world.size - 1);
    }
    named[size_t(s.mpi_rank)] = 1;
  }
  for (int r = 1; r < world.size; ++r) {
    if (!named[size_t(r)]) {
      return make_error(StatusCode::kInvalidArgument,
                        "--layer-split: the MPI job has {} ranks and rank {} has no shard: name every rank "
                        "(mpi:1, ...) or start fewer (mpirun -np)",
                        world.size, r);
    }
  }
  Result<std::unique_ptr<ipc::RowLink>> opened = open_row_link(specs, world);
  if (!opened.is_ok())
    ipc::mpi::abort(
        make_error(opened.status().code(), "MPI rank {}: {}", world.rank, opened.status().message()));
  *link = std::move(opened.value());
  if (world.rank == 0) return Status::ok();
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].kind != split::ShardKind::kMpi || specs[i].mpi_rank != world.rank) continue;
    ipc::ShardServerOptions so;
    so.model_path = model_path;
    so.first_layer = plan[i].shard.begin;
    so.end_layer = plan[i].shard.end;
    so.device = specs[i].process_device;
    so.n_threads = load->n_threads;
    so.pack_weights = load->pack_weights;
    so.link = link->get();
    Result<std::unique_ptr<ipc::ShardServer>> server = ipc::ShardServer::open(so);
    if (!server.is_ok())
      ipc::mpi::abort(
          make_error(server.status().code(), "MPI rank {}: {}", world.rank, server.status().message()));
    MOESERVE_LOG_INFO("MPI rank {}: {}", world.rank, (*server)->summary());
    std::unique_ptr<ipc::Channel> channel = ipc::mpi::channel_from_root();
    (void)(*server)->serve_one(*channel);
    server->reset();
    // (NCCL's communicator is torn down on every rank together: rank 0's waits for this one's.)
    link->reset();
    std::exit(0);  // (MPI is finalised at exit)
  }
  return Status::ok();
}

}  // namespace

Status apply_layer_split(const std::string& model_path, const LayerSplitFlags& flags,
                         const std::string& device, runtime::ModelLoadOptions* load,
                         LayerSplitProcesses* processes) {
  const std::string& spec = flags.spec;
  if (spec.empty()) return Status::ok();
  load->micro_batches = flags.micro_batches;
  load->min_micro_batch_rows = flags.micro_batch_rows;
  if (!device.empty() && device != "auto") {
    return make_error(StatusCode::kInvalidArgument,
                      "--layer-split names its devices; drop --device {} (or put it in the split)", device);
  }
  MOESERVE_ASSIGN_OR_RETURN(const ipc::PayloadType rows_type, ipc::parse_payload_type(flags.rows));
  MOESERVE_ASSIGN_OR_RETURN(std::vector<split::ShardSpec> shards, split::parse_layer_split(spec));
  MOESERVE_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(model_path));
  MOESERVE_ASSIGN_OR_RETURN(std::vector<split::ShardPlan> plan, split::plan_layer_split(file, shards));
  MOESERVE_LOG_INFO("layer split of {}:\n{}", model_path, split::describe_layer_split(plan));
  load->layer_shards = split::layer_shards(plan);
  std::unique_ptr<ipc::RowLink> link;
  MOESERVE_RETURN_IF_ERROR(start_mpi_ranks(model_path, shards, plan, load, &link));
  if (link != nullptr) {
    if (processes == nullptr) return make_error(StatusCode::kUnsupported, "--layer-split: no MPI ranks here");
    processes->link = std::move(link);
  }
  for (size_t i = 0; i < shards.size(); ++i) {
    const split::ShardSpec& sp = shards[i];
    if (sp.kind == split::ShardKind::kMpi) {
      runtime::LayerShard& shard = load->layer_shards[i];
      if (sp.mpi_rank == 0) {
        shard.device = sp.process_device;  // rank 0's own layers: in this process
        continue;
      }
      if (processes == nullptr)
        return make_error(StatusCode::kUnsupported, "--layer-split: '{}': no MPI ranks here", sp.device);
      ipc::ShardClientOptions co = client_options(model_path, file, plan, i, sp);
      co.rows_type = rows_type;
      co.spawn = false;
      co.open_stream = [rank = sp.mpi_rank]() -> Result<std::unique_ptr<ipc::ShardStream>> {
        return ipc::mpi::stream_to(rank);
      };
      co.fatal = [](const Status& why) { ipc::mpi::abort(why); };
      co.link = processes->link.get();
      co.link_peer = sp.mpi_rank;
      // Measured on two H200s (30b-a3b, docs/BENCHMARKS.md): a decode step's
      // 8 KB went faster in the frames, 512-row prompt chunks 18% faster over NCCL.
      co.link_min_bytes = size_t(1) << 20;
      MOESERVE_LOG_INFO("waiting for MPI rank {} (layers {}:{})...", sp.mpi_rank, shard.begin, shard.end);
      MOESERVE_ASSIGN_OR_RETURN(std::unique_ptr<ipc::ShardClient> client, ipc::ShardClient::create(co));
      shard.remote = client.get();
      processes->shards.push_back(std::move(client));
      continue;
    }
    if (sp.kind != split::ShardKind::kProcess) continue;
    if (processes == nullptr)
      return make_error(StatusCode::kUnsupported, "--layer-split: '{}': no shard processes here", sp.device);
    runtime::LayerShard& shard = load->layer_shards[i];
    ipc::ShardClientOptions co = client_options(model_path, file, plan, i, sp);
    co.rows_type = rows_type;
    co.spawn = sp.attach_socket.empty();
    co.socket_path = sp.attach_socket;
    if (co.spawn) {
      MOESERVE_ASSIGN_OR_RETURN(co.exe, ipc::self_executable());
    }
    co.threads = load->n_threads;
    MOESERVE_LOG_INFO("starting layer shard {} (layers {}:{})...", sp.device, shard.begin, shard.end);
    MOESERVE_ASSIGN_OR_RETURN(std::unique_ptr<ipc::ShardClient> client, ipc::ShardClient::create(co));
    shard.remote = client.get();
    processes->shards.push_back(std::move(client));
  }
  return Status::ok();
}

}  // namespace moeserve::tools
