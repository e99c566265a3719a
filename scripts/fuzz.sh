#!/usr/bin/env bash
# Fuzz the GGUF and safetensors readers, the server's protocol layer
# (request JSON, JSON schemas, model output parsing), its HTTP/1.1 request
# parser, the grammar engine (GBNF, matcher, masks) and the expert worker
# protocol (a parent's byte stream into the worker's session) with
# libFuzzer (clang, ASan + UBSan).
#   scripts/fuzz.sh [SECONDS]        (default 60, split evenly between them)
# Configures build-fuzz/ with clang, builds fuzz_gguf, fuzz_safetensors,
# fuzz_server_api, fuzz_http_parser, fuzz_grammar and fuzz_ipc_frames, writes
# seed corpora (GgufWriter; the protocol's encoders; a few safetensors files,
# request bodies, raw HTTP requests and grammars written here), and fuzzes
# each for SECONDS/6. Exits
# non-zero when a fuzzer finds a crash, leak, timeout or sanitizer report; the input that triggered it is left in
# build-fuzz/fuzz-artifacts/. The grown corpora are kept in
# build-fuzz/fuzz-corpus/{gguf,safetensors,server_api,http_parser,grammar,ipc} for the next run.
# FUZZ_JOBS sets the build parallelism (default: nproc). FUZZ_BUILD_DIR uses
# an existing clang build configured with -DMOESERVE_BUILD_FUZZ=ON instead.
set -euo pipefail

seconds=${1:-60}
targets=6
per_target=$(( seconds / targets > 0 ? seconds / targets : 1 ))
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=${FUZZ_JOBS:-$(nproc)}

if [ -n "${FUZZ_BUILD_DIR:-}" ]; then
  # A build dir configured with clang and -DMOESERVE_BUILD_FUZZ=ON already
  # (scripts/test.sh's sanitizer build).
  build=$(cd "$FUZZ_BUILD_DIR" && pwd)
else
  build=$root/build-fuzz
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DMOESERVE_BUILD_FUZZ=ON -DMOESERVE_BUILD_TESTS=OFF -DMOESERVE_BUILD_BENCH=OFF -DMOESERVE_CUDA=OFF >/dev/null
fi
ninja -C "$build" -j"$jobs" fuzz_gguf fuzz_gguf_seeds fuzz_safetensors fuzz_server_api fuzz_http_parser fuzz_grammar \
  fuzz_ipc_frames fuzz_ipc_seeds

seeds=$build/fuzz-seeds/gguf
corpus=$build/fuzz-corpus/gguf
artifacts=$build/fuzz-artifacts
rm -rf "$seeds"
mkdir -p "$seeds" "$corpus" "$artifacts"
"$build/fuzz/fuzz_gguf_seeds" "$seeds"

# -malloc_limit_mb: one allocation past this is a bug (counts from the file
# must be bounded by its size; inputs here are a few KiB).
if ! "$build/fuzz/fuzz_gguf" -max_total_time="$per_target" -max_len=16384 -malloc_limit_mb=256 -rss_limit_mb=2048 \
  -timeout=10 -dict="$root/fuzz/gguf.dict" -artifact_prefix="$artifacts/" -print_final_stats=1 \
  "$corpus" "$seeds"; then
  echo "fuzz.sh: fuzz_gguf found a problem; reproduce with: $build/fuzz/fuzz_gguf $artifacts/<crash file>" >&2
  exit 1
fi

