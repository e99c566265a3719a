// Serving benchmark load generator (issue 42): the figures vLLM's and
// SGLang's serving benchmarks print — request throughput, output tok/s,
// TTFT, TPOT and inter-token latency p50/p90/p99, the prefix-cache hit rate —
// for any OpenAI-compatible server (moeserve, llama-server, vLLM), so the same
// seed gives every server the same requests. node 20, no packages.
//
//   node bench/server/load_gen.mjs --url http://127.0.0.1:8080 \
//        [--mode closed --clients 64 | --mode open --rate 8] [--requests 256] \
//        [--workload sharegpt|shared-prefix] [--input 200:2000] [--output 100:500] [--seed 1] [--json FILE]
//        [--model-name NAME]  (the "model" field, for servers that need it, e.g. vLLM)
//        [--long-prompt WORDS [--long-at SECONDS]]  (one long prompt arrives mid-run: the other
//        streams' inter-token latency while it is prefilled, e.g. moeserve's --prefill-chunk)
//   node bench/server/load_gen.mjs --bin build/bin/moeserve --model M.gguf [--serve-args="--parallel 64"] ...
//
// Workloads: `sharegpt` — each prompt a fresh random text of uniform length
// in --input (words, about a token each), outputs of uniform length in
// --output; `shared-prefix` — one system prompt of --shared-share of the
// input length (0.9) shared by every request, then a request's own text.
// Output lengths are held with max_tokens and `ignore_eos` (both moeserve and
// llama-server take it). Closed loop: --clients requests in flight, each
// client sending its next one when its last ends. Open loop: arrivals as a
// Poisson process of --rate requests a second, whatever the server's pace.
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';

// ---- workload ------------------------------------------------------------

// A small seeded generator (mulberry32): the same seed, the same requests.
export function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const kWords = ('time person year way day thing man world life hand part child eye woman place work week case point ' +
  'government company number group problem fact be have do say get make go know take see come think look want give ' +
  'use find tell ask seem feel try leave call good new first last long great little own other old right big high ' +
  'different small large next early young important few public bad same able to of in for on with at by from up ' +
  'about into over after river garden engine window silver market letter bridge signal harbor planet pencil').split(' ');

function text(random, words) {
  const out = [];
  for (let i = 0; i < words; ++i) out.push(kWords[Math.floor(random() * kWords.length)]);
  return out.join(' ');
}

function uniform(random, [lo, hi]) { return lo + Math.floor(random() * (hi - lo + 1)); }

function parseRange(s, name) {
  const m = /^(\d+)(?::(\d+))?$/.exec(String(s));
  if (!m) throw new Error(`--${name} takes N or LO:HI, not '${s}'`);
  const lo = Number(m[1]), hi = Number(m[2] ?? m[1]);
  if (lo < 1 || hi < lo) throw new Error(`--${name} ${s}: need 1 <= LO <= HI`);
  return [lo, hi];
}

// The requests of a run: [{messages, maxTokens}], from the seed alone.
export function makeRequests({ workload = 'sharegpt', requests = 64, input = [200, 2000], output = [100, 500],
                               sharedShare = 0.9, seed = 1 }) {
  const random = rng(seed);
  const shared = workload === 'shared-prefix'
    ? `You are the assistant of the ${text(random, 2)} team. ` + text(random, Math.round(input[1] * sharedShare))
    : null;
  const out = [];
  for (let i = 0; i < requests; ++i) {
    const words = uniform(random, input);
    const maxTokens = uniform(random, output);
    const own = `Request ${i}: ` + text(random, shared ? Math.max(1, Math.round(words * (1 - sharedShare))) : words);
    const messages = shared ? [{ role: 'system', content: shared }, { role: 'user', content: own }]
                            : [{ role: 'user', content: own }];
    out.push({ messages, maxTokens });
  }
  return out;
}

// ---- one request ---------------------------------------------------------

