// The web chat page served at "/" (src/server/web/index.html, compiled in).
#pragma once

#include <string_view>

namespace moeserve::server {

std::string_view web_page();

}  // namespace moeserve::server
