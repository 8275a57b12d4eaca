// Write wirl reward plugins in JavaScript.
//
//   // wirl-world: reward-plugin
//   import { defineReward, score } from "wirl";
//
//   export const reward = defineReward((task, completion) => {
//     const right = completion.trim() === (task.answer ?? "").trim();
//     return score(right ? 1 : 0, { parts: { correct: right ? 1 : 0 } });
//   });
//
// `reward` must be exported under that name: it is the component's `wirl:rl/reward`
// export. Throw `new Unscorable("why")` when a completion cannot be scored; any other
// exception is reported the same way, with its name and message. `config(key, fallback)`
// reads the plugin's settings from the wirl config. A task is `{ id, messages, answer,
// metadata }` (absent options are `undefined`).

import { get } from "wirl:rl/config@0.1.0";
import { Unscorable, configFrom, reason, score } from "./wirl_shared.js";

export { Unscorable, score };

/** The plugin's setting `key` (parsed from its JSON text), or `fallback` when absent. */
export const config = configFrom(get);

/**
 * The `reward` export from `scoreOne(task, completion) -> score`, and optionally
 * `scoreGroup(task, completions) -> [score]` to score a whole group at once.
 */
export function defineReward(scoreOne, scoreGroup) {
  return {
    scoreCompletion(task, completion) {
      try {
        return scoreOne(task, completion);
      } catch (error) {
        throw reason(error);
      }
    },
    scoreGroup(task, completions) {
      if (scoreGroup) {
        try {
          return scoreGroup(task, completions).map((val) => ({ tag: "ok", val }));
        } catch (error) {
          return completions.map(() => ({ tag: "err", val: reason(error) }));
        }
      }
      return completions.map((completion) => {
        try {
          return { tag: "ok", val: scoreOne(task, completion) };
        } catch (error) {
          return { tag: "err", val: reason(error) };
        }
      });
    },
  };
}
