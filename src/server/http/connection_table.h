// The open connections: how many there are, in all and per client address
// (the caps of --max-connections and --max-connections-per-client), and the
// live Connection objects, so that stopping the server reaches every one.
// Thread-safe: connections open on the event loop and may end on any thread.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace moeserve::server::http {

class Connection;

class ConnectionTable {
 public:
  // 0: no cap.
  ConnectionTable(size_t max_total, size_t max_per_client)
      : max_total_(max_total), max_per_client_(max_per_client) {}

  enum class Admission { kAdmitted, kServerFull, kClientFull };
  // Counts a connection from `peer` when there is room for it.
  Admission admit(const std::string& peer);
  // Records an admitted connection's object (for stop_all()).
  void attach(const std::shared_ptr<Connection>& connection);
  // Called once by each admitted connection when it ends.
  void release(const Connection* connection, const std::string& peer);
  // The live connections, for the server to stop them.
  std::vector<std::shared_ptr<Connection>> live() const;
  size_t open() const;
  bool per_client_limited() const { return max_per_client_ > 0; }

 private:
  const size_t max_total_, max_per_client_;
  mutable std::mutex mu_;
  size_t open_ = 0;
  std::unordered_map<std::string, size_t> per_client_;
  std::unordered_map<const Connection*, std::weak_ptr<Connection>> live_;
};

}  // namespace moeserve::server::http
