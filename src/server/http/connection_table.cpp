#include "server/http/connection_table.h"

namespace moeserve::server::http {

ConnectionTable::Admission ConnectionTable::admit(const std::string& peer) {
  std::lock_guard lock(mu_);
  if (max_total_ > 0 && open_ >= max_total_) return Admission::kServerFull;
  if (max_per_client_ > 0) {
    size_t& n = per_client_[peer];
    if (n >= max_per_client_) return Admission::kClientFull;
    ++n;
  }
  ++open_;
  return Admission::kAdmitted;
}

void ConnectionTable::attach(const std::shared_ptr<Connection>& connection) {
  std::lock_guard lock(mu_);
  live_[connection.get()] = connection;
}

void ConnectionTable::release(const Connection* connection, const std::string& peer) {
  std::lock_guard lock(mu_);
  live_.erase(connection);
  if (open_ > 0) --open_;
  if (max_per_client_ == 0) return;
  auto it = per_client_.find(peer);
  if (it != per_client_.end() && --it->second == 0) per_client_.erase(it);
}

std::vector<std::shared_ptr<Connection>> ConnectionTable::live() const {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<Connection>> out;
  out.reserve(live_.size());
  for (const auto& [ptr, weak] : live_) {
    if (auto c = weak.lock()) out.push_back(std::move(c));
  }
  return out;
}

size_t ConnectionTable::open() const {
  std::lock_guard lock(mu_);
  return open_;
}

}  // namespace moeserve::server::http
