// Server benchmark: aggregate generated tokens/s and time to first token with
// 1, 4 and 16 concurrent streams, and the prefix-cache speed-up for a long
// shared system prompt. Starts `moeserve serve` itself (node 20, no packages).
// --constrained runs every level again with a JSON-schema response_format
// and prints what the constraint costs a token.
//
//   node bench/server/bench_server.mjs --bin build/bin/moeserve --model M.gguf \
//        [--threads 2] [--tokens 64] [--concurrency 1,4,16] [--ctx 4096] [--constrained]
import { spawn } from 'node:child_process';
import { parseArgs } from 'node:util';

const { values: opt } = parseArgs({
  options: {
    bin: { type: 'string', default: 'build/bin/moeserve' },
    model: { type: 'string' },
    threads: { type: 'string', default: '0' },
    tokens: { type: 'string', default: '64' },
    concurrency: { type: 'string', default: '1,4,16' },
    ctx: { type: 'string', default: '4096' },
    // Per-token chunks even when a token's text is empty (synthetic
    // make-model vocabularies decode many ids to ""): logprobs on.
    logprobs: { type: 'boolean', default: false },
    constrained: { type: 'boolean', default: false },
  },
});
// The schema of --constrained: open-ended (a list of strings), so answers
// run to max_tokens like the plain ones.
const kSchema = { type: 'json_schema', json_schema: { name: 'notes', schema: {
  type: 'object', additionalProperties: false, required: ['title', 'notes'],
  properties: { title: { type: 'string', maxLength: 40 }, notes: { type: 'array', items: { type: 'string' } } } } } };
if (!opt.model) throw new Error('--model FILE is required');

function startServer(parallel) {
  const args = ['serve', '-m', opt.model, '--port', '0', '--parallel', String(parallel), '--ctx-size', opt.ctx,
                '--threads', opt.threads, '--queue', '64'];
  const proc = spawn(opt.bin, args, { stdio: ['ignore', 'pipe', 'inherit'] });
  return new Promise((resolve, reject) => {
    let out = '';
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/ready at (http:\/\/[^/\s]+)\//);
      if (m) resolve({ url: m[1], proc });
    });
    proc.on('exit', (code) => reject(new Error(`server exited with ${code}`)));
  });
}

// One streamed completion; returns {ttft, tokens, seconds, cached}.
async function stream(url, body) {
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true },
                           ...(opt.logprobs ? { logprobs: true } : {}) }),
  });
  if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  let ttft = null, usage = null, buf = '';
  const dec = new TextDecoder();
  for await (const part of res.body) {
    buf += dec.decode(part, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (j.usage) usage = j.usage;
      const d = j.choices?.[0]?.delta;
      const tokenChunk = d && (d.content || d.reasoning_content || j.choices[0].logprobs);
      if (ttft === null && tokenChunk) ttft = performance.now() - t0;
    }
  }
  return { ttft, tokens: usage.completion_tokens, seconds: (performance.now() - t0) / 1e3,
           cached: usage.prompt_tokens_details?.cached_tokens ?? 0, prompt: usage.prompt_tokens };
}

const words = 'alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma'.split(' ');
const userPrompt = (i) => `Request ${i}: ` + Array.from({ length: 24 }, (_, k) => words[(i * 7 + k * 3 + Math.floor(i / 1000)) % words.length]).join(' ');
const n = Number(opt.tokens);

const median = (a) => { const s = [...a].sort((x, y) => x - y); return s[Math.floor(s.length / 2)]; };
const rows = [];
for (const c of opt.concurrency.split(',').map(Number)) {
  const { url, proc } = await startServer(c);
  try {
    await stream(url, { messages: [{ role: 'user', content: 'warm up' }], max_tokens: 4, temperature: 0 });
    // (free again after the constrained run: the first run of a server pays for warming up)
    for (const [run, constrained] of (opt.constrained ? [false, true, false] : [false]).entries()) {
      const t0 = performance.now();
      const rs = await Promise.all(Array.from({ length: c }, (_, i) =>
        // (other prompts for the second run: nothing comes from the prefix cache)
        stream(url, { messages: [{ role: 'user', content: userPrompt(i + 1000 * run) }],
                      max_tokens: n, temperature: 0,
                      ...(constrained ? { response_format: kSchema } : {}) })));
      const wall = (performance.now() - t0) / 1e3;
      const total = rs.reduce((a, r) => a + r.tokens, 0);
      rows.push({ c, constrained, total, wall, agg: total / wall, ttft: median(rs.map((r) => r.ttft)),
                  ttftMax: Math.max(...rs.map((r) => r.ttft)), perStream: median(rs.map((r) => r.tokens / r.seconds)),
                  decode: median(rs.map((r) => (r.tokens - 1) / (r.seconds - (r.ttft ?? 0) / 1e3))) });
    }
  } finally {
    proc.kill('SIGTERM');
  }
}
console.log('| streams | answer | generated tokens | wall s | aggregate tok/s | per-stream tok/s (median) | per-stream decode tok/s (after the first token) | TTFT median ms | TTFT max ms |');
console.log('|---:|---|---:|---:|---:|---:|---:|---:|---:|');
for (const r of rows) {
  console.log(`| ${r.c} | ${r.constrained ? 'JSON schema' : 'free'} | ${r.total} | ${r.wall.toFixed(2)} | ${r.agg.toFixed(1)} | ` +
              `${r.perStream.toFixed(1)} | ${r.decode.toFixed(1)} | ${r.ttft?.toFixed(0) ?? "-"} | ${Number.isFinite(r.ttftMax) ? r.ttftMax.toFixed(0) : "-"} |`);
}
// What the constraint costs: the extra time a generated token takes in the
// aggregate (the engine steps all streams together), per stream-token.
for (const r of rows.filter((x) => x.constrained)) {
  const free = rows.findLast((x) => x.c === r.c && !x.constrained);
  const extraUs = 1e6 / r.decode - 1e6 / free.decode;
  console.log(`constraint at ${r.c} stream(s): aggregate ${(100 * (r.agg / free.agg - 1)).toFixed(1)}% tok/s, ` +
              `decode ${(100 * (r.decode / free.decode - 1)).toFixed(1)}% (${extraUs.toFixed(0)} us more a step)`);
}

// Prefix cache: the same long system prompt, different questions.
{
  const { url, proc } = await startServer(1);
  try {
    const system = 'You are a careful assistant. ' + Array.from({ length: 300 }, (_, k) => words[k % words.length]).join(' ');
    const ask = (q) => stream(url, { messages: [{ role: 'system', content: system }, { role: 'user', content: q }],
                                      max_tokens: 8, temperature: 0 });
    const cold = await ask('First question?');
    const warm = await ask('Second, different question?');
    console.log(`\nprefix cache: prompt ${cold.prompt} tokens; cold TTFT ${cold.ttft.toFixed(0)} ms, ` +
                `warm TTFT ${warm.ttft.toFixed(0)} ms (${warm.cached} tokens reused) -> ${(cold.ttft / warm.ttft).toFixed(1)}x`);
  } finally {
    proc.kill('SIGTERM');
  }
}
