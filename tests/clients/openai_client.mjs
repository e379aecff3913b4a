// The official openai npm client against mc-gateway (driven by tests/gateway/gateway_e2e_test.cpp).
// Usage: node openai_client.mjs BASE_URL MODEL SCENARIO
//   basic   completions and chat completions, whole and streamed, their usage fields
//   reject  a TTFT SLO no instance can meet: the client's RateLimitError (HTTP 429)
//   abort   a long stream aborted (AbortController) after its first chunks
//   model   a real tokenizer and chat template (a Hugging Face directory): every sampling parameter, seeds, stop
//           strings, n, logprobs, echo, the streamed text equal to the whole one, and two chat turns sharing KV
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

// Text and finish reasons of a streamed request, per choice index, with the logprob entries the chunks carried.
async function streamed(create, params) {
  const stream = await create({ ...params, stream: true, stream_options: { include_usage: true } });
  const texts = [];
  const reasons = [];
  const logprobs = [];
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const ch of chunk.choices) {
      const i = ch.index;
      texts[i] = (texts[i] ?? '') + (ch.delta ? (ch.delta.content ?? '') : (ch.text ?? ''));
      if (ch.finish_reason) reasons[i] = ch.finish_reason;
      if (ch.logprobs?.content) logprobs.push(...ch.logprobs.content);
      if (ch.logprobs?.token_logprobs) logprobs.push(...ch.logprobs.token_logprobs);
    }
  }
  return { texts, reasons, logprobs, usage };
}

