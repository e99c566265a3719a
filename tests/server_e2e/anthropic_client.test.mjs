// `moeserve serve` driven by the official Anthropic npm client (the Messages
// API that coding agents speak): plain and streamed messages equal the
// OpenAI chat path's greedy answer, count_tokens, tool use round trips,
// x-api-key authentication and errors in Anthropic's shape.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { startServer, postJSON, MODEL_MOE_NAME } from './server.mjs';

const KEY = 'e2e-anthropic-key';
const MODEL = MODEL_MOE_NAME; // the served file's name without .gguf
const SYSTEM = 'You write Python.';
const USER = 'Write a function';

const text = (msg) => msg.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
const thinking = (msg) => msg.content.filter((b) => b.type === 'thinking').map((b) => b.thinking).join('');

describe('anthropic client against moeserve serve', () => {
  let srv;
  let client;
  before(async () => {
    srv = await startServer({ args: ['--api-key', KEY, '--parallel', '2'] });
    client = new Anthropic({ baseURL: srv.baseURL, apiKey: KEY, maxRetries: 0, timeout: 120_000 });
  });
  after(async () => { await srv?.kill(); });

  const request = { model: 'local-model', max_tokens: 24, temperature: 0, system: SYSTEM,
    messages: [{ role: 'user', content: USER }] };

  test('messages.create answers what chat.completions answers (greedy)', async () => {
    const msg = await client.messages.create(request);
    assert.equal(msg.type, 'message');
    assert.equal(msg.role, 'assistant');
    assert.match(msg.id, /^msg_/);
    assert.ok(['end_turn', 'max_tokens'].includes(msg.stop_reason), msg.stop_reason);
    assert.ok(msg.usage.input_tokens + (msg.usage.cache_read_input_tokens ?? 0) > 0);
    assert.ok(msg.usage.output_tokens > 0 && msg.usage.output_tokens <= 24);
    const openai = new OpenAI({ baseURL: srv.apiURL, apiKey: KEY, maxRetries: 0, timeout: 120_000 });
    const chat = await openai.chat.completions.create({ model: MODEL, max_tokens: 24, temperature: 0,
      messages: [{ role: 'system', content: SYSTEM }, { role: 'user', content: USER }] });
    assert.equal(text(msg), chat.choices[0].message.content ?? '');
    assert.equal(thinking(msg), chat.choices[0].message.reasoning_content ?? '');
    assert.equal(msg.usage.output_tokens, chat.usage.completion_tokens);
  });

  test('a streamed message reassembles to the plain one, events in order', async () => {
    const plain = await client.messages.create(request);
    const types = [];
    const stream = client.messages.stream(request);
    stream.on('streamEvent', (e) => types.push(e.type));
    const final = await stream.finalMessage();
    assert.equal(text(final), text(plain));
    assert.equal(thinking(final), thinking(plain));
    assert.equal(final.stop_reason, plain.stop_reason);
    assert.equal(final.usage.output_tokens, plain.usage.output_tokens);
    assert.equal(types[0], 'message_start');
    assert.equal(types.at(-1), 'message_stop');
    assert.equal(types.at(-2), 'message_delta');
    assert.equal(types.filter((t) => t === 'content_block_start').length,
      types.filter((t) => t === 'content_block_stop').length);
  });

  test('count_tokens counts the prompt the message used', async () => {
    const { model, system, messages } = request;
    const counted = await client.messages.countTokens({ model, system, messages });
    const msg = await client.messages.create(request);
    assert.equal(counted.input_tokens, msg.usage.input_tokens + (msg.usage.cache_read_input_tokens ?? 0));
  });

  test('tool definitions, tool_use and tool_result turns are accepted', async () => {
    const msg = await client.messages.create({
      model: 'any', max_tokens: 8, temperature: 0,
      tools: [{ name: 'get_weather', description: 'Weather of a city',
        input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }],
      tool_choice: { type: 'auto' },
      messages: [
        { role: 'user', content: 'Weather in Paris?' },
        { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_01', name: 'get_weather', input: { city: 'Paris' } }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_01', content: '18 C, sunny' }] },
      ],
    });
    assert.equal(msg.type, 'message');
    assert.ok(msg.usage.output_tokens > 0);
  });

  test('errors come in Anthropic\'s shape with the right class', async () => {
    await assert.rejects(client.messages.create({ model: 'x', messages: [{ role: 'user', content: 'hi' }] }),
      (e) => e instanceof Anthropic.BadRequestError && e.error?.error?.type === 'invalid_request_error'
        && /max_tokens/.test(e.error.error.message));
    const wrongKey = new Anthropic({ baseURL: srv.baseURL, apiKey: 'nope', maxRetries: 0 });
    await assert.rejects(wrongKey.messages.create(request),
      (e) => e instanceof Anthropic.AuthenticationError && e.error?.error?.type === 'authentication_error');
    await assert.rejects(client.messages.create({ ...request, messages: [{ role: 'user',
      content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } }] }] }),
    (e) => e instanceof Anthropic.BadRequestError && /text only/.test(e.error.error.message));
    const raw = await postJSON(`${srv.baseURL}/v1/messages`, '{"max_tokens": 5, "messages": [',
      { raw: true, headers: { 'x-api-key': KEY } });
    assert.equal(raw.status, 400);
    assert.equal(raw.json?.type, 'error');
    assert.equal(raw.json?.error?.type, 'invalid_request_error');
  });
});
