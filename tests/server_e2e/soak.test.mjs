// Soak (issue 17): 64 concurrent clients for MOESERVE_SOAK_SECONDS (default
// 180) mixing streamed and plain greedy chats, clients that hang up
// mid-stream, malformed JSON, oversized bodies and health checks, against
// `serve --parallel 8 --queue 128 --max-body-kb 64` (a 429, should the
// queue ever be full, is an answer too: counted, and the client goes on). Afterwards: every request
// was answered (or cancelled by its own client), every greedy answer equals
// its solo run, RSS grew less than a bound, the thread count is back to its
// start, and /metrics counts what the clients saw.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { startServer, fetchSSE, postJSON, getURL, parseMetrics, metricSum, vmRssKiB, sleep, MODEL_MOE_NAME } from './server.mjs';

const CLIENTS = 64;
const SECONDS = Number(process.env.MOESERVE_SOAK_SECONDS || 180);
const MAX_TOKENS = 12;
const RSS_GROWTH_LIMIT_MIB = 96;
const MODEL = MODEL_MOE_NAME; // the served file's name without .gguf
const PROMPTS = [
  'Sort a list in Python.', 'What is a hash map?', 'Write a haiku about rain.', 'Explain recursion briefly.',
  'Name three prime numbers.', 'How do I open a file?', 'What does HTTP 503 mean?', 'Reverse a string.',
];

let srv;
before(async () => {
  srv = await startServer({ args: ['--parallel', '8', '--queue', '128', '--max-body-kb', '64'] });
});
after(async () => { await srv?.kill(); });

const threads = (pid) => fs.readdirSync(`/proc/${pid}/task`).length;
const chatBody = (prompt, stream) => ({
  model: MODEL, temperature: 0, max_tokens: MAX_TOKENS, stream, messages: [{ role: 'user', content: prompt }],
});

class Busy extends Error {}

async function streamedText(prompt, signal) {
  const { chunks, sawDone } = await fetchSSE(`${srv.apiURL}/chat/completions`, chatBody(prompt, true), { signal })
    .catch((e) => { throw String(e).includes('HTTP 429') ? new Busy() : e; });
  assert.ok(sawDone, 'stream without [DONE]');
  let text = '';
  for (const c of chunks) for (const ch of c.choices ?? []) text += (ch.delta?.reasoning_content ?? '') + (ch.delta?.content ?? '');
  return text;
}

async function plainText(prompt) {
  const r = await postJSON(`${srv.apiURL}/chat/completions`, chatBody(prompt, false));
  if (r.status === 429) throw new Busy();
  assert.equal(r.status, 200, `plain chat: HTTP ${r.status} ${r.text.slice(0, 300)}`);
  const m = r.json.choices[0].message;
  return (m.reasoning_content ?? '') + (m.content ?? '');
}

// A deterministic generator per client, so a failure can be replayed.
function rng(seed) {
  let s = seed >>> 0;
  return () => { s = (s * 1664525 + 1013904223) >>> 0; return s / 2 ** 32; };
}

