// The serving benchmark's load generator (bench/server/load_gen.mjs) against
// the CPU server, briefly: closed loop, open loop (Poisson arrivals) and the
// shared-system-prompt workload. Nothing may be lost: every request
// completes, the tokens streamed are the tokens the usage counts, and with
// ignore_eos every answer is max_tokens long.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, MODEL_MOE_NAME } from './server.mjs';
import { makeRequests, runLoad, report } from '../../bench/server/load_gen.mjs';

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
