// Structured output against a corpus of real-world-shaped JSON schemas
// (schemas/corpus.json: 40 schemas written after public API documentation —
// weather, calendar, payments, issues, GeoJSON, JSON Patch, orders, ...). Each
// is sent as response_format json_schema to the trained tiny models at
// temperature 1, and every finished answer must validate against its schema
// with an independent validator (Ajv, JSON Schema 2020-12, with formats).
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { startServer, postJSON, MODEL_MOE, MODEL_MOE_NAME, MODEL_DENSE, REPO_ROOT } from './server.mjs';

const corpus = JSON.parse(fs.readFileSync(path.join(REPO_ROOT, 'tests/server_e2e/schemas/corpus.json'), 'utf8'));
const ajv = new Ajv2020({ strict: true, allowUnionTypes: true, allErrors: true });
addFormats(ajv);

// Runs the whole corpus on one server, a few requests at a time.
async function runCorpus(srv) {
  const results = [];
  const queue = corpus.map((entry, i) => ({ entry, i }));
  const worker = async () => {
    for (let job; (job = queue.shift());) {
      const { entry, i } = job;
      const r = await postJSON(`${srv.apiURL}/chat/completions`, {
        temperature: 1, seed: 100 + i, max_tokens: 400,
        messages: [{ role: 'system', content: 'You answer in JSON.' },
          { role: 'user', content: `Give an example of ${entry.about}.` }],
        response_format: { type: 'json_schema', json_schema: { name: entry.name, schema: entry.schema, strict: true } },
      });
      assert.equal(r.status, 200, `${entry.name}: ${JSON.stringify(r.json)}`);
      const choice = r.json.choices[0];
      results.push({ name: entry.name, schema: entry.schema, finish: choice.finish_reason, content: choice.message.content });
    }
  };
  await Promise.all([worker(), worker(), worker(), worker()]);
  return results;
}

function checkResults(results) {
  let finished = 0;
  for (const r of results) {
    if (r.finish !== 'stop') continue;  // cut by max_tokens: nothing to validate
    finished += 1;
    let doc;
    assert.doesNotThrow(() => { doc = JSON.parse(r.content); }, `${r.name}: not JSON: ${r.content}`);
    const validate = ajv.compile(r.schema);
    assert.ok(validate(doc), `${r.name}: ${ajv.errorsText(validate.errors)}\n${r.content}`);
  }
  // The grammar bounds every string and repetition here, so nearly every
  // answer ends; one cut short may still happen at temperature 1.
  assert.ok(finished >= corpus.length - 4, `only ${finished} of ${corpus.length} answers finished`);
  return finished;
}

for (const [label, model] of [[MODEL_MOE_NAME, MODEL_MOE], ['qwen3-tiny', MODEL_DENSE]]) {
  describe(`the schema corpus on ${label}`, () => {
    let srv;
    before(async () => { srv = await startServer({ model, args: ['--parallel', '4', '--ctx-size', '2048'] }); });
    after(async () => { await srv?.kill(); });

    test('every finished answer validates against its schema (Ajv)', async () => {
      assert.ok(corpus.length >= 30);
      const results = await runCorpus(srv);
      const finished = checkResults(results);
      console.log(`${label}: ${finished}/${corpus.length} answers finished, all valid`);
    });
  });
}