test('soak: mixed load, disconnects and bad requests; everything answered and consistent', { timeout: (SECONDS + 240) * 1000 }, async () => {
  // Solo references, one request at a time.
  const solo = new Map();
  for (const p of PROMPTS) solo.set(p, await plainText(p));
  await sleep(500);
  const threadsAtStart = threads(srv.pid);
  const rssAtStart = vmRssKiB(srv.pid);
  const before = parseMetrics((await getURL(`${srv.baseURL}/metrics`)).text);
  const chatOkBefore = metricSum(before, 'moeserve_requests_total', (l) => l.includes('chat/completions') && l.includes('"200"')) ?? 0;
  const chat400Before = metricSum(before, 'moeserve_requests_total', (l) => l.includes('chat/completions') && l.includes('"400"')) ?? 0;

  const seen = { streamed: 0, plain: 0, aborted: 0, malformed: 0, oversized: 0, health: 0, busy: 0 };
  const deadline = Date.now() + SECONDS * 1000;
  async function client(id) {
    const next = rng(1000 + id);
    while (Date.now() < deadline) {
      const x = next();
      const prompt = PROMPTS[Math.floor(next() * PROMPTS.length)];
      try {
        await action(id, x, prompt);
      } catch (e) {
        if (!(e instanceof Busy)) throw e;
        seen.busy++;
        await sleep(50);
      }
    }
  }
  async function action(id, x, prompt) {
    {
      if (x < 0.40) {
        assert.equal(await streamedText(prompt), solo.get(prompt), `client ${id}: streamed answer differs from its solo run`);
        seen.streamed++;
      } else if (x < 0.65) {
        assert.equal(await plainText(prompt), solo.get(prompt), `client ${id}: plain answer differs from its solo run`);
        seen.plain++;
      } else if (x < 0.75) {
        // Hang up after the first chunk.
        const ac = new AbortController();
        const res = await fetch(`${srv.apiURL}/chat/completions`, {
          method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(chatBody(prompt, true)), signal: ac.signal,
        });
        if (res.status === 429) {
          await res.body?.cancel().catch(() => {});
          throw new Busy();
        }
        const reader = res.body.getReader();
        await reader.read();
        ac.abort();
        await reader.cancel().catch(() => {});
        seen.aborted++;
      } else if (x < 0.85) {
        const r = await postJSON(`${srv.apiURL}/chat/completions`, '{"messages": [ {"role": "user", "content": ', { raw: true });
        assert.equal(r.status, 400, `malformed JSON: HTTP ${r.status}`);
        seen.malformed++;
      } else if (x < 0.90) {
        const r = await postJSON(`${srv.apiURL}/chat/completions`, JSON.stringify({ messages: [{ role: 'user', content: 'x'.repeat(100 << 10) }] }), { raw: true })
          .catch((e) => ({ status: 'reset', text: String(e) }));
        assert.ok(r.status === 413 || r.status === 'reset', `oversized body: HTTP ${r.status}`);
        seen.oversized++;
      } else {
        const r = await getURL(`${srv.baseURL}/health`);
        assert.equal(r.status, 200);
        seen.health++;
      }
    }
  }
  await Promise.all(Array.from({ length: CLIENTS }, (_, i) => client(i)));
  console.log(`soak: ${SECONDS} s, ${CLIENTS} clients:`, JSON.stringify(seen));

  // The server settles: cancelled streams leave their slots, threads return.
  let metrics;
  for (let i = 0; i < 100; i++) {
    metrics = parseMetrics((await getURL(`${srv.baseURL}/metrics`)).text);
    if ((metricSum(metrics, 'moeserve_active_slots') ?? 0) === 0 && (metricSum(metrics, 'moeserve_queue_depth') ?? 0) === 0) break;
    await sleep(100);
  }
  assert.equal(metricSum(metrics, 'moeserve_active_slots'), 0, 'slots still busy after the soak');
  assert.equal(metricSum(metrics, 'moeserve_queue_depth'), 0, 'requests still queued after the soak');
  assert.equal(srv.exitStatus(), null, 'the server exited');
  assert.ok(threads(srv.pid) <= threadsAtStart, `threads ${threads(srv.pid)} > ${threadsAtStart} at the start`);
  const growthMiB = (vmRssKiB(srv.pid) - rssAtStart) / 1024;
  assert.ok(growthMiB < RSS_GROWTH_LIMIT_MIB, `RSS grew ${growthMiB.toFixed(1)} MiB (limit ${RSS_GROWTH_LIMIT_MIB})`);
  // Every chat the clients saw answered 200 (streamed, plain, hung up after
  // the first chunk) is counted once as 200; every malformed one as 400.
  const chatOk = metricSum(metrics, 'moeserve_requests_total', (l) => l.includes('chat/completions') && l.includes('"200"')) - chatOkBefore;
  const chat400 = metricSum(metrics, 'moeserve_requests_total', (l) => l.includes('chat/completions') && l.includes('"400"')) - chat400Before;
  assert.equal(chatOk, seen.streamed + seen.plain + seen.aborted, '/metrics 200s for chat');
  const chat429 = (metricSum(metrics, 'moeserve_requests_total', (l) => l.includes('chat/completions') && l.includes('"429"')) ?? 0) -
    (metricSum(before, 'moeserve_requests_total', (l) => l.includes('chat/completions') && l.includes('"429"')) ?? 0);
  assert.equal(chat429, seen.busy, '/metrics 429s for chat');
  assert.equal(chat400, seen.malformed, '/metrics 400s for chat');
  // After the soak the server still answers a fresh request correctly.
  assert.equal(await plainText(PROMPTS[0]), solo.get(PROMPTS[0]));
});