// One streamed chat completion: when each token arrived (from the logprobs
// of each chunk: one entry a token, whatever its text), and the usage.
export async function streamRequest(url, model, req, { signal } = {}) {
  const t0 = performance.now();
  const r = { ok: false, start: t0, ttft: null, tokenTimes: [], tokens: 0, usage: null, finish: null, error: null };
  try {
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      signal,
      body: JSON.stringify({ ...(model ? { model } : {}), messages: req.messages, max_tokens: req.maxTokens, ignore_eos: true,
                             temperature: 0, stream: true, stream_options: { include_usage: true },
                             logprobs: true }),
    });
    if (!res.ok) throw new Error(`HTTP ${res.status}: ${(await res.text()).slice(0, 200)}`);
    const dec = new TextDecoder();
    const textTimes = [];
    let buf = '';
    for await (const part of res.body) {
      buf += dec.decode(part, { stream: true });
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, i).trim();
        buf = buf.slice(i + 2);
        if (!ev.startsWith('data:')) continue;
        const data = ev.slice(5).trim();
        if (data === '[DONE]') continue;
        const j = JSON.parse(data);
        if (j.usage) r.usage = j.usage;
        const c = j.choices?.[0];
        if (!c) continue;
        if (c.finish_reason) r.finish = c.finish_reason;
        // Tokens by their logprobs entries (text held back for a stop string
        // comes later, without them); by chunks of text from a server that
        // streams no logprobs.
        const now = performance.now();
        const n = c.logprobs?.content?.length ?? 0;
        for (let k = 0; k < n; ++k) r.tokenTimes.push(now);
        if (c.delta?.content || c.delta?.reasoning_content) textTimes.push(now);
      }
    }
    if (r.tokenTimes.length === 0) r.tokenTimes = textTimes;
    r.tokens = r.tokenTimes.length;
    if (r.tokens > 0) r.ttft = r.tokenTimes[0] - t0;
    r.ok = r.finish !== null && r.usage !== null;
    if (!r.ok) r.error = 'the stream ended without a finish reason and usage';
  } catch (e) {
    r.error = String(e.message ?? e);
  }
  r.end = performance.now();
  return r;
}

// ---- a run ---------------------------------------------------------------

export function percentile(values, p) {
  if (values.length === 0) return NaN;
  const s = [...values].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
}

// Runs `requests` against `url` closed-loop (clients) or open-loop (rate a
// second); with `longPrompt` ({words, at}) one more request of that many
// words arrives `at` seconds in.
export async function runLoad({ url, model, requests, mode = 'closed', clients = 8, rate = 1, seed = 1,
                                longPrompt = null }) {
  const results = new Array(requests.length);
  const t0 = performance.now();
  const long = longPrompt && new Promise((resolve) => setTimeout(() => {
    const random = rng(seed ^ 0x1b873593);
    const req = { messages: [{ role: 'user', content: 'Long request: ' + text(random, longPrompt.words) }], maxTokens: 8 };
    streamRequest(url, model, req).then(resolve);
  }, longPrompt.at * 1e3));
  if (mode === 'closed') {
    let next = 0;
    const client = async () => {
      while (next < requests.length) {
        const i = next++;
        results[i] = await streamRequest(url, model, requests[i]);
      }
    };
    await Promise.all(Array.from({ length: Math.min(clients, requests.length) }, client));
  } else {
    const random = rng(seed ^ 0x5bd1e995);
    const inFlight = [];
    let at = 0;
    for (let i = 0; i < requests.length; ++i) {
      const wait = at - (performance.now() - t0);
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      inFlight.push(streamRequest(url, model, requests[i]).then((r) => { results[i] = r; }));
      at += (-Math.log(1 - random()) / rate) * 1e3;  // exponential gaps: Poisson arrivals
    }
    await Promise.all(inFlight);
  }
  const s = summarize(results, (performance.now() - t0) / 1e3, requests);
  if (long) {
    const r = await long;
    s.longPrompt = { ok: r.ok, error: r.error, promptTokens: r.usage?.prompt_tokens ?? 0, ttftMs: r.ttft };
    // The other streams' gaps that ended while the long prompt was prefilled.
    const from = r.start, to = r.ttft !== null ? r.start + r.ttft : r.end;
    const gaps = [];
    for (const q of results.filter((x) => x?.ok)) {
      for (let k = 1; k < q.tokenTimes.length; ++k) {
        if (q.tokenTimes[k] >= from && q.tokenTimes[k] <= to) gaps.push(q.tokenTimes[k] - q.tokenTimes[k - 1]);
      }
    }
    s.itlDuringLongMs = { ...statsOf(gaps), n: gaps.length };
  }
  return s;
}

