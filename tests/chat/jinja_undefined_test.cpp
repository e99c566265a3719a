// Undefined values follow Jinja2's default Undefined, which is what
// transformers renders with: missing names and attributes print as "" and are
// falsy, iterate as empty, `is defined` sees them; using one where a real
// value is needed (arithmetic, attribute of it, calling it, tojson) is an error
// that names what was missing.
#include <gtest/gtest.h>

#include "jinja_test_util.h"

namespace moeserve::chat::jinja {
namespace {

using testing::render;
using testing::render_error;

TEST(JinjaUndefined, MissingThingsRenderEmptyAndAreFalsy) {
  nlohmann::ordered_json ctx = {{"m", {{"role", "user"}}}, {"n", nullptr}};
  EXPECT_EQ(render("[{{ nothing }}][{{ m.content }}][{{ m['content'] }}][{{ n.attr }}]", ctx), "[][][][]");
  EXPECT_EQ(render("{% if m.content %}t{% else %}f{% endif %}{% if not nothing %}!{% endif %}", ctx), "f!");
  EXPECT_EQ(render("{{ m.content is defined }}{{ m.content is undefined }}{{ m.role is defined }}", ctx), "FalseTrueTrue");
  EXPECT_EQ(render("{% for x in m.content %}x{% else %}none{% endfor %}", ctx), "none");
  EXPECT_EQ(render("{{ nothing | length }}|{{ nothing | default('d') }}|[{{ nothing | trim }}]|{{ nothing | list }}", ctx), "0|d|[]|[]");
  EXPECT_EQ(render("{{ 'x' in nothing }}|{{ nothing == nothing }}|{{ nothing == none }}|{{ nothing != 'a' }}", ctx),
            "False|True|False|True");
  EXPECT_EQ(render("{{ 'a' ~ nothing ~ 'b' }}", ctx), "ab");
}

TEST(JinjaUndefined, UsingAnUndefinedValueIsAnErrorNamingIt) {
  nlohmann::ordered_json ctx = {{"m", {{"role", "user"}}}};
  EXPECT_EQ(render_error("{{ nothing + 1 }}", ctx).message(), "chat template line 1:12: 'nothing' is undefined");
  EXPECT_EQ(render_error("{{ m.content.strip() }}", ctx).message(),
            "chat template line 1:13: 'dict object' has no attribute 'content'");
  EXPECT_EQ(render_error("{{ nothing.attr }}", ctx).message(), "chat template line 1:11: 'nothing' is undefined");
  EXPECT_EQ(render_error("{{ nothing() }}", ctx).message(), "chat template line 1:4: 'nothing' is undefined");
  EXPECT_EQ(render_error("{{ nothing | tojson }}", ctx).message(),
            "chat template line 1:14: filter 'tojson': Object of type Undefined is not JSON serializable");
  EXPECT_EQ(render_error("{{ [1][5] + 1 }}", ctx).message(), "chat template line 1:11: list index 5 out of range");
  EXPECT_EQ(render_error("{{ -nothing }}", ctx).message(), "chat template line 1:4: 'nothing' is undefined");
}

TEST(JinjaUndefined, LoopNeighboursAtTheEdgesAreUndefined) {
  // The Qwen3.5 template reads loop.previtem / loop.nextitem guarded by `and`.
  const char* t =
      "{% for m in messages %}{% if loop.previtem and loop.previtem.role != 'tool' %}<{% endif %}{{ m.role }}"
      "{% if not loop.last and loop.nextitem.role != 'tool' %}>{% endif %}{% endfor %}";
  nlohmann::ordered_json ctx = {{"messages", {{{"role", "user"}}, {{"role", "tool"}}, {{"role", "tool"}}, {{"role", "user"}}}}};
  EXPECT_EQ(render(t, ctx), "user<tooltool>user");
}

}  // namespace
}  // namespace moeserve::chat::jinja
