// llama.cpp's prefill and decode speed on a GGUF file, measured the way
// `moeserve bench -p P -n N` measures ours, so both can be run side by side
// on one machine at one time (the VM's memory bandwidth drifts by 2x over an
// hour, so numbers taken at different times do not compare).
//
// llama.cpp comes from node-llama-cpp's prebuilt binaries: an official
// ggml-org build with every x86 CPU variant, the best one for this CPU chosen
// at run time (as a llama.cpp release build does). See README.md.
//
//   node bench_llamacpp.mjs -m FILE [-p 128] [-n 32] [-r 2] [-t 2]
//
// pp: the P-token random prompt in one batch into an empty context.
// tg: N single-token decode steps into an empty context, each followed by a
// greedy pick, as `moeserve bench` does. "eval" is llama.cpp's own timer for
// the same steps (decode only, without the pick and the JS round trip).
import {existsSync} from "node:fs";
import {parseArgs} from "node:util";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const {values: a} = parseArgs({
  options: {
    model: {type: "string", short: "m"},
    prompt: {type: "string", short: "p", default: "128"},
    gen: {type: "string", short: "n", default: "32"},
    reps: {type: "string", short: "r", default: "2"},
    threads: {type: "string", short: "t", default: "2"},
  },
});
if (!a.model) {
  console.error("usage: node bench_llamacpp.mjs -m FILE [-p 128] [-n 32] [-r 2] [-t 2]");
  process.exit(2);
}
const nPrompt = +a.prompt, nGen = +a.gen, reps = +a.reps, threads = +a.threads;
if (![nPrompt, nGen, reps, threads].every(Number.isInteger) || nPrompt < 0 || nGen < 0 || reps < 1 || threads < 1) {
  console.error("-p and -n must be integers >= 0, -r and -t integers >= 1");
  process.exit(2);
}
if (!existsSync(a.model)) {
  console.error(`${a.model}: no such file (make one with: moeserve make-model --arch qwen3moe --preset small --type q4_k_m --seed 1 -o ${a.model})`);
  process.exit(1);
}

// printTimings() reports through the logger; keep the last "eval time" line.
let lastEvalMsPerToken = NaN;
const logger = (level, message) => {
  const m = /\beval time =\s*([\d.]+) ms \/\s*(\d+) runs/.exec(message);
  if (m && !/prompt eval/.test(message)) lastEvalMsPerToken = +m[1] / +m[2];
  else if (level === LlamaLogLevel.error) console.error(message);
};
const llama = await getLlama({gpu: false, build: "never", logger, logLevel: LlamaLogLevel.info});
const model = await llama.loadModel({modelPath: a.model, gpuLayers: 0, useMmap: true});
// Prompt tokens are drawn from the whole vocabulary, as `moeserve bench` does.
const vocab = model.fileInfo.metadata.tokenizer?.ggml?.tokens?.length;
if (!vocab) {
  console.error(`${a.model}: no tokenizer.ggml.tokens in the file's metadata`);
  process.exit(1);
}

const meanSd = (xs) => {
  const m = xs.reduce((s, x) => s + x, 0) / xs.length;
  const sd = Math.sqrt(xs.reduce((s, x) => s + (x - m) ** 2, 0) / Math.max(1, xs.length - 1));
  return `${m.toFixed(2)} ± ${sd.toFixed(2)}`;
};
const newSequence = async () => {
  const context = await model.createContext({
    contextSize: Math.max(nPrompt, nGen) + 16, batchSize: Math.max(nPrompt, 1), threads, performanceTracking: true,
  });
  return {context, seq: context.getSequence()};
};

let seed = 42;
const rand = () => (seed = (seed * 1103515245 + 12345) % 2147483648);
const pp = [], tg = [], evalRate = [];
for (let r = 0; r <= reps; ++r) {  // repetition 0 warms up, as llama-bench does
  if (nPrompt > 0) {
    const {context, seq} = await newSequence();
    const prompt = Array.from({length: nPrompt}, () => rand() % vocab);
    const t0 = performance.now();
    await seq.evaluateWithoutGeneratingNewTokens(prompt);
    if (r > 0) pp.push(nPrompt / ((performance.now() - t0) / 1000));
    await context.dispose();
  }
  if (nGen > 0) {
    const {context, seq} = await newSequence();
    let n = 0;
    const t0 = performance.now();
    for await (const _ of seq.evaluate([rand() % vocab], {temperature: 0})) {
      if (++n >= nGen) break;
    }
    const s = (performance.now() - t0) / 1000;
    await context.printTimings();
    if (r > 0) {
      tg.push(nGen / s);
      if (Number.isFinite(lastEvalMsPerToken)) evalRate.push(1000 / lastEvalMsPerToken);
    }
    await context.dispose();
  }
}
const cpu = /CPU : (.*)/.exec(llama.systemInfo)?.[1]?.trim() ?? llama.systemInfo;
console.log(`llama.cpp release ${llama.llamaCppRelease.release} (${llama.buildType}), ${threads} threads; ${cpu}`);
console.log(`file ${a.model}`);
if (pp.length) console.log(`pp${nPrompt}: ${meanSd(pp)} tok/s`);
if (tg.length) {
  const timer = evalRate.length ? ` (llama.cpp's eval timer: ${meanSd(evalRate)} tok/s)` : "";
  console.log(`tg${nGen}: ${meanSd(tg)} tok/s${timer}`);
}
