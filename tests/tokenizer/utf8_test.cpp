#include "tokenizer/utf8.h"

#include <gtest/gtest.h>

#include "tokenizer/byte_level.h"
#include "tokenizer/nfc.h"

namespace moeserve::tok {
namespace {

const std::string kFFFD = "\xEF\xBF\xBD";

TEST(Utf8, ValidationFollowsTheUnicodeRules) {
  EXPECT_TRUE(is_valid_utf8(""));
  EXPECT_TRUE(is_valid_utf8("plain ascii\n"));
  EXPECT_TRUE(is_valid_utf8("\xC3\xA9\xE4\xBD\xA0\xF0\x9F\x98\x80"));  // é 你 😀
  EXPECT_TRUE(is_valid_utf8("\xF4\x8F\xBF\xBF"));                      // U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xFF"));
  EXPECT_FALSE(is_valid_utf8("\xC0\xAF"));          // overlong
  EXPECT_FALSE(is_valid_utf8("\xE0\x80\xAF"));      // overlong
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xE4\xBD"));          // truncated
  EXPECT_FALSE(is_valid_utf8("\x80"));              // lone continuation
}

// Expected outputs are the WHATWG decoder's (what TextDecoder returns).
TEST(Utf8, SanitizeReplacesEachMaximalSubpart) {
  EXPECT_EQ(sanitize_utf8("a\xFF" "b"), "a" + kFFFD + "b");
  EXPECT_EQ(sanitize_utf8("\xF0\x9F\x98"), kFFFD);                        // one truncated sequence
  EXPECT_EQ(sanitize_utf8("\xF0\x9F\x98" "x"), kFFFD + "x");
  EXPECT_EQ(sanitize_utf8("\xC0\xAF"), kFFFD + kFFFD);                    // C0 is never a lead byte
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), kFFFD + kFFFD + kFFFD);        // ED A0: A0 out of range
  EXPECT_EQ(sanitize_utf8("\xF4\x90\x80\x80"), kFFFD + kFFFD + kFFFD + kFFFD);
  EXPECT_EQ(sanitize_utf8("\xE4\xBD\xE4\xBD\xA0"), kFFFD + "\xE4\xBD\xA0");  // held bytes then a valid char
  EXPECT_EQ(sanitize_utf8("\x80\x81"), kFFFD + kFFFD);
  EXPECT_EQ(sanitize_utf8("ok \xC3\xA9"), "ok \xC3\xA9");
}

TEST(Utf8, StreamingMatchesWholeInputAtEverySplit) {
  const std::string input = "a\xF0\x9F\x98\x80\xE4\xBD\xFF\xC3\xA9\xF0\x9F\x98";
  const std::string whole = sanitize_utf8(input);
  for (size_t cut = 0; cut <= input.size(); ++cut) {
    Utf8StreamDecoder decoder;
    std::string out;
    decoder.push(std::string_view(input).substr(0, cut), out);
    EXPECT_TRUE(is_valid_utf8(out));
    decoder.push(std::string_view(input).substr(cut), out);
    decoder.finish(out);
    EXPECT_EQ(out, whole) << "cut at " << cut;
  }
}

TEST(Utf8, AppendAndDecodeRoundTrip) {
  const std::vector<char32_t> cps = {0x41, 0x7F, 0x80, 0x7FF, 0x800, 0xFFFD, 0x10000, 0x1F600, 0x10FFFF};
  std::string text;
  for (char32_t cp : cps) append_utf8(text, cp);
  EXPECT_TRUE(is_valid_utf8(text));
  EXPECT_EQ(decode_valid_utf8(text), cps);
}

TEST(ByteLevel, AlphabetMatchesTheGpt2Definition) {
  const ByteLevelAlphabet& a = ByteLevelAlphabet::get();
  EXPECT_EQ(a.code_point('!'), U'!');
  EXPECT_EQ(a.code_point('~'), U'~');
  EXPECT_EQ(a.code_point(0xA1), 0xA1u);
  EXPECT_EQ(a.code_point(0xFF), 0xFFu);
  EXPECT_EQ(a.code_point(0x00), 256u);  // first non-printable byte
  EXPECT_EQ(a.code_point(' '), 0x120u);  // 'Ġ'
  EXPECT_EQ(a.code_point('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(a.code_point(0xAD), 0x143u);  // the last one (soft hyphen)
  std::vector<bool> seen(0x200, false);
  for (int b = 0; b < 256; ++b) {
    const char32_t cp = a.code_point(static_cast<uint8_t>(b));
    ASSERT_LT(cp, 0x200u);
    EXPECT_FALSE(seen[cp]) << "duplicate code point for byte " << b;
    seen[cp] = true;
    EXPECT_EQ(a.byte_of(cp), b);
  }
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(a.decode(a.encode(all)), all);
  EXPECT_FALSE(a.byte_of(U'你').has_value());
  EXPECT_EQ(a.decode("\xC4\xA0x\xE4\xBD\xA0"), " x\xE4\xBD\xA0");  // outside the alphabet: kept
}

TEST(Nfc, ComposesDecomposedText) {
  EXPECT_EQ(nfc_normalize("e\xCC\x81"), "\xC3\xA9");                        // e + acute -> é
  EXPECT_EQ(nfc_normalize("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // jamo -> 각
  EXPECT_EQ(nfc_normalize("\xE1\x84\x80\xE1\x85\xA1"), "\xEA\xB0\x80");     // LV -> 가
  EXPECT_EQ(nfc_normalize("\xEA\xB0\x80\xE1\x86\xA8"), "\xEA\xB0\x81");     // LV + T -> LVT
  EXPECT_EQ(nfc_normalize("plain ascii"), "plain ascii");
}

TEST(Nfc, ReordersMarksAndRespectsBlocking) {
  // q + dot above (230) + dot below (220) -> q + below + above (no composites).
  EXPECT_EQ(nfc_normalize("q\xCC\x87\xCC\xA3"), "q\xCC\xA3\xCC\x87");
  // a + acute + acute: the second acute is blocked by the first.
  EXPECT_EQ(nfc_normalize("a\xCC\x81\xCC\x81"), "\xC3\xA1\xCC\x81");
  // ộ from o + circumflex + dot below in either order (reordering first).
  EXPECT_EQ(nfc_normalize("o\xCC\x82\xCC\xA3"), "\xE1\xBB\x99");
  EXPECT_EQ(nfc_normalize("o\xCC\xA3\xCC\x82"), "\xE1\xBB\x99");
  // A leading mark has no starter to join.
  EXPECT_EQ(nfc_normalize("\xCC\x81" "a"), "\xCC\x81" "a");
}

TEST(Nfc, SingletonsAndExclusions) {
  EXPECT_EQ(nfc_normalize("\xE2\x84\xAB"), "\xC3\x85");  // Angstrom sign -> Å
  EXPECT_EQ(nfc_normalize("\xE2\x84\xA6"), "\xCE\xA9");  // Ohm sign -> Ω
  // क़ U+0958 is a composition exclusion: NFC leaves it decomposed.
  EXPECT_EQ(nfc_normalize("\xE0\xA5\x98"), "\xE0\xA4\x95\xE0\xA4\xBC");
  EXPECT_EQ(nfc_normalize("\xE0\xA4\x95\xE0\xA4\xBC"), "\xE0\xA4\x95\xE0\xA4\xBC");
  EXPECT_EQ(canonical_combining_class(0x301), 230);
  EXPECT_EQ(canonical_combining_class(0x323), 220);
  EXPECT_EQ(canonical_combining_class('a'), 0);
}

}  // namespace
}  // namespace moeserve::tok
