// What wirl's JavaScript helpers for every WIT version share (wirl.js for wirl:rl@0.1.0,
// wirl_v0_2.js for 0.2.0): failures, scores and the plugin's config.

/** Thrown with the reason when a completion cannot be scored. */
export class Unscorable extends Error {}

/** A score: a reward, named parts (`{ correct: 1 }`, in insertion order) and a note. */
export function score(reward, { parts = {}, note } = {}) {
  return { reward, parts: Object.entries(parts), note };
}

/** `config(key, fallback)` over a version's `config.get`: the setting parsed from its JSON
 * text, or `fallback` when absent. */
export function configFrom(get) {
  return (key, fallback) => {
    const text = get(key);
    if (text === undefined || text === null) {
      if (fallback === undefined) throw new Unscorable(`config key \`${key}\` is not set`);
      return fallback;
    }
    try {
      return JSON.parse(text);
    } catch (e) {
      throw new Unscorable(`config key \`${key}\`: ${e.message} (value: ${text})`);
    }
  };
}

/** Why a call failed, as the host records it. */
export function reason(error) {
  if (error instanceof Unscorable) return error.message;
  return `${error?.name ?? "Error"}: ${error?.message ?? String(error)}`;
}
