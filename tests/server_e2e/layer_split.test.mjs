// A server whose model is split across processes (--layer-split
// cpu,proc:cpu: the second half of the layers and the output head in a
// `moeserve shard` child). The shard killed (-9) under a request: that
// request gets 503 naming the shard, not a hang or a crash; the server
// restarts it, the next request waits for it and gets the same answer as
// before, and /metrics counts the restart.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { startServer, postJSON, sleep, MODEL_MOE_NAME } from './server.mjs';

let srv;
before(async () => {
  srv = await startServer({ args: ['--layer-split', 'cpu,proc:cpu', '--parallel', '2'] });
});
after(async () => { await srv?.kill(); });

// The server's children named moeserve (its shard).
function shardPids() {
  const out = [];
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${d}/stat`, 'utf8');
      const close = stat.lastIndexOf(')');
      const ppid = Number(stat.slice(close + 2).split(' ')[1]);
      if (ppid === srv.pid) out.push(Number(d));
    } catch { /* gone meanwhile */ }
  }
  return out;
}

const ask = () => postJSON(`${srv.apiURL}/chat/completions`, {
  model: MODEL_MOE_NAME,
  messages: [{ role: 'user', content: 'Count from one to ten.' }],
  max_tokens: 16,
  temperature: 0,
});

test('a killed shard fails the request in flight with 503; the next ones are served', async () => {
  const first = await ask();
  assert.equal(first.status, 200, first.text.slice(0, 500));
  const want = first.json.choices[0].message.content;
  let pids = shardPids();
  assert.equal(pids.length, 1, `expected one shard process, found ${pids}`);
  // A long request, and the shard killed while it runs.
  const long = postJSON(`${srv.apiURL}/chat/completions`, {
    model: MODEL_MOE_NAME,
    messages: [{ role: 'user', content: 'Write a long story about a dragon.' }],
    max_tokens: 1500,
    temperature: 0,
  });
  await sleep(300);
  process.kill(pids[0], 'SIGKILL');
  const inFlight = await long;
  console.log(`request in flight at the kill: HTTP ${inFlight.status}`);
  if (inFlight.status === 200) {
    // It finished (an end token) before the kill: nothing was in flight.
    assert.ok(inFlight.json.usage.completion_tokens < 1500, 'a full-length answer despite the kill');
  } else {
    assert.equal(inFlight.status, 503, `in flight at kill -9: ${inFlight.status} ${inFlight.text.slice(0, 500)}`);
    assert.match(inFlight.json.error.message, /layer shard proc:cpu/);
  }
  // The next request waits for the restart and gets the same answer as before.
  const again = await ask();
  assert.equal(again.status, 200, `after the kill: ${again.text.slice(0, 500)}`);
  assert.equal(again.json.choices[0].message.content, want);
  const metrics = await (await fetch(`${srv.baseURL}/metrics`)).text();
  assert.match(metrics, /moeserve_layer_shard_restarts_total\{shard="proc:cpu",layers="2:4"\} [1-9]/);
  assert.match(metrics, /moeserve_layer_shard_up\{shard="proc:cpu",layers="2:4"\} 1/);
  const health = await fetch(`${srv.baseURL}/health`);
  assert.equal(health.status, 200);
  assert.equal(srv.exitStatus(), null);
  const after = shardPids();
  assert.equal(after.length, 1);
  assert.notEqual(after[0], pids[0]);
});