async function realModel() {
  const chat = (p) => client.chat.completions.create(p);
  const completion = (p) => client.completions.create(p);
  const messages = [
    { role: 'system', content: 'You are a terse assistant. '.repeat(8) },
    { role: 'user', content: 'Name three parts of a KV cache: ' },
  ];
  const sampled = { model, messages, max_tokens: 24, temperature: 0.9, top_p: 0.95, top_k: 50, min_p: 0.01,
                    presence_penalty: 0.3, frequency_penalty: 0.2, seed: 11, ignore_eos: true };
  // The same seed gives the same text, whole or streamed; another seed another text.
  const a = await chat(sampled);
  const a2 = await chat(sampled);
  check(a.choices[0].message.content === a2.choices[0].message.content, 'one seed, two texts');
  const text = a.choices[0].message.content;
  check(a.choices[0].finish_reason === 'length', `finish_reason ${a.choices[0].finish_reason}`);
  check(a.usage.completion_tokens === 24, `completion_tokens ${a.usage.completion_tokens}`);
  const s = await streamed(chat, sampled);
  check(s.texts[0] === text, `streamed '${s.texts[0]}' != whole '${text}'`);
  check(s.reasons[0] === 'length', `streamed finish_reason ${s.reasons[0]}`);
  const other = await chat({ ...sampled, seed: 12 });
  // Default parameters are accepted (OpenAI's temperature 1).
  const plain = await chat({ model, messages, max_tokens: 4 });
  check(plain.choices.length === 1, 'default parameters');

  // A stop string cuts exactly, whole and streamed: the text before its first occurrence.
  const chars = [...text];
  let stop = null;
  for (let i = 2; i + 2 <= chars.length && !stop; ++i) {
    const cand = chars.slice(i, i + 2).join('');
    if (cand.trim().length === 2 && !cand.includes('\uFFFD')) stop = cand;
  }
  // A text of 24 sampled tokens always has two printable characters side by side: no stop, a broken answer.
  check(stop !== null, `no two printable characters in '${text}' to stop at`);
  let stopped = null;
  {
    const expect = text.slice(0, text.indexOf(stop));
    const w = await chat({ ...sampled, stop: [stop] });
    check(w.choices[0].message.content === expect, `stop '${stop}': '${w.choices[0].message.content}' != '${expect}'`);
    check(w.choices[0].finish_reason === 'stop', `stop finish_reason ${w.choices[0].finish_reason}`);
    const ws = await streamed(chat, { ...sampled, stop: [stop] });
    check(ws.texts[0] === expect, `streamed stop '${stop}': '${ws.texts[0]}' != '${expect}'`);
    check(ws.reasons[0] === 'stop', `streamed stop finish_reason ${ws.reasons[0]}`);
    // The answer ends at the token that completes the stop string: every token before the last leaves it incomplete.
    const wl = await chat({ ...sampled, stop: [stop], logprobs: true });
    const pieces = wl.choices[0].logprobs.content.map((t) => t.token);
    check(pieces.join('').includes(stop), `stop '${stop}' not in the tokens ${JSON.stringify(pieces)}`);
    check(!pieces.slice(0, -1).join('').includes(stop), `a token after stop '${stop}': ${JSON.stringify(pieces)}`);
    check(wl.usage.completion_tokens === pieces.length, `completion_tokens ${wl.usage.completion_tokens} != ${pieces.length}`);
    // Each token's bytes, concatenated, are the answer's bytes up to the stop (characters across tokens rebuilt).
    const bytes = Buffer.from(wl.choices[0].logprobs.content.flatMap((t) => t.bytes));
    // (A special token's bytes are its text, which the answer skips: then there is nothing to compare.)
    if (!pieces.some((p) => p.startsWith('<|'))) {
      check(bytes.toString('utf8').startsWith(expect), `token bytes '${bytes.toString('utf8')}' do not begin with '${expect}'`);
    }
    stopped = { stop, text: expect, tokens: pieces.length };
  }

  // n = 3: three choices, each as long as asked, streamed the same as whole.
  const prompt = 'Prefill and decode run on separate instances because';
  const three = { model, prompt, n: 3, max_tokens: 8, temperature: 1.0, seed: 5, ignore_eos: true };
  const c3 = await completion(three);
  check(c3.choices.length === 3, `n=3 gave ${c3.choices.length} choices`);
  check(c3.usage.completion_tokens === 24, `n=3 completion_tokens ${c3.usage.completion_tokens}`);
  const s3 = await streamed(completion, three);
  for (const ch of c3.choices) {
    check(s3.texts[ch.index] === ch.text, `choice ${ch.index}: streamed '${s3.texts[ch.index]}' != '${ch.text}'`);
    check(ch.finish_reason === 'length' && s3.reasons[ch.index] === 'length', `choice ${ch.index} finish_reason`);
  }
  // echo: the prompt before the answer.
  const e = await completion({ model, prompt, max_tokens: 3, temperature: 0, echo: true, ignore_eos: true });
  check(e.choices[0].text.startsWith(prompt), `echo: '${e.choices[0].text}'`);

  // logprobs: each token's logprob and its top alternatives, most likely first; greedy picks the most likely; the
  // streamed entries are the whole response's.
  const lp = { model, messages, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 3, ignore_eos: true };
  const l = await chat(lp);
  const content = l.choices[0].logprobs.content;
  check(content.length === 6, `logprobs entries ${content.length}`);
  let total = 0;
  for (const t of content) {
    check(t.logprob <= 0 && t.top_logprobs.length === 3, `logprob entry ${JSON.stringify(t)}`);
    const tops = t.top_logprobs.map((x) => x.logprob);
    check(tops[0] >= tops[1] && tops[1] >= tops[2], `top_logprobs not sorted ${tops}`);
    check(Math.abs(t.logprob - tops[0]) < 1e-6, `greedy token not the most likely: ${t.logprob} vs ${tops[0]}`);
    check(tops.reduce((x, y) => x + Math.exp(y), 0) <= 1 + 1e-4, `probabilities above 1: ${tops}`);
    total += t.logprob;
  }
  const ls = await streamed(chat, lp);
  const streamedTotal = ls.logprobs.reduce((x, t) => x + t.logprob, 0);
  check(ls.logprobs.length === 6 && Math.abs(streamedTotal - total) < 1e-4, `streamed logprobs ${streamedTotal} vs ${total}`);
  const cl = await completion({ model, prompt, max_tokens: 5, temperature: 0.7, seed: 3, logprobs: 2, ignore_eos: true });
  const lps = cl.choices[0].logprobs;
  check(lps.tokens.length === 5 && lps.token_logprobs.length === 5 && lps.top_logprobs.length === 5,
        `completion logprobs ${JSON.stringify(lps)}`);
  check(lps.tokens.join('') === cl.choices[0].text, `logprob tokens '${lps.tokens.join('')}' != '${cl.choices[0].text}'`);

  // Two turns of one conversation: the second's prompt starts with the first's, rendered by the model's template,
  // so its KV comes from the cache.
  const turn1 = await chat({ model, messages, max_tokens: 8, temperature: 0, ignore_eos: true });
  const turn2 = await chat({
    model, max_tokens: 4, temperature: 0, ignore_eos: true,
    messages: [...messages, { role: 'assistant', content: turn1.choices[0].message.content },
               { role: 'user', content: 'And a fourth?' }],
  });
  const cached = turn2.usage.prompt_tokens_details.cached_tokens;

  // Unsupported fields are refused by name.
  let refused = null;
  try {
    await chat({ model, messages, max_tokens: 2, tools: [{ type: 'function', function: { name: 'f' } }] });
  } catch (err) {
    check(err.status === 400, `tools: status ${err.status}`);
    refused = err.message;
  }
  check(refused !== null && refused.includes('tools'), `tools: ${refused}`);
  return { text, other_seed_text: other.choices[0].message.content, stopped, n3: c3.choices.map((c) => c.text),
           logprob_total: total, turn1_prompt_tokens: turn1.usage.prompt_tokens,
           turn2_prompt_tokens: turn2.usage.prompt_tokens, turn2_cached_tokens: cached, refused };
}

const scenarios = { basic, reject, abort, model: realModel };
check(scenario in scenarios, `unknown scenario (basic, reject, abort, model)`);
scenarios[scenario]().then((r) => {
  console.log(JSON.stringify({ scenario, ...r }));
}, (e) => {
  console.error(`openai_client: ${scenario}: ${e.constructor.name}: ${e.message}`);
  process.exit(1);
});