function statsOf(v) {
  return { mean: v.reduce((a, x) => a + x, 0) / Math.max(v.length, 1), p50: percentile(v, 50),
           p90: percentile(v, 90), p99: percentile(v, 99) };
}

export function summarize(results, seconds, requests) {
  const ok = results.filter((r) => r.ok);
  const ttft = ok.map((r) => r.ttft).filter((v) => v !== null);
  // Time per output token after the first, per request, counting the tokens
  // usage reports (vLLM's definition: a server that holds text back, e.g. the
  // pieces of a multi-byte character, streams fewer events than tokens); and
  // every gap between streamed token events.
  const outputsOf = (r) => r.usage.completion_tokens ?? r.tokens;
  const tpot = ok.filter((r) => outputsOf(r) > 1 && r.ttft !== null)
    .map((r) => (r.end - r.start - r.ttft) / (outputsOf(r) - 1));
  const itl = [];
  for (const r of ok) {
    for (let k = 1; k < r.tokenTimes.length; ++k) itl.push(r.tokenTimes[k] - r.tokenTimes[k - 1]);
  }
  const outputTokens = ok.reduce((a, r) => a + r.usage.completion_tokens, 0);
  const promptTokens = ok.reduce((a, r) => a + r.usage.prompt_tokens, 0);
  const cached = ok.reduce((a, r) => a + (r.usage.prompt_tokens_details?.cached_tokens ?? 0), 0);
  const stats = statsOf;
  return {
    requests: results.length, completed: ok.length,
    failed: results.filter((r) => !r.ok).map((r) => r.error),
    // Streamed tokens against usage, and usage against max_tokens (ignore_eos).
    tokenMismatches: ok.filter((r) => r.tokens !== r.usage.completion_tokens).length,
    shortAnswers: results.filter((r, i) => r.ok && r.usage.completion_tokens !== requests[i].maxTokens).length,
    seconds, requestThroughput: ok.length / seconds, outputTokS: outputTokens / seconds,
    totalTokS: (outputTokens + promptTokens) / seconds, promptTokens, outputTokens,
    prefixHitRate: promptTokens > 0 ? cached / promptTokens : 0,
    ttftMs: stats(ttft), tpotMs: stats(tpot), itlMs: stats(itl),
    // Per request (completed or not), for looking into a run afterwards.
    perRequest: results.map((r) => ({ ok: r.ok, events: r.tokens, outputTokens: r.usage?.completion_tokens ?? null,
                                      ttftMs: r.ttft, e2eMs: r.end - r.start })),
  };
}

export function report(s, title) {
  const f = (v, d = 1) => (Number.isFinite(v) ? v.toFixed(d) : '-');
  const line = (name, m) => `| ${name} | ${f(m.mean)} | ${f(m.p50)} | ${f(m.p90)} | ${f(m.p99)} |`;
  return [
    `${title}`,
    `requests: ${s.completed} of ${s.requests} completed in ${f(s.seconds, 2)} s` +
      (s.failed.length ? ` (${s.failed.length} failed: ${s.failed[0]})` : ''),
    `request throughput ${f(s.requestThroughput, 2)} req/s, output ${f(s.outputTokS)} tok/s, ` +
      `total (prompt + output) ${f(s.totalTokS)} tok/s; ${s.promptTokens} prompt and ${s.outputTokens} output tokens; ` +
      `prefix cache hit ${f(100 * s.prefixHitRate)}% of prompt tokens`,
    '| ms | mean | p50 | p90 | p99 |', '|---|---:|---:|---:|---:|',
    line('TTFT', s.ttftMs), line('TPOT', s.tpotMs), line('ITL', s.itlMs),
    ...(s.tokenMismatches ? [`${s.tokenMismatches} of ${s.completed} requests streamed fewer token events than usage ` +
                             'counted (text held back): TTFT and ITL are by events, TPOT by usage'] : []),
    ...(s.longPrompt ? [line(`ITL while the long prompt was prefilled (${s.itlDuringLongMs.n} gaps)`, s.itlDuringLongMs),
                        `long prompt: ${s.longPrompt.promptTokens} tokens, first token after ` +
                        `${f(s.longPrompt.ttftMs)} ms${s.longPrompt.ok ? '' : ` (failed: ${s.longPrompt.error})`}`] : []),
  ].join('\n');
}

