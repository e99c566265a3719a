// The web chat page served at `/`, driven in headless Chromium (Debian's
// /usr/bin/chromium through playwright-core): send a message, watch it stream,
// check code blocks and HTML escaping, screenshot, and Stop a long generation.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { startServer, postJSON, parseMetrics, metricSum, sleep, ARTIFACTS, MODEL_MOE_NAME } from './server.mjs';

const CHROMIUM = process.env.MOESERVE_CHROMIUM || '/usr/bin/chromium';
const KEY = 'web-test-key';
const MODEL = MODEL_MOE_NAME; // the served file's name without .gguf

let srv;
let browser;
let page;
const pageErrors = [];

before(async () => {
  assert.ok(fs.existsSync(CHROMIUM),
    `${CHROMIUM} not found: the web page test needs Debian's chromium; run scripts/setup.sh (apt-get install chromium)`);
  srv = await startServer({ args: ['--api-key', KEY, '--parallel', '2'] });
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
  page = await browser.newPage({ viewport: { width: 1100, height: 800 } });
  page.on('pageerror', (e) => pageErrors.push(String(e)));
  page.on('console', (m) => {
    // the 401 of /v1/models before the key is entered is expected
    if (m.type() === 'error' && !/Failed to load resource/.test(m.text())) pageErrors.push(`console: ${m.text()}`);
  });
});
after(async () => {
  await browser?.close().catch(() => {});
  await srv?.kill();
});

async function metric(name) {
  const r = await fetch(`${srv.baseURL}/metrics`, { headers: { Authorization: `Bearer ${KEY}` } });
  return metricSum(parseMetrics(await r.text()), name);
}

