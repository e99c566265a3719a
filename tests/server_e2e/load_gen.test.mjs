// The serving benchmark's load generator (bench/server/load_gen.mjs) against
// the CPU server, briefly: closed loop, open loop (Poisson arrivals) and the
// shared-system-prompt workload. Nothing may be lost: every request
// completes, the tokens streamed are the tokens the usage counts, and with
// ignore_eos every answer is max_tokens long.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, MODEL_MOE_NAME } from './server.mjs';
import { makeRequests, runLoad, report, summarize } from '../../bench/server/load_gen.mjs';

let srv;
before(async () => {
  srv = await startServer({ args: ['--parallel', '4', '--queue', '64'] });
});
after(async () => { await srv?.kill(); });

function checkNothingLost(s, what) {
  assert.deepEqual(s.failed, [], `${what}: failed requests`);
  assert.equal(s.completed, s.requests, `${what}: completed`);
  assert.equal(s.tokenMismatches, 0, `${what}: streamed tokens differ from usage.completion_tokens`);
  assert.equal(s.shortAnswers, 0, `${what}: an answer stopped before max_tokens despite ignore_eos`);
  assert.ok(s.outputTokS > 0 && s.ttftMs.p50 > 0 && s.tpotMs.p99 >= s.tpotMs.p50, `${what}: figures`);
}

// A server that holds text back (llama-server on pieces of multi-byte
// characters) streams fewer events than tokens: TPOT counts usage's tokens
// (vLLM's definition), and the report says events and usage differ.
test('TPOT counts the tokens usage reports, not stream events', () => {
  const r = { ok: true, start: 0, end: 1000, ttft: 100, tokens: 2, tokenTimes: [100, 1000],
              usage: { completion_tokens: 10, prompt_tokens: 5 } };
  const s = summarize([r], 1, [{ maxTokens: 10 }]);
  assert.equal(s.tpotMs.p50, 100);  // (1000 - 100) / (10 - 1)
  assert.equal(s.tokenMismatches, 1);
  assert.deepEqual(s.perRequest[0], { ok: true, events: 2, outputTokens: 10, ttftMs: 100, e2eMs: 1000 });
  assert.match(report(s, 't'), /1 of 1 requests streamed fewer token events than usage counted/);
});

test('closed loop: 4 clients, 12 requests, every one complete', async () => {
  const requests = makeRequests({ requests: 12, input: [20, 60], output: [8, 24], seed: 7 });
  const s = await runLoad({ url: srv.baseURL, model: MODEL_MOE_NAME, requests, mode: 'closed', clients: 4 });
  console.log(report(s, 'closed loop'));
  checkNothingLost(s, 'closed loop');
  assert.equal(s.outputTokens, requests.reduce((a, r) => a + r.maxTokens, 0));
});

test('open loop: Poisson arrivals, every one complete', async () => {
  const requests = makeRequests({ requests: 8, input: [10, 30], output: [4, 12], seed: 8 });
  const s = await runLoad({ url: srv.baseURL, model: MODEL_MOE_NAME, requests, mode: 'open', rate: 20, seed: 8 });
  checkNothingLost(s, 'open loop');
});

test('shared system prompt: later requests hit the prefix cache', async () => {
  const requests = makeRequests({ workload: 'shared-prefix', requests: 6, input: [120, 160], output: [4, 8], seed: 9 });
  assert.equal(requests[0].messages[0].content, requests[5].messages[0].content);
  const s = await runLoad({ url: srv.baseURL, model: MODEL_MOE_NAME, requests, mode: 'closed', clients: 2 });
  checkNothingLost(s, 'shared prefix');
  assert.ok(s.prefixHitRate > 0.3, `prefix hit rate ${s.prefixHitRate}`);
});

test('the same seed makes the same requests', () => {
  const a = makeRequests({ requests: 5, seed: 3 }), b = makeRequests({ requests: 5, seed: 3 });
  assert.deepEqual(a, b);
  assert.notDeepEqual(a, makeRequests({ requests: 5, seed: 4 }));
});
