// Write wirl:rl@0.2.0 reward plugins in JavaScript: a group at a time, told where the
// training run stands, and able to ask the model (an LLM judge).
//
//   // wirl-world: reward-plugin@0.2.0
//   import { defineReward, generate, score } from "./wirl_v0_2.js";
//
//   export const reward = defineReward((task, completions, progress) => {
//     const replies = generate(completions.map((c) => [{ role: "user", content: `Right? ${c}` }]));
//     return replies.map((r) => score(r.text.includes("yes") ? 1 : 0));
//   });
//
// `progress` is `{ step, steps }` (numbers; 0 of 0 outside training). `logprobs` reads how
// likely the model finds given replies (`[{ conversation, reply }]` → `[{ tokens, logprobs }]`).
// `generate` returns one
// `{ text, finishReason }` per conversation and throws `Unscorable` with the host's reason
// when refused (the budget spent, no model here). A thrown `Unscorable` (or any error) fails
// every completion of the group with its reason.

import { get } from "wirl:rl/config@0.2.0";
import { generate as hostGenerate, logprobs as hostLogprobs } from "wirl:rl/inference@0.2.0";
import { Unscorable, configFrom, reason, score } from "./wirl_shared.js";

export { Unscorable, score };

/** The plugin's setting `key` (parsed from its JSON text), or `fallback` when absent. */
export const config = configFrom(get);

/** One completion of the model per conversation (a list of `{ role, content }`). */
export function generate(conversations, { maxTokens = 256, temperature = 0, topP = 1, topK = 0, minP = 0, stop = [], seed } = {}) {
  const sampling = { maxTokens, temperature, topP, topK, minP, stop, seed: seed === undefined ? undefined : BigInt(seed) };
  try {
    return hostGenerate(conversations, sampling);
  } catch (error) {
    throw new Unscorable(`the model: ${error?.payload ?? reason(error)}`);
  }
}

/**
 * How likely the model finds each reply: `replies` is a list of `{ conversation, reply }`
 * (the reply read as the assistant's next turn). One `{ tokens, logprobs }` per reply (each
 * token's text, joining into the reply; each token's natural-log probability), within the
 * same budget as `generate`; throws `Unscorable` with the host's reason when refused.
 */
export function logprobs(replies) {
  try {
    return hostLogprobs(replies.map(({ conversation, reply }) => ({ conversation, reply })));
  } catch (error) {
    throw new Unscorable(`the model: ${error?.payload ?? reason(error)}`);
  }
}

/** The `reward` export from `scoreGroup(task, completions, progress) -> [score]`. */
export function defineReward(scoreGroup) {
  return {
    scoreGroup(task, completions, progress) {
      const told = { step: Number(progress.step), steps: Number(progress.steps) };
      try {
        return scoreGroup(task, completions, told).map((val) => ({ tag: "ok", val }));
      } catch (error) {
        return completions.map(() => ({ tag: "err", val: reason(error) }));
      }
    },
  };
}
