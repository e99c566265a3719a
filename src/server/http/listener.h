// The listening socket: resolves host, binds (port 0: any free port) and
// listens; non-blocking, close-on-exec. The event loop adopts the descriptor.
#pragma once

#include <string>

#include "core/status.h"

namespace moeserve::server::http {

struct Listener {
  int fd = -1;
  int port = 0;    // the bound port
  int family = 0;  // AF_INET or AF_INET6
};

Result<Listener> open_listener(const std::string& host, int port);

}  // namespace moeserve::server::http
