// client.mjs — the official `openai` npm client (tests/serve/setup.sh installs it) against a running
// `kvsieve serve`: models, completions, chat, streaming of both, a per-request policy with its
// reports and kept positions, and an error surfacing as the client's APIError.
// Usage: node tests/serve/client.mjs BASE_URL MODEL_NAME   (e.g. http://127.0.0.1:8080/v1 kvsieve-tiny)
// The model must have a chat format (tests/test_serve.c serves a copy of the bundled model whose
// tokenizer has chatml's two tokens). Prints "client: N checks passed" and exits 0, or prints the
// first failed check and exits 1.
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const req = createRequire(join(here, 'node_modules_dir') + '/');
const mod = await import(pathToFileURL(req.resolve('openai')).href);
const OpenAI = mod.OpenAI ?? mod.default?.OpenAI ?? mod.default;

const [base, model] = process.argv.slice(2);
if (!base || !model) { console.error('usage: node client.mjs BASE_URL MODEL_NAME'); process.exit(2); }
const client = new OpenAI({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 120000 });

let checks = 0;
function check(cond, what) {
  if (!cond) { console.error(`client: FAILED: ${what}`); process.exit(1); }
  checks++;
}
function usageOk(u, what) {
  check(u && u.prompt_tokens > 0 && u.completion_tokens > 0 && u.total_tokens === u.prompt_tokens + u.completion_tokens,
        `${what}: usage ${JSON.stringify(u)}`);
}

// models
const models = await client.models.list();
check(models.data.some((m) => m.id === model), `models.list has ${model}: ${JSON.stringify(models.data)}`);

// a completion, then the same one streamed: the same text
const prompt = 'Once upon a time';
const c = await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0 });
check(c.object === 'text_completion' && c.choices.length === 1 && typeof c.choices[0].text === 'string' &&
      c.choices[0].text.length > 0, `completion: ${JSON.stringify(c)}`);
check(['length', 'stop'].includes(c.choices[0].finish_reason), `completion finish_reason ${c.choices[0].finish_reason}`);
usageOk(c.usage, 'completion');
let streamed = '', last = null, nchunks = 0;
for await (const ch of await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0, stream: true })) {
  streamed += ch.choices[0].text;
  nchunks++;
  if (ch.choices[0].finish_reason) last = ch;
}
check(streamed === c.choices[0].text, `streamed text "${streamed}" != "${c.choices[0].text}"`);
check(nchunks >= 2 && last && last.choices[0].finish_reason === c.choices[0].finish_reason, `stream: ${nchunks} chunks, last ${JSON.stringify(last)}`);
usageOk(last.usage, 'stream');

// chat, then streamed
const messages = [{ role: 'system', content: 'You tell stories.' }, { role: 'user', content: 'Tell me about a dog.' }];
const r = await client.chat.completions.create({ model, messages, max_tokens: 10, temperature: 0 });
check(r.object === 'chat.completion' && r.choices[0].message.role === 'assistant' && typeof r.choices[0].message.content === 'string',
      `chat: ${JSON.stringify(r)}`);
usageOk(r.usage, 'chat');
let chatText = '', role = null, chatLast = null;
for await (const ch of await client.chat.completions.create({ model, messages, max_tokens: 10, temperature: 0, stream: true })) {
  if (ch.choices[0].delta.role) role = ch.choices[0].delta.role;
  chatText += ch.choices[0].delta.content ?? '';
  if (ch.choices[0].finish_reason) chatLast = ch;
}
check(role === 'assistant' && chatText === r.choices[0].message.content, `chat stream "${chatText}" (role ${role}) != "${r.choices[0].message.content}"`);
check(chatLast && chatLast.object === 'chat.completion.chunk', `chat stream last chunk ${JSON.stringify(chatLast)}`);

// a per-request policy: GemFilter keeps 8 prompt tokens; its reports and kept positions come back
const long = 'The grass is green. '.repeat(10) + 'The cat sat on the mat. What sat on the mat?';
const g = await client.completions.create({
  model, prompt: long, max_tokens: 6, temperature: 0,
  kvsieve: { policy: 'gemfilter', set: { layer: 2, k: 8 }, report_kept: true },
});
const kv = g.kvsieve;
check(kv && kv.policy === 'gemfilter' && kv.reports && kv.reports.selected === '8', `policy reports: ${JSON.stringify(kv && kv.reports)}`);
check(Array.isArray(kv.restart) && kv.restart.length === 8, `restart indices: ${JSON.stringify(kv.restart)}`);
check(Array.isArray(kv.kept) && kv.kept.length > 0 && kv.kept.every((layer) => Array.isArray(layer) && layer.length > 0 &&
      layer.every((head) => head.length >= 8 && head.length <= 8 + 6)), `kept positions per layer and KV head: ${JSON.stringify(kv.kept)}`);
usageOk(g.usage, 'policy');
// an inline Lua policy, streamed
let inl = '', inlLast = null;
for await (const ch of await client.completions.create({
  model, prompt, max_tokens: 5, temperature: 0, stream: true,
  kvsieve: { policy: 'local ks = require "kvsieve"\nreturn { name = "mine", prefill_end = function(ev) ev:report("seen", 1) end }' },
})) {
  inl += ch.choices[0].text;
  if (ch.choices[0].finish_reason) inlLast = ch;
}
check(inlLast && inlLast.kvsieve && inlLast.kvsieve.policy === 'mine', `inline policy stream: ${JSON.stringify(inlLast)}`);

// an error is the client's APIError, with the server's status and message
try {
  await client.completions.create({ model, prompt, max_tokens: 4, kvsieve: { policy: 'no_such_policy' } });
  check(false, 'an unknown policy was accepted');
} catch (e) {
  check(e instanceof OpenAI.APIError && e.status === 400 && /no_such_policy/.test(e.message), `unknown policy: ${e}`);
}
console.log(`client: ${checks} checks passed`);
