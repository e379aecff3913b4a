// The official openai npm client against mc-gateway (driven by tests/gateway/gateway_e2e_test.cpp).
// Usage: node openai_client.mjs BASE_URL MODEL SCENARIO
//   basic   completions and chat completions, whole and streamed, their usage fields
//   reject  a TTFT SLO no instance can meet: the client's RateLimitError (HTTP 429)
//   abort   a long stream aborted (AbortController) after its first chunks
// Prints one JSON document on stdout; exits 1 with the reason on stderr when a check fails.
import OpenAI from 'openai';

const [baseURL, model, scenario] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });

function check(cond, what) {
  if (!cond) {
    console.error(`openai_client: ${scenario}: ${what}`);
    process.exit(1);
  }
}

async function basic() {
  const prompt = 'Mooncake serves LLMs';
  const c = await client.completions.create({ model, prompt, max_tokens: 6, ignore_eos: true });
  check(c.object === 'text_completion', `object ${c.object}`);
  check(c.usage.prompt_tokens === Buffer.byteLength(prompt), `prompt_tokens ${c.usage.prompt_tokens}`);
  check(c.usage.completion_tokens === 6, `completion_tokens ${c.usage.completion_tokens}`);
  check(c.choices[0].finish_reason === 'length', `finish_reason ${c.choices[0].finish_reason}`);

  const messages = [{ role: 'system', content: 's'.repeat(100) }, { role: 'user', content: 'Hello' }];
  const chat = await client.chat.completions.create({ model, messages, max_tokens: 4, ignore_eos: true });
  check(chat.choices[0].message.role === 'assistant', 'chat role');
  check(chat.usage.completion_tokens === 4, `chat completion_tokens ${chat.usage.completion_tokens}`);
  check(typeof chat.usage.prompt_tokens_details.cached_tokens === 'number', 'cached_tokens missing');

  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 5, ignore_eos: true, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    ++chunks;
    if (chunk.usage) usage = chunk.usage;
    for (const ch of chunk.choices) text += ch.delta.content ?? '';
  }
  check(usage && usage.completion_tokens === 5, `stream usage ${JSON.stringify(usage)}`);
  check(text.length === 5, `stream text '${text}'`);

  const cstream = await client.completions.create({ model, prompt, max_tokens: 3, ignore_eos: true, stream: true });
  let ctext = '';
  for await (const chunk of cstream) ctext += chunk.choices[0]?.text ?? '';
  check(ctext.length === 3, `completion stream text '${ctext}'`);
  return { completion: c.usage, chat: chat.usage, stream_chunks: chunks, stream_usage: usage };
}

async function reject() {
  try {
    await client.completions.create({ model, prompt: 'x'.repeat(2000), max_tokens: 4, mc: { slo_ttft_ms: 0.01 } });
  } catch (e) {
    check(e instanceof OpenAI.RateLimitError, `expected RateLimitError, got ${e.constructor.name}: ${e.message}`);
    check(e.status === 429, `status ${e.status}`);
    return { status: e.status, retry_after: e.headers?.get?.('retry-after') ?? null, message: e.message };
  }
  check(false, 'the request was accepted');
}

async function abort() {
  const controller = new AbortController();
  const stream = await client.completions.create(
    { model, prompt: 'tell me everything', max_tokens: 4000, ignore_eos: true, stream: true },
    { signal: controller.signal });
  let chunks = 0;
  try {
    for await (const chunk of stream) {
      if (chunk.choices[0]?.text) ++chunks;
      if (chunks >= 3) controller.abort();
    }
  } catch (e) {
    check(e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError', `abort: ${e.constructor.name}: ${e.message}`);
  }
  check(chunks >= 3, `only ${chunks} chunks before the abort`);
  return { aborted_after_chunks: chunks };
}

const scenarios = { basic, reject, abort };
check(scenario in scenarios, `unknown scenario (basic, reject, abort)`);
scenarios[scenario]().then((r) => {
  console.log(JSON.stringify({ scenario, ...r }));
}, (e) => {
  console.error(`openai_client: ${scenario}: ${e.constructor.name}: ${e.message}`);
  process.exit(1);
});
