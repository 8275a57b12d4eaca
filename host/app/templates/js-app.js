// wirl-world: reward-plugin
// `{name}`: reward 1 when the completion holds the task's answer, else 0.
//
// Build: `{build}`; try it:
// `{try}`

import { Unscorable, config, defineReward, score } from "./wirl.js";

export const reward = defineReward((task, completion) => {
  if (task.answer === undefined || task.answer === null) throw new Unscorable(`task ${task.id} has no answer`);
  const answer = task.answer.trim();
  const found = config("ignore_case", false)
    ? completion.toLowerCase().includes(answer.toLowerCase())
    : completion.includes(answer);
  const correct = found ? 1 : 0;
  return score(correct, { parts: { correct }, note: `looked for ${JSON.stringify(answer)}` });
});
