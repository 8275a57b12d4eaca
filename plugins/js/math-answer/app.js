// wirl-world: reward-plugin
// `math-answer` in JavaScript: is the model's final answer to a math task right?
//
// The same rules and scores as plugins/rust/math-answer (a test holds every build of it to
// identical scores): the final answer is the last `<answer>…</answer>` block, else the last
// `\boxed{…}`, else the last number. It is right when it equals the task's answer as a number
// (within `tolerance`) or, failing that, as normalised text. Parts: `format`, `correct`.
// Config: `tolerance` (default 1e-6), `format_weight` (default 0).

import { Unscorable, config, defineReward, score } from "./wirl.js";

// Rust's `char::is_whitespace` (JS's own trim also strips U+FEFF and keeps U+0085).
const WS = "\\t\\n\\u000b\\u000c\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
const LEADING = new RegExp(`^[${WS}]+`);
const TRAILING = new RegExp(`[${WS}]+$`);
const RUNS = new RegExp(`[${WS}]+`);
// Rust's `f64::from_str` grammar for finite numbers.
const NUMBER = /^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$/;

const trim = (s) => s.replace(LEADING, "").replace(TRAILING, "");
const isDigit = (c) => c !== undefined && c >= "0" && c <= "9";

function lastTagged(text) {
  const close = text.lastIndexOf("</answer>");
  if (close < 0) return null;
  const open = text.lastIndexOf("<answer>", close - "<answer>".length);
  if (open < 0 || open + "<answer>".length > close) return null;
  return text.slice(open + "<answer>".length, close);
}

function lastBoxed(text) {
  let searchEnd = text.length;
  for (;;) {
    const start = searchEnd >= 7 ? text.lastIndexOf("\\boxed{", searchEnd - 7) : -1;
    if (start < 0) return null;
    const body = start + 7;
    let depth = 1;
    for (let i = body; i < text.length; i++) {
      if (text[i] === "{") depth++;
      else if (text[i] === "}" && --depth === 0) return text.slice(body, i);
    }
    searchEnd = start;
  }
}

function groupOfThree(text, at) {
  return text.length >= at + 3 && isDigit(text[at]) && isDigit(text[at + 1]) && isDigit(text[at + 2]) && !isDigit(text[at + 3]);
}

function lastNumber(text) {
  let end = text.length;
  while (end > 0) {
    let last = -1;
    for (let i = end - 1; i >= 0; i--) {
      if (isDigit(text[i])) {
        last = i;
        break;
      }
    }
    if (last < 0) return null;
    let start = last;
    let seenPoint = false;
    while (start > 0) {
      const prev = text[start - 1];
      if (isDigit(prev)) start--;
      else if (prev === "." && !seenPoint && start >= 2 && isDigit(text[start - 2])) {
        seenPoint = true;
        start--;
      } else if (prev === "," && start >= 2 && isDigit(text[start - 2]) && groupOfThree(text, start)) start--;
      else break;
    }
    if (start > 0 && text[start - 1] === "-") start--;
    const candidate = text.slice(start, last + 1);
    if ([...candidate].some(isDigit)) return candidate;
    end = start;
  }
  return null;
}

export function finalAnswer(completion) {
  for (const found of [lastTagged(completion), lastBoxed(completion)]) {
    if (found !== null) return { text: trim(found), tagged: true };
  }
  const number = lastNumber(completion);
  return number === null ? null : { text: number, tagged: false };
}

function plainNumber(text) {
  const t = trim(text).replaceAll(",", "");
  if (![...t].some(isDigit) || /[A-DF-Za-df-z]/.test(t) || !NUMBER.test(t)) return null;
  const value = Number(t);
  return Number.isFinite(value) ? value : null;
}

function parseNumber(text) {
  let t = trim(trim(text).replace(/\.+$/, ""));
  if (t.startsWith("$")) t = t.slice(1);
  t = trim(t);
  if (t.endsWith("%")) t = t.slice(0, -1);
  t = trim(t);
  if (t === "") return null;
  const slash = t.indexOf("/");
  if (slash >= 0) {
    const num = plainNumber(t.slice(0, slash));
    const den = plainNumber(t.slice(slash + 1));
    return num === null || den === null || den === 0 ? null : num / den;
  }
  return plainNumber(t);
}

function normalise(text) {
  const t = trim(text.replaceAll("\\text{", "").replace(/[${}]/g, "")).replace(/\.+$/, "");
  return t.split(RUNS).filter((part) => part !== "").join(" ").toLowerCase();
}

export function answersMatch(found, expected, tolerance) {
  const a = parseNumber(found);
  const b = parseNumber(expected);
  if (a !== null && b !== null) return Math.abs(a - b) <= tolerance;
  return normalise(found) === normalise(expected);
}

export const reward = defineReward((task, completion) => {
  const tolerance = config("tolerance", 1e-6);
  const formatWeight = config("format_weight", 0);
  if (task.answer === undefined || task.answer === null) {
    throw new Unscorable(`task ${task.id} has no answer to compare with`);
  }
  const found = finalAnswer(completion);
  if (found === null) return score(0, { parts: { format: 0, correct: 0 }, note: "no answer found" });
  const format = found.tagged ? 1 : 0;
  const correct = answersMatch(found.text, task.answer, tolerance) ? 1 : 0;
  const note = `answer: ${Array.from(found.text).slice(0, 80).join("")}`;
  return score(correct + formatWeight * format, { parts: { format, correct }, note });
});
