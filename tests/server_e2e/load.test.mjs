// Load: 16 distinct greedy streaming chat requests, first one by one, then all
// at once (continuous batching, --parallel 16). Every concurrent result must
// equal its solo result exactly; memory must not grow much; /metrics must
// count exactly what was served.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, fetchSSE, postJSON, parseMetrics, metricSum, vmRssKiB, MODEL_MOE_NAME } from './server.mjs';

const N = 16;
const MAX_TOKENS = 64;
const RSS_GROWTH_LIMIT_MIB = 64;
const MODEL = MODEL_MOE_NAME; // the served file's name without .gguf

const TOPICS = [
  'reverse a linked list', 'parse a CSV file', 'compute a SHA-256 digest', 'walk a directory tree',
  'merge two sorted lists', 'format a date as ISO 8601', 'retry a network call', 'read a JSON config',
  'count words in a file', 'flatten a nested list', 'validate an email address', 'run a subprocess',
  'cache a function result', 'sort a dict by value', 'encode bytes as base64', 'open a zip archive',
];
const prompts = TOPICS.map((t, i) => `Task ${i + 1}: write a Python function to ${t}.`);

let srv;
before(async () => {
  srv = await startServer({ args: ['--parallel', String(N), '--queue', '64'] });
});
after(async () => { await srv?.kill(); });

async function streamChat(prompt) {
  const { chunks, sawDone } = await fetchSSE(`${srv.apiURL}/chat/completions`, {
    model: MODEL, temperature: 0, max_tokens: MAX_TOKENS, stream: true, stream_options: { include_usage: true },
    messages: [{ role: 'user', content: prompt }],
  });
  assert.ok(sawDone, 'stream did not end with data: [DONE]');
  let content = '';
  let reasoning = '';
  let finish = null;
  let usage = null;
  for (const c of chunks) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices ?? []) {
      content += ch.delta?.content ?? '';
      reasoning += ch.delta?.reasoning_content ?? '';
      if (ch.finish_reason) {
        assert.equal(finish, null, 'two finish_reasons');
        finish = ch.finish_reason;
      }
    }
  }
  assert.ok(usage, 'no usage chunk');
  assert.ok(['stop', 'length'].includes(finish), `finish_reason ${finish}`);
  if (finish === 'length') assert.equal(usage.completion_tokens, MAX_TOKENS, 'finish "length" before max_tokens');
  else assert.ok(usage.completion_tokens <= MAX_TOKENS);
  assert.ok(usage.completion_tokens > 0);
  return { content, reasoning, finish, usage };
}

async function metrics() {
  const r = await fetch(`${srv.baseURL}/metrics`);
  assert.equal(r.status, 200);
  return parseMetrics(await r.text());
}

