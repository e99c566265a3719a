#include "server/api/compiled_grammars.h"

#include <list>
#include <mutex>
#include <unordered_map>

#include "runtime/grammar/gbnf.h"

namespace moeserve::server::api {
namespace {

// The most recently used grammars (a few dozen: each is small; texts up to
// the parser's limit).
constexpr size_t kKeep = 64;

struct Cache {
  std::mutex mu;
  std::list<std::string> order;  // most recent first
  std::unordered_map<std::string, std::pair<std::shared_ptr<const runtime::grammar::Grammar>,
                                            std::list<std::string>::iterator>>
      by_text;
};

Cache& cache() {
  static Cache c;
  return c;
}

}  // namespace

Result<std::shared_ptr<const runtime::grammar::Grammar>> compiled_grammar(const std::string& gbnf) {
  Cache& c = cache();
  {
    std::lock_guard lock(c.mu);
    if (auto it = c.by_text.find(gbnf); it != c.by_text.end()) {
      c.order.splice(c.order.begin(), c.order, it->second.second);
      return it->second.first;
    }
  }
  auto g = runtime::grammar::parse_gbnf(gbnf);  // outside the lock: a big grammar takes a while
  if (!g.is_ok()) return g.status();
  std::lock_guard lock(c.mu);
  if (auto it = c.by_text.find(gbnf); it != c.by_text.end()) return it->second.first;
  c.order.push_front(gbnf);
  c.by_text.emplace(gbnf, std::make_pair(*g, c.order.begin()));
  while (c.order.size() > kKeep) {
    c.by_text.erase(c.order.back());
    c.order.pop_back();
  }
  return *g;
}

}  // namespace moeserve::server::api
