#include "runtime/model.h"

#include <chrono>

#include "backend/devices.h"
#include "core/log.h"
#include "models/registry.h"
#include "tokenizer/vocab_gguf.h"

namespace moeserve::runtime {

Result<std::unique_ptr<Model>> Model::load(const std::string& path, const ModelLoadOptions& options) {
  MOESERVE_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
  return from_gguf(std::move(file), options);
}

Result<std::unique_ptr<Model>> Model::from_gguf(GgufFile file, const ModelLoadOptions& options) {
  std::unique_ptr<Model> m(new Model(std::move(file)));
  MOESERVE_ASSIGN_OR_RETURN(backend::DeviceChoice choice, backend::choose_device(options.device));
  m->device_reason_ = choice.reason;
  m->pool_ = std::make_unique<ThreadPool>(options.n_threads);
  const bool on_cpu = choice.spec.kind == backend::DeviceKind::kCpu;
  m->cpu_ = std::make_unique<backend::CpuDevice>(backend::CpuDeviceOptions{
      .pool = m->pool_.get(), .pack_weights = options.pack_weights && on_cpu, .release_source = m->file_.file_backed()});
  models::Placement placement;
  placement.io = m->cpu_.get();
  if (!on_cpu) {
    MOESERVE_ASSIGN_OR_RETURN(m->gpu_, backend::open_cuda_device(choice.spec.index));
    placement.io = m->gpu_.get();
  }
  if (options.populate && m->file_.file_backed() && on_cpu) MappedFile::populate(m->file_.bytes());
  const auto t0 = std::chrono::steady_clock::now();
  MOESERVE_ASSIGN_OR_RETURN(m->net_, models::create_model(m->file_, placement));
  if (m->packed().tensors > 0) {
    MOESERVE_LOG_INFO("packed {} weight tensors ({:.2f} GiB) for the {} kernels in {:.2f} s", m->packed().tensors,
                      double(m->packed().bytes) / double(1 << 30), cpu::simd_level_name(cpu::cpu_kernels().level),
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  MOESERVE_ASSIGN_OR_RETURN(tok::VocabData vocab, tok::vocab_from_gguf(m->file_));
  if (int64_t(vocab.tokens.size()) > m->info().n_vocab) {
    return make_error(StatusCode::kInvalidFormat, "{}: the tokenizer has {} tokens but token_embd only {} rows",
                      m->file_.name(), vocab.tokens.size(), m->info().n_vocab);
  }
  MOESERVE_ASSIGN_OR_RETURN(m->tokenizer_, tok::Tokenizer::create(std::move(vocab)));
  return m;
}

Result<KvCache> Model::new_kv_cache(int64_t capacity) {
  return KvCache::allocate(net_->placement(), info().n_layer, info().kv_dim, capacity);
}

}  // namespace moeserve::runtime
