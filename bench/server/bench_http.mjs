// HTTP front-end benchmark (issue 17): request rates, idle connections and
// the engine's step time under streams, against a `moeserve serve` it starts
// itself (node 20, no packages). Clients run on the same machine.
//
//   node bench/server/bench_http.mjs --bin build/bin/moeserve --model M.gguf --mode MODE [--clients N]
//        [--seconds S] [--args="--parallel 4 ..."]
//
// Modes:
//   health      GET /health from N keep-alive clients, one request at a time each: req/s
//   completion  1-token /v1/completions ("Hello", greedy) from N keep-alive clients: req/s (200s, 429s)
//   idle        N open idle connections: the server's RSS and thread count before and after
//   stream      N concurrent streamed greedy chats of up to --tokens tokens, --rounds times: the
//               engine's decode tokens/s and seconds per step from /metrics (N rows a step),
//               client-side chunks/s, the server's CPU time
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import { parseArgs } from 'node:util';

const { values: opt } = parseArgs({
  options: {
    bin: { type: 'string', default: 'build/bin/moeserve' },
    model: { type: 'string' },
    mode: { type: 'string', default: 'health' },
    clients: { type: 'string', default: '256' },
    seconds: { type: 'string', default: '10' },
    tokens: { type: 'string', default: '200' },
    rounds: { type: 'string', default: '1' },
    args: { type: 'string', default: '' },
  },
});
if (!opt.model) throw new Error('--model FILE is required');
const clients = Number(opt.clients);
const seconds = Number(opt.seconds);

function startServer() {
  const args = ['serve', '-m', opt.model, '--port', '0', ...opt.args.split(' ').filter((a) => a)];
  const proc = spawn(opt.bin, args, { stdio: ['ignore', 'pipe', 'inherit'] });
  return new Promise((resolve, reject) => {
    let out = '';
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/ready at http:\/\/([^:/\s]+):(\d+)\//);
      if (m) resolve({ host: m[1], port: Number(m[2]), proc });
    });
    proc.on('exit', (code) => reject(new Error(`server exited with ${code}`)));
  });
}

const status = (pid) => fs.readFileSync(`/proc/${pid}/status`, 'utf8');
const rssKiB = (pid) => Number(/^VmRSS:\s+(\d+)/m.exec(status(pid))[1]);
const threads = (pid) => Number(/^Threads:\s+(\d+)/m.exec(status(pid))[1]);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// The server's CPU time (user + system) in seconds.
const cpuSeconds = (pid) => {
  const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(f[11]) + Number(f[12])) / 100;  // utime, stime in clock ticks (USER_HZ 100)
};

function request(agent, srv, method, path, body) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: srv.host, port: srv.port, method, path, agent,
      headers: body ? { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } : {} },
    (res) => {
      let data = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { data += d; });
      res.on('end', () => resolve({ status: res.statusCode, data }));
    });
    req.on('error', reject);
    if (body) req.write(body);
    req.end();
  });
}

// N clients, each a keep-alive connection sending one request at a time.
async function rate(srv, method, path, body) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: clients });
  const counts = {};
  let stop = false;
  const loop = async () => {
    while (!stop) {
      const r = await request(agent, srv, method, path, body).catch(() => ({ status: 'error' }));
      counts[r.status] = (counts[r.status] ?? 0) + 1;
    }
  };
  await Promise.all(Array.from({ length: clients }, () => request(agent, srv, method, path, body)));  // connect
  const t0 = performance.now();
  const cpu0 = cpuSeconds(srv.proc.pid);
  const loops = Array.from({ length: clients }, loop);
  const threadsDuring = (await sleep(seconds * 500), threads(srv.proc.pid));
  await sleep(seconds * 500);
  stop = true;
  await Promise.all(loops);
  const wall = (performance.now() - t0) / 1e3;
  const cpu = cpuSeconds(srv.proc.pid) - cpu0;
  agent.destroy();
  const total = Object.values(counts).reduce((a, b) => a + b, 0);
  return { clients, seconds: wall.toFixed(1), req_per_s: (total / wall).toFixed(0),
           ok_per_s: ((counts[200] ?? 0) / wall).toFixed(0), statuses: counts, server_threads: threadsDuring,
           server_cpu_us_per_request: (1e6 * cpu / total).toFixed(1) };
}

