// llama.cpp's greedy continuation of a prompt on a GGUF file, printed as
// text (stdout) and token ids (stderr): for checking that a file moeserve
// wrote runs the same in llama.cpp (compare with `moeserve generate -p
// PROMPT -n N --temp 0`). llama.cpp comes from node-llama-cpp, as in
// bench_llamacpp.mjs (README.md).
//
//   node greedy_llamacpp.mjs -m FILE -p PROMPT [-n 32] [-t 2]
import {parseArgs} from "node:util";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const {values: a} = parseArgs({
  options: {
    model: {type: "string", short: "m"},
    prompt: {type: "string", short: "p"},
    gen: {type: "string", short: "n", default: "32"},
    threads: {type: "string", short: "t", default: "2"},
  },
});
if (!a.model || a.prompt === undefined) {
  console.error("usage: node greedy_llamacpp.mjs -m FILE -p PROMPT [-n 32] [-t 2]");
  process.exit(2);
}
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath: a.model, gpuLayers: 0, useMmap: true});
const context = await model.createContext({contextSize: 512, threads: +a.threads});
const seq = context.getSequence();
const ids = [];
for await (const id of seq.evaluate(model.tokenize(a.prompt), {temperature: 0})) {
  ids.push(id);
  if (ids.length >= +a.gen) break;
}
process.stdout.write(a.prompt + model.detokenize(ids) + "\n");
console.error(JSON.stringify(ids));
await context.dispose();
