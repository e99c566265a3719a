#include "format/imatrix.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "core/mapped_file.h"
#include "format/gguf_writer.h"

namespace moeserve {
namespace {

constexpr std::string_view kTypeKey = "general.type";
constexpr std::string_view kDatasetsKey = "imatrix.datasets";
constexpr std::string_view kChunkCountKey = "imatrix.chunk_count";
constexpr std::string_view kChunkSizeKey = "imatrix.chunk_size";
constexpr std::string_view kSum2Suffix = ".in_sum2";
constexpr std::string_view kCountsSuffix = ".counts";
constexpr std::string_view kSumSuffix = ".in_sum";

std::span<const uint8_t> float_bytes(const std::vector<float>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)};
}

bool strip_suffix(std::string_view name, std::string_view suffix, std::string_view* base) {
  if (name.size() <= suffix.size() || name.substr(name.size() - suffix.size()) != suffix) return false;
  *base = name.substr(0, name.size() - suffix.size());
  return true;
}

// The first value that is not a finite number >= 0, or -1.
int64_t first_bad_value(std::span<const float> v) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i]) || v[i] < 0.0f) return int64_t(i);
  }
  return -1;
}

Status check_entry(std::string_view file, std::string_view name, const ImatrixEntry& e) {
  if (const int64_t i = first_bad_value(e.in_sum2); i >= 0) {
    return make_error(StatusCode::kInvalidFormat,
                      "{}: imatrix entry '{}': value {} is {} (expected a finite sum >= 0)", file, name, i,
                      e.in_sum2[size_t(i)]);
  }
  if (const int64_t i = first_bad_value(e.counts); i >= 0) {
    return make_error(StatusCode::kInvalidFormat,
                      "{}: imatrix entry '{}': count {} is {} (expected a finite count >= 0)", file, name, i,
                      e.counts[size_t(i)]);
  }
  return Status::ok();
}

// ---- GGUF ------------------------------------------------------------------------

std::vector<float> tensor_floats(const GgufTensorInfo& t) {
  std::vector<float> v(size_t(t.n_elements()));
  std::memcpy(v.data(), t.data, v.size() * sizeof(float));
  return v;
}

Status read_gguf_keys(const GgufFile& f, Imatrix* m) {
  if (const GgufValue* type = f.find(kTypeKey)) {
    auto s = f.get_string(kTypeKey);
    if (!s || *s != "imatrix") {
      return make_error(StatusCode::kInvalidFormat,
                        "{}: general.type is {}, not \"imatrix\": not an imatrix file", f.name(),
                        s ? fmt::format("\"{}\"", *s) : std::string(type->type_name()));
    }
  }
  if (f.has(kDatasetsKey)) {
    MOESERVE_ASSIGN_OR_RETURN(const std::vector<std::string>* ds, f.require_string_array(kDatasetsKey));
    m->datasets = *ds;
  }
  for (auto [key, out] :
       {std::pair{kChunkCountKey, &m->chunk_count}, std::pair{kChunkSizeKey, &m->chunk_size}}) {
    if (!f.has(key)) continue;
    MOESERVE_ASSIGN_OR_RETURN(const uint64_t v, f.require_uint(key));
    if (v > UINT32_MAX)
      return make_error(StatusCode::kInvalidFormat, "{}: {} = {} is out of range", f.name(), key, v);
    *out = uint32_t(v);
  }
  return Status::ok();
}

Status check_gguf_pair(const GgufFile& f, std::string_view name, const GgufTensorInfo* sums,
                       const GgufTensorInfo* counts) {
  if (sums == nullptr || counts == nullptr) {
    return make_error(StatusCode::kInvalidFormat, "{}: imatrix entry '{}' has {} but no {} tensor", f.name(),
                      name, sums ? kSum2Suffix : kCountsSuffix, sums ? kCountsSuffix : kSum2Suffix);
  }
  for (const GgufTensorInfo* t : {sums, counts}) {
    if (t->type != DType::F32 || t->ne[2] != 1 || t->ne[3] != 1) {
      return make_error(StatusCode::kInvalidFormat,
                        "{}: tensor '{}' is {} {}; an imatrix holds 2-D f32 tensors", f.name(), t->name,
                        dtype_name(t->type), t->shape_string());
    }
  }
  if (counts->ne[0] != 1 || counts->ne[1] != sums->ne[1]) {
    return make_error(StatusCode::kInvalidFormat, "{}: tensor '{}' is {}; for '{}' {} it must be [1, {}]",
                      f.name(), counts->name, counts->shape_string(), sums->name, sums->shape_string(),
                      sums->ne[1]);
  }
  return Status::ok();
}