test('the page is served as self-contained HTML', async () => {
  const r = await fetch(`${srv.baseURL}/`);
  assert.equal(r.status, 200, 'GET / must be open (no API key needed to load the page)');
  assert.match(r.headers.get('content-type') || '', /^text\/html/);
  const html = await r.text();
  assert.match(html, /id="prompt"/);
  assert.doesNotMatch(html, /<script[^>]+src=|<link[^>]+href=["']?https?:/i, 'external resources in the page');
});

test('chat in the browser: stream, code blocks, escaping, screenshot', async () => {
  await page.goto(`${srv.baseURL}/`);
  // without the key the model list is refused; enter it
  await page.fill('#api-key', KEY);
  await page.press('#api-key', 'Tab');
  await page.waitForSelector(`#model option[value="${MODEL}"]`, { state: 'attached', timeout: 15_000 });
  await page.fill('#temperature', '0');
  await page.fill('#max-tokens', '64');

  const text = 'Write a Python function that adds two numbers. <img src=x onerror="window.__xss=1"><b>bold</b>';
  await page.fill('#prompt', text);
  await page.click('#send');
  const done = await page.waitForSelector('.msg.assistant[data-done="1"]', { timeout: 60_000 });
  const answer = (await done.$eval('.content', (e) => e.textContent)).trim();
  assert.ok(answer.length > 0, 'assistant message has no text');
  assert.equal(await done.$$eval('.error', (e) => e.length), 0, `error shown: ${await done.textContent()}`);
  assert.match(await done.$eval('.meta', (e) => e.textContent), /finish: (stop|length)/);

  // user text shown as text, never as HTML
  const userText = await page.$eval('.msg.user', (e) => e.textContent);
  assert.equal(userText, text);
  assert.equal(await page.$$eval('#messages img, #messages b', (e) => e.length), 0, 'user HTML was rendered');
  assert.equal(await page.evaluate(() => window.__xss), undefined, 'injected handler ran');

  // same request through the API (greedy): the page shows the same answer
  const api = await postJSON(`${srv.apiURL}/chat/completions`,
    { model: MODEL, temperature: 0, max_tokens: 64, messages: [{ role: 'user', content: text }] }, { apiKey: KEY });
  assert.equal(api.status, 200, api.text);
  const content = api.json.choices[0].message.content;
  const codes = await done.$$eval('pre code', (e) => e.map((c) => c.textContent));
  if (content.includes('```')) {
    assert.ok(codes.length >= 1, `the answer has a code fence but the page shows no <pre><code>: ${JSON.stringify(content)}`);
    for (const c of codes) assert.ok(content.includes(c), `code block text not in the answer: ${JSON.stringify(c)}`);
  }
  const squash = (s) => s.replace(/```[^\n]*\n?/g, '').replace(/[\s`]+/g, '');
  assert.equal(squash(answer), squash(content),
    'page text differs from the API answer');

  fs.mkdirSync(ARTIFACTS, { recursive: true });
  const shot = path.join(ARTIFACTS, 'web_chat.png');
  await page.screenshot({ path: shot, fullPage: true });
  assert.ok(fs.statSync(shot).size > 1000);
  assert.deepEqual(pageErrors, []);
});

test('Stop ends a long generation, in the page and on the server', async () => {
  // The tiny model can write all 1800 tokens in well under a second, so
  // Stop is clicked from inside the page the moment text arrives (no
  // round trip through the test), and an attempt whose generation still
  // ended first (CI's load decides) is run again.
  let msg, g0, meta = '';
  for (let attempt = 0; attempt < 4 && !/stopped/.test(meta); ++attempt) {
    await page.click('#clear');
    await page.fill('#temperature', '0'); // greedy: this prompt runs to max_tokens without an EOS
    await page.fill('#max-tokens', '1800');
    await page.fill('#prompt', 'Write a long Python module with many classes and functions.');
    g0 = await metric('moeserve_generated_tokens_total');
    await page.click('#send');
    msg = page.locator('.msg.assistant').last();
    await page.waitForFunction(() => {
      const m = [...document.querySelectorAll('.msg.assistant')].pop();
      if (!m || m.querySelector('.content').textContent.length <= 20) return false;
      if (m.getAttribute('data-done') === null) document.querySelector('#stop').click();
      return true;
    }, null, { timeout: 60_000 });
    await page.waitForSelector('.msg.assistant[data-done="1"]', { timeout: 5_000 });
    meta = await msg.locator('.meta').textContent();
  }
  const len1 = (await msg.locator('.content').textContent()).length;
  assert.match(meta, /stopped/, 'every attempt finished before Stop took effect');
  assert.ok(await page.isEnabled('#send'), 'send disabled after stop');
  assert.ok(await page.isDisabled('#stop'), 'stop enabled after stop');
  await sleep(1500);
  const len2 = (await msg.locator('.content').textContent()).length;
  assert.equal(len2, len1, 'text kept growing after Stop');

  // the server stopped generating for the aborted request too
  const g1 = await metric('moeserve_generated_tokens_total');
  await sleep(2000);
  const g2 = await metric('moeserve_generated_tokens_total');
  assert.equal(g2, g1, `server kept generating after the client aborted (${g1} -> ${g2})`);
  assert.ok(g1 - g0 < 1800, `server generated ${g1 - g0} tokens: not stopped early`);

  // the page still works after a stop
  await page.fill('#temperature', '0');
  await page.fill('#max-tokens', '32');
  await page.fill('#prompt', 'def add(a, b):');
  await page.click('#send');
  await page.waitForFunction(() => document.querySelectorAll('.msg.assistant[data-done="1"]').length === 2, null, { timeout: 60_000 });
  // the conversation goes on with the stopped answer in its history; the
  // answer may be all reasoning (an unclosed <think>) within 32 tokens
  const last = page.locator('.msg.assistant').last();
  const shown = (await last.locator('.content').textContent()) + (await last.locator('.reasoning-body').textContent());
  assert.ok(shown.trim().length > 0, 'no answer after a stop');
  assert.equal(await last.locator('.error').count(), 0, `error after a stop: ${await last.textContent()}`);
  assert.match(await last.locator('.meta').textContent(), /finish: (stop|length)/);
  assert.deepEqual(pageErrors, []);
});
