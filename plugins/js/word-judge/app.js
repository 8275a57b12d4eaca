// wirl-world: reward-plugin@0.2.0
// A `wirl:rl@0.2.0` judge in JavaScript for tests, as plugins/tests/word-judge in Rust: it
// asks the model about every completion of a group in one `generate` call (greedy,
// `max_tokens` from its config, default 6) and rewards each with the number of words of the
// model's reply, kept as its note; it also reports the step it is scored at (part `step`).
// A refused call (no model, a spent budget) fails every completion with the host's reason.
// With `likelihood = true` it asks instead how likely the model finds each completion as the
// reply to the task (`logprobs`), as plugins/tests/likelihood: the mean log-prob per token,
// parts `total` and `tokens`.

import { config, defineReward, generate, logprobs, score } from "./wirl_v0_2.js";

export const reward = defineReward((task, completions, progress) => {
  if (config("likelihood", false)) {
    const scored = logprobs(completions.map((reply) => ({ conversation: task.messages, reply })));
    return scored.map(({ tokens, logprobs: each }) => {
      // Summed in f32, token by token, as the Rust guest sums.
      const total = each.reduce((sum, l) => Math.fround(sum + l), 0);
      const mean = tokens.length === 0 ? 0 : Math.fround(total / tokens.length);
      return score(mean, { parts: { total, tokens: tokens.length }, note: tokens.join("") });
    });
  }
  const maxTokens = config("max_tokens", 6);
  const asked = task.messages.map((m) => m.content).join(" ");
  const conversations = completions.map((completion) => [{ role: "user", content: `${asked} ${completion}` }]);
  const replies = generate(conversations, { maxTokens, temperature: 0 });
  return replies.map((reply) => {
    const words = reply.text.split(/\s+/).filter((w) => w.length > 0).length;
    return score(words, { parts: { judge_words: words, step: progress.step }, note: reply.text });
  });
});
