// ollama-js against a daemon: `node ollama_client.mjs HOST`. Prints one JSON object with
// what each call returned, for tests/e2e/test_ollama_clients.py to assert on. Run from a
// copy beside the npm install (node_modules/ollama), so `import "ollama"` resolves there.
import { Ollama } from "ollama";

const host = process.argv[2];
const client = new Ollama({ host });
const ask = [{ role: "user", content: "Write a long story about a dragon." }];
const greedy = { temperature: 0, num_predict: 12 };
const out = {};

async function failure(call) {
  try {
    await call();
    return null;
  } catch (error) {
    return { name: error.name, status_code: error.status_code, error: error.error };
  }
}

out.list = (await client.list()).models.map((m) => m.model);
out.version = (await client.version()).version;

const parts = [];
for await (const part of await client.chat({
  model: "default", messages: ask, options: greedy, stream: true,
})) {
  parts.push(part);
}
out.stream = parts;
out.whole = await client.chat({ model: "default", messages: ask, options: greedy });

const generated = [];
for await (const part of await client.generate({
  model: "default", prompt: "Write a long story about a dragon.", options: greedy, stream: true,
})) {
  generated.push(part.response);
}
out.generated = generated.join("");

out.tools = await client.chat({
  model: "replay",
  messages: [{ role: "user", content: "What's the weather and time in Paris?" }],
  tools: JSON.parse(process.argv[3]),
  think: true,
});

out.embed = await client.embed({ model: "all-minilm-l6-v2", input: ["a cat", "a dog"] });
out.show = await client.show({ model: "default" });
out.ps = (await client.ps()).models.map((m) => m.model);
out.unknown = await failure(() => client.chat({ model: "no-such-model", messages: ask }));
out.unknown_stream = await failure(async () => {
  for await (const _ of await client.chat({ model: "no-such-model", messages: ask, stream: true })) {
    // nothing arrives: the 404 comes first
  }
});
out.pull_other = await failure(() => client.pull({ model: "llama3.2" }));

// Leaving a stream early (AbortableAsyncIterator.abort) must not break the next request.
const early = await client.chat({ model: "default", messages: ask, stream: true, options: { num_predict: 200 } });
for await (const _ of early) {
  early.abort();
  break;
}
out.after_abort = (await client.chat({ model: "default", messages: ask, options: greedy })).eval_count;

process.stdout.write(JSON.stringify(out));
