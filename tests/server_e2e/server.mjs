// Shared helpers of the end-to-end tests: start `moeserve serve` on a free
// port, wait for its ready line, and make sure it dies with the test.
//
//   const srv = await startServer({ args: ['--parallel', '4'] });
//   ... srv.baseURL (http://127.0.0.1:PORT), srv.apiURL (.../v1), srv.pid
//   await srv.kill();
//
// MOESERVE_BIN overrides the binary (default: build/bin/moeserve of this
// checkout). Every started server is killed when the test process exits, also
// when a test fails or throws.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
// MOESERVE_E2E_MODEL replaces the MoE model the suite serves (e.g.
// tests/data/models/qwen35moe-tiny.bf16.gguf: the suite against a Gated
// DeltaNet hybrid); requests name it by its file name without .gguf.
export const MODEL_MOE = process.env.MOESERVE_E2E_MODEL
  ? path.resolve(REPO_ROOT, process.env.MOESERVE_E2E_MODEL)
  : path.join(REPO_ROOT, 'tests/data/models/qwen3moe-tiny.bf16.gguf');
export const MODEL_MOE_NAME = path.basename(MODEL_MOE, '.gguf');
export const MODEL_DENSE = path.join(REPO_ROOT, 'tests/data/models/qwen3-tiny.bf16.gguf');
export const ARTIFACTS = path.resolve(REPO_ROOT, process.env.MOESERVE_ARTIFACTS || 'build/test-artifacts');

export function moeserveBin() {
  const bin = process.env.MOESERVE_BIN || path.join(REPO_ROOT, 'build/bin/moeserve');
  if (!fs.existsSync(bin)) {
    throw new Error(`moeserve binary not found at ${bin} (build it, or set MOESERVE_BIN)`);
  }
  return bin;
}

const live = new Set();
function killAllSync() {
  for (const child of live) {
    try { child.kill('SIGKILL'); } catch { /* already gone */ }
  }
}
process.on('exit', killAllSync);
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => { killAllSync(); process.exit(130); });
}

const READY_RE = /^moeserve serve: ready at (http:\/\/[^\s/]+)\/?\s*$/;

// Starts the server; resolves once it printed its ready line.
// opts: model (path), args (extra flags), readyTimeoutMs (default 60 s), env.
// MOESERVE_E2E_DEVICE (e.g. cuda) serves on that device instead of the
// default one (scripts/device/e2e_gpu.sh runs the suite against a GPU server).
// MOESERVE_E2E_MOE_ARGS (e.g. "--n-cpu-moe 2") adds flags when the model is
// the MoE one (an expert placement: the suite against a hybrid server).
export async function startServer(opts = {}) {
  const model = opts.model ?? MODEL_MOE;
  const device = process.env.MOESERVE_E2E_DEVICE ? ['--device', process.env.MOESERVE_E2E_DEVICE] : [];
  const moeArgs = model === MODEL_MOE && process.env.MOESERVE_E2E_MOE_ARGS
    ? process.env.MOESERVE_E2E_MOE_ARGS.split(' ').filter((a) => a.length > 0) : [];
  const args = ['serve', '-m', model, '--host', '127.0.0.1', '--port', '0', ...device, ...moeArgs, ...(opts.args ?? [])];
  const bin = moeserveBin();
  const child = spawn(bin, args, {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ...(opts.env ?? {}) },
  });
  live.add(child);

  let stdout = '';
  let stderr = '';
  let exited = null;
  const exitPromise = new Promise((resolve) => {
    child.on('exit', (code, signal) => {
      exited = { code, signal };
      live.delete(child);
      resolve(exited);
    });
  });

  const baseURL = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      reject(new Error(`moeserve serve did not print its ready line within ${(opts.readyTimeoutMs ?? 60000) / 1000} s\n` +
        `command: ${bin} ${args.join(' ')}\nstdout: ${stdout.slice(-2000)}\nstderr: ${stderr.slice(-4000)}`));
    }, opts.readyTimeoutMs ?? 60000);
    let lineBuf = '';
    child.stdout.setEncoding('utf8');
    child.stdout.on('data', (d) => {
      stdout += d;
      if (stdout.length > 1 << 20) stdout = stdout.slice(-(1 << 19));
      lineBuf += d;
      let nl;
      while ((nl = lineBuf.indexOf('\n')) >= 0) {
        const line = lineBuf.slice(0, nl);
        lineBuf = lineBuf.slice(nl + 1);
        const m = READY_RE.exec(line);
        if (m) { clearTimeout(timer); resolve(m[1]); }
      }
    });
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (d) => {
      stderr += d;
      if (stderr.length > 1 << 20) stderr = stderr.slice(-(1 << 19));
    });
    child.on('error', (e) => { clearTimeout(timer); reject(e); });
    exitPromise.then((x) => {
      clearTimeout(timer);
      reject(new Error(`moeserve serve exited before it was ready (code ${x.code}, signal ${x.signal})\n` +
        `command: ${bin} ${args.join(' ')}\nstdout: ${stdout.slice(-2000)}\nstderr: ${stderr.slice(-4000)}`));
    });
  }).catch(async (e) => {
    child.kill('SIGKILL');
    await exitPromise;
    throw e;
  });

  return {
    baseURL,
    apiURL: `${baseURL}/v1`,
    pid: child.pid,
    process: child,
    args,
    stdout: () => stdout,
    stderr: () => stderr,
    // null while running, else {code, signal}
    exitStatus: () => exited,
    // SIGTERM, then SIGKILL after graceMs; resolves with the exit status.
    async kill(graceMs = 5000) {
      if (exited) return exited;
      child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), graceMs);
      const r = await exitPromise;
      clearTimeout(t);
      return r;
    },
  };
}