async function idle(srv) {
  const pid = srv.proc.pid;
  await sleep(500);
  const before = { rss_kib: rssKiB(pid), threads: threads(pid) };
  const sockets = [];
  for (let i = 0; i < clients; i++) {
    sockets.push(await new Promise((resolve, reject) => {
      const s = net.connect({ host: srv.host, port: srv.port }, () => resolve(s));
      s.on('error', reject);
    }));
  }
  // One request on a fresh connection: every earlier one was accepted by then.
  const r = await request(new http.Agent(), srv, 'GET', '/health');
  await sleep(1000);
  const after = { rss_kib: rssKiB(pid), threads: threads(pid) };
  const open = sockets.filter((s) => !s.destroyed).length;
  for (const s of sockets) s.destroy();
  return { connections: clients, still_open: open, health_after: r.status, before, after,
           kib_per_connection: ((after.rss_kib - before.rss_kib) / clients).toFixed(2) };
}

async function metric(srv, name) {
  const r = await request(new http.Agent(), srv, 'GET', '/metrics');
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(r.data);
  return m ? Number(m[1]) : NaN;
}

async function streams(srv) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: clients });
  const chat = (i) => JSON.stringify({ messages: [{ role: 'user', content: `Task ${i}: write a Python function.` }],
    max_tokens: Number(opt.tokens), temperature: 0, stream: true });
  await request(agent, srv, 'POST', '/v1/chat/completions', chat(-1));  // warm-up
  const cpu0 = cpuSeconds(srv.proc.pid);
  const tok0 = await metric(srv, 'moeserve_decode_tokens_total');
  const sec0 = await metric(srv, 'moeserve_decode_seconds_total');
  const t0 = performance.now();
  const rs = [];
  for (let round = 0; round < Number(opt.rounds); round++) {
    rs.push(...await Promise.all(Array.from({ length: clients }, (_, i) =>
      request(agent, srv, 'POST', '/v1/chat/completions', chat(i + 100 * round)))));
  }
  const wall = (performance.now() - t0) / 1e3;
  const tok = (await metric(srv, 'moeserve_decode_tokens_total')) - tok0;
  const sec = (await metric(srv, 'moeserve_decode_seconds_total')) - sec0;
  const cpu = cpuSeconds(srv.proc.pid) - cpu0;
  const chunks = rs.reduce((a, r) => a + (r.data.match(/^data: \{/gm) ?? []).length, 0);
  agent.destroy();
  return { streams: clients, rounds: Number(opt.rounds), wall_s: wall.toFixed(2), decode_tokens: tok, engine_decode_tok_per_s: (tok / sec).toFixed(0),
           ms_per_step: (1e3 * sec / (tok / clients)).toFixed(2), client_chunks_per_s: (chunks / wall).toFixed(0),
           server_cpu_s: cpu.toFixed(2) };
}

const srv = await startServer();
try {
  let result;
  if (opt.mode === 'health') result = await rate(srv, 'GET', '/health');
  else if (opt.mode === 'completion') {
    result = await rate(srv, 'POST', '/v1/completions', JSON.stringify({ prompt: 'Hello', max_tokens: 1, temperature: 0 }));
  } else if (opt.mode === 'idle') result = await idle(srv);
  else if (opt.mode === 'stream') result = await streams(srv);
  else throw new Error(`unknown --mode ${opt.mode}`);
  console.log(JSON.stringify({ mode: opt.mode, bin: opt.bin, args: opt.args, ...result }));
} finally {
  srv.proc.kill('SIGTERM');
}