Result<GgufWriter> imatrix_writer(const Imatrix& m) {
  GgufWriter w;
  w.set_string(kTypeKey, "imatrix");
  w.set_string_array(kDatasetsKey, m.datasets);
  w.set_u32(kChunkCountKey, m.chunk_count);
  w.set_u32(kChunkSizeKey, m.chunk_size);
  for (const auto& [name, e] : m.entries) {  // sorted by name, as llama.cpp writes them
    if (e.n_cols <= 0 || e.n_mat <= 0 || e.in_sum2.size() != size_t(e.n_cols * e.n_mat) ||
        e.counts.size() != size_t(e.n_mat)) {
      return make_error(StatusCode::kInvalidArgument, "imatrix entry '{}': {} sums and {} counts for {} x {}",
                        name, e.in_sum2.size(), e.counts.size(), e.n_mat, e.n_cols);
    }
    MOESERVE_RETURN_IF_ERROR(w.add_tensor(fmt::format("{}{}", name, kSum2Suffix), DType::F32,
                                          {e.n_cols, e.n_mat}, float_bytes(e.in_sum2)));
    MOESERVE_RETURN_IF_ERROR(w.add_tensor(fmt::format("{}{}", name, kCountsSuffix), DType::F32, {1, e.n_mat},
                                          float_bytes(e.counts)));
  }
  return w;
}

}  // namespace

Result<std::vector<uint8_t>> imatrix_to_gguf(const Imatrix& m) {
  MOESERVE_ASSIGN_OR_RETURN(GgufWriter w, imatrix_writer(m));
  return w.write_to_buffer();
}

Status write_imatrix(const Imatrix& m, const std::string& path) {
  MOESERVE_ASSIGN_OR_RETURN(GgufWriter w, imatrix_writer(m));
  return w.write(path);
}

Result<Imatrix> parse_imatrix_gguf(const GgufFile& f) {
  Imatrix m;
  MOESERVE_RETURN_IF_ERROR(read_gguf_keys(f, &m));
  std::map<std::string_view, std::pair<const GgufTensorInfo*, const GgufTensorInfo*>> pairs;
  for (const GgufTensorInfo& t : f.tensors()) {
    std::string_view base;
    if (strip_suffix(t.name, kSum2Suffix, &base)) {
      pairs[base].first = &t;
    } else if (strip_suffix(t.name, kCountsSuffix, &base)) {
      pairs[base].second = &t;
    } else if (!strip_suffix(t.name, kSumSuffix, &base)) {
      return make_error(
          StatusCode::kInvalidFormat,
          "{}: tensor '{}' is not an imatrix tensor (<weight>.in_sum2 / .counts / .in_sum): is this a "
          "model file rather than an imatrix?",
          f.name(), t.name);
    }
  }
  if (pairs.empty()) {
    return make_error(StatusCode::kInvalidFormat, "{}: no importance data (no <weight>.in_sum2 tensors)",
                      f.name());
  }
  for (const auto& [name, pair] : pairs) {
    MOESERVE_RETURN_IF_ERROR(check_gguf_pair(f, name, pair.first, pair.second));
    ImatrixEntry e;
    e.n_cols = pair.first->ne[0];
    e.n_mat = pair.first->ne[1];
    e.in_sum2 = tensor_floats(*pair.first);
    e.counts = tensor_floats(*pair.second);
    MOESERVE_RETURN_IF_ERROR(check_entry(f.name(), name, e));
    m.entries.emplace(std::string(name), std::move(e));
  }
  return m;
}

Result<Imatrix> parse_imatrix(std::span<const uint8_t> bytes, std::string name) {
  if (bytes.size() >= 4 && std::memcmp(bytes.data(), "GGUF", 4) == 0) {
    MOESERVE_ASSIGN_OR_RETURN(GgufFile f, GgufFile::parse_bytes(bytes, std::move(name)));
    return parse_imatrix_gguf(f);
  }
  return parse_imatrix_legacy(bytes, name);
}

Result<Imatrix> read_imatrix(const std::string& path) {
  MOESERVE_ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> map, MappedFile::open(path));
  return parse_imatrix(map->bytes(), path);
}

Result<TensorImportance> tensor_importance(const Imatrix& m, std::string_view name, int64_t n_cols,
                                           int64_t n_mat) {
  const auto it = m.entries.find(name);
  if (it == m.entries.end()) return make_error(StatusCode::kNotFound, "no imatrix entry '{}'", name);
  const ImatrixEntry& e = it->second;
  // A legacy entry stacks every expert's columns in one row with one count.
  const bool flat = e.n_mat == 1 && n_mat > 1 && e.n_cols == n_cols * n_mat;
  if (!flat && (e.n_cols != n_cols || e.n_mat != n_mat)) {
    return make_error(
        StatusCode::kInvalidArgument,
        "imatrix entry '{}' has {} matrices of {} columns, but the tensor has {} of {}: the imatrix "
        "was made for another model",
        name, e.n_mat, e.n_cols, n_mat, n_cols);
  }
  TensorImportance out;
  out.values.assign(size_t(n_cols * n_mat), 0.0f);
  out.present.assign(size_t(n_mat), 0);
  for (int64_t mat = 0; mat < n_mat; ++mat) {
    const float count = e.counts[flat ? 0 : size_t(mat)];
    if (!(count > 0.0f)) continue;
    out.present[size_t(mat)] = 1;
    for (int64_t j = 0; j < n_cols; ++j) {
      const size_t at = size_t(mat * n_cols + j);
      out.values[at] = e.in_sum2[at] / count;
    }
  }
  return out;
}

}  // namespace moeserve