// fetch with a JSON body; returns {status, headers, text, json (or undefined)}.
export async function postJSON(url, body, { apiKey, headers = {}, raw = false, signal } = {}) {
  const h = { 'Content-Type': 'application/json', ...headers };
  if (apiKey) h.Authorization = `Bearer ${apiKey}`;
  const res = await fetch(url, { method: 'POST', headers: h, body: raw ? body : JSON.stringify(body), signal });
  return readResponse(res);
}

export async function getURL(url, { apiKey, headers = {} } = {}) {
  const h = { ...headers };
  if (apiKey) h.Authorization = `Bearer ${apiKey}`;
  return readResponse(await fetch(url, { headers: h }));
}

async function readResponse(res) {
  const text = await res.text();
  let json;
  try { json = JSON.parse(text); } catch { json = undefined; }
  return { status: res.status, headers: res.headers, text, json };
}

// Asserts an OpenAI-style error body: {"error":{"message","type","param","code"}}.
export function checkErrorBody(assert, r, status, what) {
  assert.equal(r.status, status, `${what}: expected HTTP ${status}, got ${r.status}: ${r.text.slice(0, 500)}`);
  assert.ok(r.json && typeof r.json.error === 'object' && r.json.error !== null,
    `${what}: body is not {"error": {...}}: ${r.text.slice(0, 500)}`);
  const e = r.json.error;
  assert.equal(typeof e.message, 'string', `${what}: error.message not a string`);
  assert.ok(e.message.length > 0, `${what}: empty error.message`);
  assert.equal(typeof e.type, 'string', `${what}: error.type not a string`);
  assert.ok('param' in e, `${what}: error.param missing`);
  assert.ok('code' in e, `${what}: error.code missing`);
}

// Streams an SSE response of /v1/chat/completions or /v1/completions with raw
// fetch; checks the wire format and returns {chunks, sawDone}.
export async function fetchSSE(url, body, { apiKey, signal } = {}) {
  const headers = { 'Content-Type': 'application/json' };
  if (apiKey) headers.Authorization = `Bearer ${apiKey}`;
  const res = await fetch(url, { method: 'POST', headers, body: JSON.stringify(body), signal });
  if (res.status !== 200) {
    throw new Error(`HTTP ${res.status}: ${(await res.text()).slice(0, 500)}`);
  }
  const ctype = res.headers.get('content-type') || '';
  if (!ctype.startsWith('text/event-stream')) throw new Error(`content-type is '${ctype}', not text/event-stream`);
  const dec = new TextDecoder();
  let buf = '';
  const chunks = [];
  let sawDone = false;
  for await (const part of res.body) {
    buf += dec.decode(part, { stream: true });
    let sep;
    while ((sep = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, sep);
      buf = buf.slice(sep + 2);
      for (const line of event.split('\n')) {
        if (line === '' || line.startsWith(':')) continue;
        if (!line.startsWith('data: ')) throw new Error(`unexpected SSE line: ${JSON.stringify(line)}`);
        const data = line.slice(6);
        if (data === '[DONE]') { sawDone = true; continue; }
        if (sawDone) throw new Error('data after [DONE]');
        chunks.push(JSON.parse(data));
      }
    }
  }
  if (buf.trim() !== '') throw new Error(`stream ended inside an event: ${JSON.stringify(buf.slice(0, 200))}`);
  return { chunks, sawDone };
}

// Parses Prometheus text: returns a map name -> [{labels (string), value}].
export function parseMetrics(text) {
  const out = new Map();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    if (!out.has(m[1])) out.set(m[1], []);
    out.get(m[1]).push({ labels: m[2] ?? '', value: Number(m[3]) });
  }
  return out;
}

// Sum of all samples of a metric (undefined when absent).
export function metricSum(metrics, name, labelFilter) {
  const samples = metrics.get(name);
  if (!samples) return undefined;
  return samples.filter((s) => !labelFilter || labelFilter(s.labels)).reduce((a, s) => a + s.value, 0);
}

export function vmRssKiB(pid) {
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const m = /^VmRSS:\s+(\d+)\s+kB/m.exec(status);
  if (!m) throw new Error(`no VmRSS in /proc/${pid}/status`);
  return Number(m[1]);
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
