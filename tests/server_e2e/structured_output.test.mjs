// Structured output through the official `openai` client's helpers: a zod
// schema sent by zodResponseFormat (chat.completions.parse) and zodTextFormat
// (responses.parse) comes back parsed and valid; strict tools (zodFunction,
// zodResponsesFunction) get calls whose arguments parse; a GBNF `grammar`
// (llama-server's field) is followed; an unsupported schema keyword is a 400
// that names it.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { zodResponseFormat, zodTextFormat, zodFunction, zodResponsesFunction } from 'openai/helpers/zod';
import { z } from 'zod';
import { startServer, postJSON, MODEL_MOE_NAME } from './server.mjs';

const KEY = 'e2e-structured-key';
const MODEL = MODEL_MOE_NAME; // the served file's name without .gguf

const Verdict = z.object({
  answer: z.enum(['yes', 'no', 'maybe']),
  confidence: z.number().int(),
  reasons: z.array(z.string().max(20)).max(2),
  detail: z.object({ flag: z.boolean(), note: z.string().max(10).nullable() }),
});

const Weather = z.object({ city: z.string().max(12), unit: z.enum(['c', 'f']), days: z.number().int().nullable() });

const messages = [{ role: 'system', content: 'You answer in JSON.' }, { role: 'user', content: 'Is water wet?' }];

describe('structured output through the openai client helpers', () => {
  let srv;
  let client;
  before(async () => {
    srv = await startServer({ args: ['--api-key', KEY, '--parallel', '2'] });
    client = new OpenAI({ baseURL: srv.apiURL, apiKey: KEY, maxRetries: 0, timeout: 120_000 });
  });
  after(async () => { await srv?.kill(); });

  test('chat.completions.parse with zodResponseFormat returns a parsed, valid object', async () => {
    for (const temperature of [0, 1]) {
      const c = await client.chat.completions.parse({
        model: MODEL, messages, temperature, seed: 3, max_tokens: 256,
        response_format: zodResponseFormat(Verdict, 'verdict'),
      });
      const m = c.choices[0].message;
      assert.equal(c.choices[0].finish_reason, 'stop', m.content);
      assert.deepEqual(Verdict.parse(m.parsed), m.parsed);
      assert.deepEqual(JSON.parse(m.content), m.parsed);
    }
  });

  test('a streamed json_schema answer is valid once joined', async () => {
    const stream = await client.chat.completions.create({
      model: MODEL, messages, temperature: 0.8, seed: 11, max_tokens: 256, stream: true,
      response_format: zodResponseFormat(Verdict, 'verdict'),
    });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    Verdict.parse(JSON.parse(text));
  });

  test('responses.parse with zodTextFormat returns output_parsed', async () => {
    const r = await client.responses.parse({
      model: MODEL, instructions: 'You answer in JSON.', input: 'Is water wet?', temperature: 0,
      max_output_tokens: 256, text: { format: zodTextFormat(Verdict, 'verdict') },
    });
    assert.equal(r.status, 'completed');
    assert.deepEqual(Verdict.parse(r.output_parsed), r.output_parsed);
  });

  // create(), not parse(): parse() throws on an answer cut by max_tokens,
  // which the tiny model may run into inside a string.
  test('strict tools (zodFunction) get calls whose arguments parse', async () => {
    let calls = 0;
    for (const temperature of [0, 1]) {
      const c = await client.chat.completions.create({
        model: MODEL, temperature, seed: 9, max_tokens: 300, tool_choice: 'required', parallel_tool_calls: false,
        enable_thinking: false,  // the tiny model's reasoning would run to max_tokens before the call
        messages: [{ role: 'user', content: 'What is the weather in Oslo?' }],
        tools: [zodFunction({ name: 'get_weather', parameters: Weather }), zodFunction({ name: 'get_time', parameters: z.object({}) })],
      });
      const choice = c.choices[0];
      if (choice.finish_reason === 'length') continue;
      assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice));
      assert.equal(choice.message.tool_calls.length, 1);
      const call = choice.message.tool_calls[0].function;
      const schema = call.name === 'get_weather' ? Weather : z.object({}).strict();
      schema.parse(JSON.parse(call.arguments));
      calls += 1;
    }
    assert.ok(calls >= 1);
  });

  test('strict tools (zodResponsesFunction) on Responses', async () => {
    const r = await client.responses.create({
      model: MODEL, input: 'What is the weather in Rome?', temperature: 0, max_output_tokens: 300,
      tool_choice: 'required', parallel_tool_calls: false,
      tools: [zodResponsesFunction({ name: 'get_weather', parameters: Weather })],
    });
    assert.equal(r.status, 'completed', JSON.stringify(r.output));
    const calls = r.output.filter((o) => o.type === 'function_call');
    assert.equal(calls.length, 1, JSON.stringify(r.output));
    Weather.parse(JSON.parse(calls[0].arguments));
  });

  test('a GBNF grammar is followed; what cannot be guaranteed is a 400 that says why', async () => {
    const c = await client.chat.completions.create({
      model: MODEL, messages, temperature: 1, seed: 5, max_tokens: 32,
      grammar: 'root ::= ("red" | "green") " " [0-9]{2}',
    });
    assert.match(c.choices[0].message.content, /^(red|green) [0-9]{2}$/);
    const bad = await postJSON(`${srv.apiURL}/chat/completions`, {
      model: MODEL, messages, response_format: { type: 'json_schema',
        json_schema: { name: 'x', schema: { type: 'string', pattern: '^a+$' } } },
    }, { apiKey: KEY });
    assert.equal(bad.status, 400);
    assert.match(bad.json.error.message, /unsupported keyword 'pattern'/);
    const badGrammar = await postJSON(`${srv.apiURL}/chat/completions`, { model: MODEL, messages, grammar: 'root ::= (' },
      { apiKey: KEY });
    assert.equal(badGrammar.status, 400);
    assert.equal(badGrammar.json.error.param, 'grammar');
  });
});
