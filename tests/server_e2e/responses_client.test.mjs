// `moeserve serve` driven by the official `openai` npm client's Responses API
// (stateless): plain and streamed responses equal the chat path's greedy
// answer, function-call round trips, and the refusals of what a stateless
// server cannot do.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, MODEL_MOE_NAME } from './server.mjs';

const KEY = 'e2e-responses-key';
const MODEL = MODEL_MOE_NAME; // the served file's name without .gguf
const INSTRUCTIONS = 'You write Python.';
const USER = 'Write a function';

// (the SDK's streamed finalResponse() has no output_text convenience field)
const outputText = (resp) => resp.output.filter((o) => o.type === 'message')
  .flatMap((o) => o.content).filter((c) => c.type === 'output_text').map((c) => c.text).join('');
const reasoningText = (resp) => resp.output.filter((o) => o.type === 'reasoning')
  .flatMap((o) => o.content ?? []).map((c) => c.text).join('');

describe('openai responses client against moeserve serve', () => {
  let srv;
  let client;
  before(async () => {
    srv = await startServer({ args: ['--api-key', KEY, '--parallel', '2'] });
    client = new OpenAI({ baseURL: srv.apiURL, apiKey: KEY, maxRetries: 0, timeout: 120_000 });
  });
  after(async () => { await srv?.kill(); });

  const request = { model: MODEL, instructions: INSTRUCTIONS, input: USER, max_output_tokens: 24, temperature: 0 };

  test('responses.create answers what chat.completions answers (greedy)', async () => {
    const resp = await client.responses.create(request);
    assert.equal(resp.object, 'response');
    assert.match(resp.id, /^resp_/);
    assert.ok(['completed', 'incomplete'].includes(resp.status), resp.status);
    if (resp.status === 'incomplete') assert.equal(resp.incomplete_details.reason, 'max_output_tokens');
    assert.equal(resp.instructions, INSTRUCTIONS);
    const chat = await client.chat.completions.create({ model: MODEL, max_tokens: 24, temperature: 0,
      messages: [{ role: 'system', content: INSTRUCTIONS }, { role: 'user', content: USER }] });
    assert.equal(resp.output_text, chat.choices[0].message.content ?? '');
    assert.equal(outputText(resp), resp.output_text);
    assert.equal(reasoningText(resp), chat.choices[0].message.reasoning_content ?? '');
    assert.equal(resp.usage.output_tokens, chat.usage.completion_tokens);
    assert.equal(resp.usage.total_tokens, resp.usage.input_tokens + resp.usage.output_tokens);
  });

  test('a streamed response reassembles to the plain one', async () => {
    const plain = await client.responses.create(request);
    const types = [];
    let last = null;
    const stream = client.responses.stream(request);
    stream.on('event', (e) => { types.push(e.type); last = e; });
    const final = await stream.finalResponse();
    assert.equal(outputText(final), plain.output_text);
    assert.equal(reasoningText(final), reasoningText(plain));
    // (the SDK's snapshot only takes the final object from response.completed)
    assert.equal(last.response.status, plain.status);
    assert.equal(outputText(last.response), plain.output_text);
    assert.equal(types[0], 'response.created');
    assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)), types.at(-1));
    const added = types.filter((t) => t === 'response.output_item.added').length;
    assert.equal(added, types.filter((t) => t === 'response.output_item.done').length);
  });

  test('function tools and a function_call_output round trip are accepted', async () => {
    const resp = await client.responses.create({
      model: MODEL, max_output_tokens: 8, temperature: 0,
      tools: [{ type: 'function', name: 'get_weather', description: 'Weather of a city', strict: true,
        parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'],
          additionalProperties: false } }],
      input: [
        { role: 'user', content: 'Weather in Paris?' },
        { type: 'function_call', call_id: 'call_01', name: 'get_weather', arguments: '{"city":"Paris"}' },
        { type: 'function_call_output', call_id: 'call_01', output: '18 C, sunny' },
      ],
    });
    assert.equal(resp.object, 'response');
    assert.ok(resp.usage.output_tokens > 0);
  });

  test('JSON output: text.format and chat response_format give parseable JSON', async () => {
    const resp = await client.responses.create({ ...request, max_output_tokens: 64,
      text: { format: { type: 'json_schema', name: 'person', schema: { type: 'object',
        properties: { name: { type: 'string' } } } } } });
    assert.equal(resp.text.format.type, 'json_schema');
    assert.ok(resp.output_text.startsWith('{'), resp.output_text);
    if (resp.status === 'completed') assert.equal(typeof JSON.parse(resp.output_text), 'object');
    const chat = await client.chat.completions.create({ model: MODEL, max_tokens: 64, temperature: 0,
      response_format: { type: 'json_object' }, messages: [{ role: 'user', content: 'A person as JSON' }] });
    const content = chat.choices[0].message.content;
    assert.ok(content.startsWith('{'), content);
    if (chat.choices[0].finish_reason === 'stop') assert.equal(typeof JSON.parse(content), 'object');
  });

  test('what a stateless server cannot do is a 400 that says why', async () => {
    await assert.rejects(client.responses.create({ ...request, previous_response_id: 'resp_123' }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'previous_response_id'
        && /stores no responses/.test(e.message));
    await assert.rejects(client.responses.create({ ...request, tools: [{ type: 'web_search' }] }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'tools[0].type');
    await assert.rejects(client.responses.create({ model: 'another-model', input: 'x' }),
      (e) => e instanceof OpenAI.NotFoundError);
  });
});
