// UTF-8 helpers and Python str methods for the chat-template engine.
//
// Strings stay UTF-8 internally; anything Python counts or indexes (length,
// slicing, strip characters) works in code points, as Python does. Case
// mapping (upper/lower/title/capitalize) covers ASCII only: chat templates
// apply it to role and type names, never to user text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::chat::jinja {

// Decodes the code point starting at s[i] and advances i past it. A malformed
// byte decodes as U+FFFD and advances by one, so every input terminates.
uint32_t utf8_decode_at(std::string_view s, size_t& i);
size_t utf8_length(std::string_view s);
// Byte offset of every code point, plus s.size() at the end.
std::vector<size_t> utf8_offsets(std::string_view s);
bool is_ascii(std::string_view s);

// Python's str.isprintable() for one code point (approximate outside the
// ranges chat text uses: controls, separators and format characters).
bool python_is_printable(uint32_t cp);
// Python's str.isspace() for one code point.
bool python_is_space(uint32_t cp);

// str.strip/lstrip/rstrip: `chars` absent strips whitespace.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right);
// str.split/rsplit: `sep` absent splits on runs of whitespace and drops empty
// parts; maxsplit < 0 means no limit.
std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit);
std::vector<std::string> py_rsplit(std::string_view s, const std::optional<std::string>& sep,
                                   int64_t maxsplit);
// str.replace; count < 0 replaces all. An empty `from` inserts `to` between
// code points, as Python does.
std::string py_replace(std::string_view s, std::string_view from, std::string_view to,
                       int64_t count);
// str.count / str.find (code-point index of the first match, or -1).
int64_t py_count(std::string_view s, std::string_view sub);
int64_t py_find(std::string_view s, std::string_view sub, bool from_right);

std::string ascii_lower(std::string_view s);
std::string ascii_upper(std::string_view s);
// str.title(): a letter following a non-letter starts a word.
std::string py_title_method(std::string_view s);
// Jinja's |title filter: words start after whitespace or one of -([{<.
std::string jinja_title_filter(std::string_view s);
// str.capitalize(): first character upper, the rest lower.
std::string py_capitalize(std::string_view s);

}  // namespace moeserve::chat::jinja
