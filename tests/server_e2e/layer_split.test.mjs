// A server whose model is split across processes (--layer-split
// cpu,proc:cpu: the second half of the layers and the output head in a
// `moeserve shard` child). The shard killed (-9): requests get 503 naming
// the shard, not a hang or a crash; the server restarts it and the same
// request then gives the same answer as before.
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

test('a killed shard fails requests with 503 and comes back', async () => {
  const first = await ask();
  assert.equal(first.status, 200, first.text.slice(0, 500));
  const want = first.json.choices[0].message.content;
  const pids = shardPids();
  assert.equal(pids.length, 1, `expected one shard process, found ${pids}`);
  process.kill(pids[0], 'SIGKILL');
  const failed = await ask();
  assert.equal(failed.status, 503, `after kill -9: ${failed.status} ${failed.text.slice(0, 500)}`);
  assert.match(failed.json.error.message, /layer shard proc:cpu/);
  let again;
  const deadline = Date.now() + 60_000;
  do {
    await sleep(200);
    again = await ask();
  } while (again.status !== 200 && Date.now() < deadline);
  assert.equal(again.status, 200, `the shard did not come back: ${again.text.slice(0, 500)}`);
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