// ---- the command ---------------------------------------------------------

// The server's KV counters after the run, where it exports them (moeserve's
// /metrics: paged KV blocks, preemptions); {} for servers without them.
async function kvMetrics(url) {
  try {
    const text = await (await fetch(`${url}/metrics`)).text();
    const out = {};
    for (const m of text.matchAll(/^moeserve_kv_(\w+)(?:\{[^}]*\})? ([0-9.e+-]+)$/gm)) out[m[1]] = Number(m[2]);
    return out;
  } catch {
    return {};
  }
}

function startMoeserve(bin, model, extra) {
  const args = ['serve', '-m', model, '--host', '127.0.0.1', '--port', '0', ...extra];
  const proc = spawn(bin, args, { stdio: ['ignore', 'pipe', 'inherit'] });
  return new Promise((resolve, reject) => {
    let out = '';
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/ready at (http:\/\/[^/\s]+)\/?/);
      if (m) resolve({ url: m[1], proc });
    });
    proc.on('exit', (code) => reject(new Error(`moeserve serve exited with ${code} before it was ready`)));
  });
}

async function main() {
  const { values: o } = parseArgs({
    options: {
      url: { type: 'string' }, bin: { type: 'string' }, model: { type: 'string' },
      'serve-args': { type: 'string', default: '' }, 'model-name': { type: 'string' },
      mode: { type: 'string', default: 'closed' }, clients: { type: 'string', default: '8' },
      rate: { type: 'string', default: '4' }, requests: { type: 'string', default: '64' },
      workload: { type: 'string', default: 'sharegpt' }, input: { type: 'string', default: '200:2000' },
      output: { type: 'string', default: '100:500' }, 'shared-share': { type: 'string', default: '0.9' },
      seed: { type: 'string', default: '1' }, warmup: { type: 'string', default: '1' }, json: { type: 'string' },
      'long-prompt': { type: 'string' }, 'long-at': { type: 'string', default: '2' },
    },
  });
  if (!['closed', 'open'].includes(o.mode)) throw new Error(`--mode closed|open, not '${o.mode}'`);
  if (!['sharegpt', 'shared-prefix'].includes(o.workload)) throw new Error(`--workload sharegpt|shared-prefix, not '${o.workload}'`);
  if (!o.url && !(o.bin && o.model)) throw new Error('give --url of a running server, or --bin and --model to start moeserve');
  let server = null;
  const url = o.url ?? (server = await startMoeserve(o.bin, o.model, o['serve-args'].split(' ').filter(Boolean))).url;
  try {
    const requests = makeRequests({ workload: o.workload, requests: Number(o.requests), input: parseRange(o.input, 'input'),
                                    output: parseRange(o.output, 'output'), sharedShare: Number(o['shared-share']),
                                    seed: Number(o.seed) });
    for (let i = 0; i < Number(o.warmup); ++i) {
      await streamRequest(url, o['model-name'], { messages: [{ role: 'user', content: 'warm up' }], maxTokens: 4 });
    }
    const longPrompt = o['long-prompt'] ? { words: Number(o['long-prompt']), at: Number(o['long-at']) } : null;
    const s = await runLoad({ url, model: o['model-name'], requests, mode: o.mode, clients: Number(o.clients),
                              rate: Number(o.rate), seed: Number(o.seed), longPrompt });
    const how = o.mode === 'closed' ? `${o.clients} concurrent clients` : `Poisson arrivals at ${o.rate} req/s`;
    console.log(report(s, `== ${o.workload}, ${how}, ${o.requests} requests (input ${o.input} words, output ${o.output} tokens, seed ${o.seed})`));
    s.serverKv = await kvMetrics(url);
    if (Object.keys(s.serverKv).length) {
      console.log(`server KV: ${Object.entries(s.serverKv).map(([k, v]) => `${k} ${v}`).join(', ')}`);
    }
    if (o.json) writeFileSync(o.json, JSON.stringify({ options: o, ...s }, null, 2));
    process.exitCode = s.completed === s.requests ? 0 : 1;
  } finally {
    server?.proc.kill('SIGTERM');
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  main().catch((e) => { console.error(`load_gen: ${e.message}`); process.exit(2); });
}