// Requests counted for the chat endpoint: labelled samples naming "chat" when
// the metric is labelled by endpoint, else every sample.
function chatRequests(m) {
  const samples = m.get('moeserve_requests_total');
  assert.ok(samples, 'no moeserve_requests_total metric');
  const labelled = samples.some((s) => /chat/.test(s.labels));
  return { value: metricSum(m, 'moeserve_requests_total', labelled ? (l) => /chat/.test(l) && !/status="?[45]/.test(l) : null), labelled };
}

test('16 concurrent greedy streams equal their solo runs; memory and metrics', async (t) => {
  // warm-up
  await streamChat('def warm_up():');
  const rss0 = vmRssKiB(srv.pid);
  const m0 = await metrics();

  const solo = [];
  for (const p of prompts) solo.push(await streamChat(p));
  const m1 = await metrics();

  const t0 = Date.now();
  const conc = await Promise.all(prompts.map((p) => streamChat(p)));
  t.diagnostic(`16 concurrent streams: ${Date.now() - t0} ms, ${conc.reduce((a, r) => a + r.usage.completion_tokens, 0)} tokens`);
  const m2 = await metrics();

  for (let i = 0; i < N; i++) {
    assert.equal(conc[i].content, solo[i].content, `request ${i}: concurrent content differs from solo`);
    assert.equal(conc[i].reasoning, solo[i].reasoning, `request ${i}: concurrent reasoning differs from solo`);
    assert.equal(conc[i].finish, solo[i].finish, `request ${i}: finish_reason differs`);
    assert.equal(conc[i].usage.completion_tokens, solo[i].usage.completion_tokens, `request ${i}: completion_tokens differ`);
    assert.equal(conc[i].usage.prompt_tokens, solo[i].usage.prompt_tokens, `request ${i}: prompt_tokens differ`);
  }
  const distinct = new Set(solo.map((r) => r.content)).size;
  assert.ok(distinct >= N / 2, `only ${distinct} distinct outputs for ${N} distinct prompts`);

  // once more, all at once: batching stays deterministic
  const again = await Promise.all(prompts.map((p) => streamChat(p)));
  for (let i = 0; i < N; i++) assert.equal(again[i].content, solo[i].content, `request ${i}: second concurrent round differs`);

  const rss1 = vmRssKiB(srv.pid);
  const growthMiB = (rss1 - rss0) / 1024;
  t.diagnostic(`VmRSS after warm-up ${(rss0 / 1024).toFixed(1)} MiB, after the load ${(rss1 / 1024).toFixed(1)} MiB (growth ${growthMiB.toFixed(1)} MiB)`);
  assert.ok(growthMiB < RSS_GROWTH_LIMIT_MIB, `VmRSS grew by ${growthMiB.toFixed(1)} MiB (limit ${RSS_GROWTH_LIMIT_MIB} MiB)`);

  // metrics: exact counts of what the two phases served
  const sumUsage = (rs, k) => rs.reduce((a, r) => a + r.usage[k], 0);
  const r0 = chatRequests(m0);
  const r1 = chatRequests(m1);
  const r2 = chatRequests(m2);
  const slack = r0.labelled ? 0 : 1; // unlabelled: the /metrics request itself may count
  for (const [a, b, what] of [[r0, r1, 'solo'], [r1, r2, 'concurrent']]) {
    const d = b.value - a.value;
    assert.ok(d >= N && d <= N + slack, `moeserve_requests_total grew by ${d} over the ${what} phase of ${N} requests`);
  }
  for (const [a, b, rs, what] of [[m0, m1, solo, 'solo'], [m1, m2, conc, 'concurrent']]) {
    const dGen = metricSum(b, 'moeserve_generated_tokens_total') - metricSum(a, 'moeserve_generated_tokens_total');
    assert.equal(dGen, sumUsage(rs, 'completion_tokens'), `moeserve_generated_tokens_total delta over the ${what} phase`);
    const dPrompt = metricSum(b, 'moeserve_prompt_tokens_total') - metricSum(a, 'moeserve_prompt_tokens_total');
    assert.equal(dPrompt, sumUsage(rs, 'prompt_tokens'), `moeserve_prompt_tokens_total delta over the ${what} phase`);
  }
  const m3 = await metrics();
  assert.equal(metricSum(m3, 'moeserve_queue_depth'), 0, 'queue not empty after the load');
  assert.ok(metricSum(m3, 'moeserve_kv_cache_used_tokens') !== undefined, 'no moeserve_kv_cache_used_tokens metric');
});

test('more requests than slots queue and still match (non-stream)', async () => {
  // 24 requests on 16 slots: 8 wait in the queue
  const ps = Array.from({ length: 24 }, (_, i) => `def helper_${i}(data):`);
  const body = (p) => ({ model: MODEL, temperature: 0, max_tokens: 24, messages: [{ role: 'user', content: p }] });
  const solo = [];
  for (const p of ps.slice(0, 4)) solo.push(await postJSON(`${srv.apiURL}/chat/completions`, body(p)));
  const all = await Promise.all(ps.map((p) => postJSON(`${srv.apiURL}/chat/completions`, body(p))));
  for (const r of all) assert.equal(r.status, 200, r.text.slice(0, 300));
  for (let i = 0; i < 4; i++) {
    assert.equal(all[i].json.choices[0].message.content, solo[i].json.choices[0].message.content, `request ${i} differs under load`);
  }
});