# Safetensors seeds: u64 LE header length + JSON header + data.
st_seeds=$build/fuzz-seeds/safetensors
st_corpus=$build/fuzz-corpus/safetensors
rm -rf "$st_seeds"
mkdir -p "$st_seeds" "$st_corpus"
write_st_seed() {  # NAME HEADER DATA_BYTES
  local len=${#2} le="" i
  for i in 0 1 2 3 4 5 6 7; do le+=$(printf '\\x%02x' $(( (len >> (8 * i)) & 255 ))); done
  { printf "$le"; printf '%s' "$2"; head -c "$3" /dev/zero; } >"$st_seeds/$1"
}
write_st_seed one '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' 8
write_st_seed meta '{"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[1],"data_offsets":[8,10]}}' 10
write_st_seed empty '{}' 0
st_dict=$build/fuzz-seeds/safetensors.dict
printf '%s\n' '"\"dtype\""' '"\"shape\""' '"\"data_offsets\""' '"\"__metadata__\""' '"\"F32\""' '"\"BF16\""' \
  '"\"F16\""' '"\"I64\""' '"18446744073709551615"' '"-1"' >"$st_dict"
if ! "$build/fuzz/fuzz_safetensors" -max_total_time="$per_target" -max_len=4096 -malloc_limit_mb=256 -rss_limit_mb=2048 \
  -timeout=10 -dict="$st_dict" -artifact_prefix="$artifacts/" -print_final_stats=1 "$st_corpus" "$st_seeds"; then
  echo "fuzz.sh: fuzz_safetensors found a problem; reproduce with: $build/fuzz/fuzz_safetensors $artifacts/<crash file>" >&2
  exit 1
fi

# Server API seeds: request bodies (the first two bytes also pick the output
# parser's cut point and options, so model-output-like seeds are included).
api_seeds=$build/fuzz-seeds/server_api
api_corpus=$build/fuzz-corpus/server_api
rm -rf "$api_seeds"
mkdir -p "$api_seeds" "$api_corpus"
printf '%s' '{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"temperature":0.7,"top_p":0.9,"max_tokens":16,"stop":["\n"],"stream":true,"stream_options":{"include_usage":true}}' >"$api_seeds/chat"
printf '%s' '{"messages":[{"role":"user","content":"w"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"c","content":"ok"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":"auto","chat_template_kwargs":{"enable_thinking":false}}' >"$api_seeds/tools"
printf '%s' '{"prompt":[1,2,3],"logprobs":2,"echo":true,"seed":-1,"n":1}' >"$api_seeds/completion"
printf '%s' '{"messages":[{"role":"user","content":"w"}],"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object","properties":{"n":{"type":"integer"},"t":{"type":"array","items":{"$ref":"#/$defs/T"},"maxItems":3}},"required":["n"],"$defs":{"T":{"anyOf":[{"type":"string","maxLength":4},{"enum":[1,"x",null]}]}}}}}}' >"$api_seeds/schema"
printf '%s' '{"messages":[{"role":"user","content":"w"}],"grammar":"root ::= (\"a\" | [b-d]+ x){2,5}\nx ::= [^\\x00-\\x1f\\u00e9]? # c\n"}' >"$api_seeds/grammar"
printf '%s' '{"content":"hello","add_special":true,"with_pieces":true,"tokens":[1,2]}' >"$api_seeds/tokenize"
printf '%s' '{"messages":[{"role":"user","content":"w"}],"speculative":{"mode":"ngram","max":6,"tree":16}}' >"$api_seeds/speculative"
printf '%s' '{"format":"moeserve-placement","version":1,"model":{"fingerprint":"00112233aabbccdd"},"layers":[{"layer":0,"hot":[1,7]},{"layer":2,"hot":[0]}]}' >"$api_seeds/placement"
printf '%s' '{"format":"moeserve-expert-stats","version":1,"model":{"arch":"qwen3moe","fingerprint":"00112233aabbccdd","n_layer":3,"n_expert":8,"n_expert_used":2},"prefill_tokens":1,"decode_tokens":0,"layers":[{"layer":0,"prefill":[1,0,0,0,0,0,0,1],"decode":[0,0,0,0,0,0,0,0]}]}' >"$api_seeds/stats"
printf '\x07\x03%s' '<think>
r
</think>

a <tool_call>
{"name": "f", "arguments": {"x": 1}}
</tool_call>' >"$api_seeds/output"
api_dict=$build/fuzz-seeds/server_api.dict
printf '%s\n' '"\"messages\""' '"\"role\""' '"\"content\""' '"\"assistant\""' '"\"tool_calls\""' '"\"function\""' \
  '"\"arguments\""' '"\"tools\""' '"\"prompt\""' '"\"temperature\""' '"\"stop\""' '"\"logprobs\""' '"<think>"' \
  '"</think>"' '"<tool_call>"' '"</tool_call>"' '"\"name\""' '"\"layers\""' '"\"hot\""' '"\"layer\""' \
  '"\"fingerprint\""' '"\"prefill\""' '"\"decode\""' '"\"speculative\""' '"\"mode\""' '"\"tree\""' >"$api_dict"
if ! "$build/fuzz/fuzz_server_api" -max_total_time="$per_target" -max_len=4096 -malloc_limit_mb=256 -rss_limit_mb=2048 \
  -timeout=10 -dict="$api_dict" -artifact_prefix="$artifacts/" -print_final_stats=1 "$api_corpus" "$api_seeds"; then
  echo "fuzz.sh: fuzz_server_api found a problem; reproduce with: $build/fuzz/fuzz_server_api $artifacts/<crash file>" >&2
  exit 1
fi

# HTTP parser seeds: raw requests (the first byte picks the feed piece size).
http_seeds=$build/fuzz-seeds/http_parser
http_corpus=$build/fuzz-corpus/http_parser
rm -rf "$http_seeds"
mkdir -p "$http_seeds" "$http_corpus"
printf '\x07%s' $'GET /health HTTP/1.1\r\nHost: x\r\n\r\n' >"$http_seeds/get"
printf '\x00%s' $'POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\n{}GET /a?b=1 HTTP/1.0\r\nConnection: close\r\n\r\n' >"$http_seeds/pipelined"
printf '\x03%s' $'POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n0\r\n\r\n' >"$http_seeds/chunked"
http_dict=$build/fuzz-seeds/http_parser.dict
printf '%s\n' '"GET "' '"POST "' '"HEAD "' '" HTTP/1.1\x0d\x0a"' '" HTTP/1.0\x0d\x0a"' '"\x0d\x0a"' '"Content-Length: "' \
  '"Transfer-Encoding: chunked"' '"Connection: close"' '"Connection: keep-alive"' '"Expect: 100-continue"' '"%2F"' >"$http_dict"
if ! "$build/fuzz/fuzz_http_parser" -max_total_time="$per_target" -max_len=4096 -malloc_limit_mb=256 -rss_limit_mb=2048 \
  -timeout=10 -dict="$http_dict" -artifact_prefix="$artifacts/" -print_final_stats=1 "$http_corpus" "$http_seeds"; then
  echo "fuzz.sh: fuzz_http_parser found a problem; reproduce with: $build/fuzz/fuzz_http_parser $artifacts/<crash file>" >&2
  exit 1
fi
# Grammar seeds: GBNF text, a NUL byte, bytes to feed.
gr_seeds=$build/fuzz-seeds/grammar
gr_corpus=$build/fuzz-corpus/grammar
rm -rf "$gr_seeds"
mkdir -p "$gr_seeds" "$gr_corpus"
printf 'root ::= "{" ws (kv ("," ws kv)*)? "}"\nkv ::= "\\"" [a-z]+ "\\"" ws ":" ws [0-9]{1,3}\nws ::= [ \\t\\n]{0,4}\n\0{"ab": 12, "c":3}' >"$gr_seeds/json"
printf 'root ::= ([^"\\\\] | "\\\\" .)* x?\nx ::= [\\u00e0-\\u00ff\\U0001F600-\\U0001F64F]+\n\0abc\\"\xc3\xa9\xf0\x9f\x98\x80' >"$gr_seeds/utf8"
printf 'root ::= a{2,4} | b+ c?\na ::= "x" | "y" a\nb ::= (c | "z")\nc ::= [q-t]\n\0yyxxzq' >"$gr_seeds/rules"
if ! "$build/fuzz/fuzz_grammar" -max_total_time="$per_target" -max_len=2048 -malloc_limit_mb=512 -rss_limit_mb=2048 \
  -timeout=10 -artifact_prefix="$artifacts/" -print_final_stats=1 "$gr_corpus" "$gr_seeds"; then
  echo "fuzz.sh: fuzz_grammar found a problem; reproduce with: $build/fuzz/fuzz_grammar $artifacts/<crash file>" >&2
  exit 1
fi
# Expert worker protocol seeds: whole parent streams (both transports, every
# payload type, refused and failing calls, another version and placement).
ipc_seeds=$build/fuzz-seeds/ipc
ipc_corpus=$build/fuzz-corpus/ipc
rm -rf "$ipc_seeds"
mkdir -p "$ipc_seeds" "$ipc_corpus"
"$build/fuzz/fuzz_ipc_seeds" "$ipc_seeds"
if ! "$build/fuzz/fuzz_ipc_frames" -max_total_time="$per_target" -max_len=16384 -malloc_limit_mb=256 -rss_limit_mb=2048 \
  -timeout=10 -artifact_prefix="$artifacts/" -print_final_stats=1 "$ipc_corpus" "$ipc_seeds"; then
  echo "fuzz.sh: fuzz_ipc_frames found a problem; reproduce with: $build/fuzz/fuzz_ipc_frames $artifacts/<crash file>" >&2
  exit 1
fi
echo "fuzz.sh: no crashes in ${seconds}s"
