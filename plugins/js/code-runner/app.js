// wirl-world: code-runner-plugin
// wirl's JavaScript code runner: SpiderMonkey inside a component (componentize-js), one
// untrusted program per instance, with the parts of Node.js that programs written for
// `node program.js` use to talk to the world: `console.log`/`console.error`,
// `process.stdout.write`, `process.stdin` (`on("data")`/`on("end")`), `require("fs")
// .readFileSync(0 | "/dev/stdin")`, `require("readline")` (`on("line")`/`on("close")`),
// `process.exit(code)`, `process.argv`, `module.exports`.
//
// The host makes a fresh instance for every program and enforces time, memory and output
// from outside the engine; this module only gives the program its stdin and arguments, runs
// it and reports its exit status the way `node` would (1 for an uncaught exception, with the
// error on stderr).

// A `process.exit(code)` in flight: unwinds the program to here.
class Exit {
  constructor(code) {
    this.code = code;
  }
}

const UNSUPPORTED_LANGUAGE = 127;

// An uncaught error as `node` prints it: its name and message, then the program's own frames
// (the runner's are left out), each named `program.js:LINE:COLUMN`.
function describe(error) {
  if (error && typeof error === "object" && "stack" in error) {
    const frames = String(error.stack ?? "")
      .split("\n")
      .filter((frame) => frame.includes("> Function:"))
      .map((frame) => `    at ${frame.replace(/^(.*)@.*> Function:(\d+):(\d+)$/, (_, name, line, column) => `${name || "<anonymous>"} (program.js:${line - 2}:${column})`)}`);
    return [`${error.name ?? "Error"}: ${error.message ?? ""}`, ...frames].join("\n");
  }
  return `Uncaught ${String(error)}`;
}

// Output: whole lines go out at once through the console (the host captures and bounds
// them, so a program's output survives its time-out); a last line without its newline is
// returned with the outcome, which the host appends after what was printed.
function stream(write) {
  let pending = "";
  return {
    write(text) {
      pending += String(text);
      const end = pending.lastIndexOf("\n");
      if (end >= 0) {
        write(pending.slice(0, end));
        pending = pending.slice(end + 1);
      }
      return true;
    },
    rest() {
      const rest = pending;
      pending = "";
      return rest;
    },
  };
}

function run(program) {
  const stdout = stream((text) => console.log(text));
  const stderr = stream((text) => console.error(text));
  const input = program.stdin;
  const listeners = { data: [], end: [] };
  const lineReaders = [];
  const stdin = {
    setEncoding() {},
    resume() {},
    on(event, handler) {
      if (event in listeners) listeners[event].push(handler);
      return stdin;
    },
  };
  const fs = {
    readFileSync(path, options) {
      if (path === 0 || path === "/dev/stdin") {
        return input;
      }
      const error = new Error(`ENOENT: no such file or directory, open '${path}'`);
      error.code = "ENOENT";
      throw error;
    },
  };
  const readline = {
    createInterface() {
      const reader = {
        handlers: { line: [], close: [] },
        on(event, handler) {
          if (event in reader.handlers) reader.handlers[event].push(handler);
          return reader;
        },
        close() {},
      };
      lineReaders.push(reader);
      return reader;
    },
  };
  const process = {
    argv: ["node", "program.js", ...program.args],
    env: {},
    platform: "wasi",
    stdin,
    stdout: { write: (text) => stdout.write(text) },
    stderr: { write: (text) => stderr.write(text) },
    exit(code = 0) {
      throw new Exit(code);
    },
  };
  const modules = { fs, readline, process };
  const require = (name) => {
    const bare = String(name).replace(/^node:/, "");
    if (bare in modules) return modules[bare];
    const error = new Error(`Cannot find module '${name}'`);
    error.code = "MODULE_NOT_FOUND";
    throw error;
  };
  // Timers on a virtual clock: the program's first pass, then its callbacks in the order
  // their times come due (no real waiting: a program's time is its work). An endless
  // `setInterval` runs until the host's deadline, as it would under `node`.
  const timers = [];
  let now = 0;
  let nextTimer = 1;
  const schedule = (callback, delay, args, every) => {
    const id = nextTimer++;
    const wait = Math.max(0, Number(delay) || 0);
    timers.push({ id, at: now + wait, order: id, callback, args, every: every ? Math.max(1, wait) : 0 });
    return id;
  };
  const cancel = (id) => {
    const index = timers.findIndex((timer) => timer.id === id);
    if (index >= 0) timers.splice(index, 1);
  };
  const clock = {
    setTimeout: (callback, delay, ...args) => schedule(callback, delay, args, false),
    setInterval: (callback, delay, ...args) => schedule(callback, delay, args, true),
    setImmediate: (callback, ...args) => schedule(callback, 0, args, false),
    clearTimeout: cancel,
    clearInterval: cancel,
    clearImmediate: cancel,
  };
  const runTimers = () => {
    while (timers.length) {
      timers.sort((a, b) => a.at - b.at || a.order - b.order);
      const timer = timers.shift();
      now = timer.at;
      if (timer.every) {
        timers.push({ ...timer, at: now + timer.every, order: nextTimer++ });
      }
      timer.callback(...timer.args);
    }
  };
  const module = { exports: {} };
  const log = (...args) => stdout.write(args.map(show).join(" ") + "\n");
  const error = (...args) => stderr.write(args.map(show).join(" ") + "\n");
  const sandboxConsole = { log, info: log, debug: log, error, warn: error };

  let status = 0;
  try {
    const names = ["require", "module", "exports", "process", "console", ...Object.keys(clock)];
    const body = new Function(...names, program.source);
    body(require, module, module.exports, process, sandboxConsole, ...Object.values(clock));
    // Node delivers stdin after the program's first pass: the same order here.
    if (listeners.data.length || listeners.end.length) {
      for (const handler of listeners.data) handler(input);
      for (const handler of listeners.end) handler();
    }
    for (const reader of lineReaders) {
      const lines = input.split("\n");
      if (lines.length && lines[lines.length - 1] === "") lines.pop();
      for (const line of lines) for (const handler of reader.handlers.line) handler(line.replace(/\r$/, ""));
      for (const handler of reader.handlers.close) handler();
    }
    runTimers();
  } catch (thrown) {
    if (thrown instanceof Exit) {
      status = Number(thrown.code) | 0;
    } else {
      stderr.write(describe(thrown) + "\n");
      status = 1;
    }
  }
  return { status, stdout: stdout.rest(), stderr: stderr.rest() };
}

// What `console.log` prints for a value: strings as they are, the rest as Node shows the
// common cases (numbers, arrays, plain objects).
function show(value) {
  if (typeof value === "string") return value;
  if (value === undefined) return "undefined";
  if (typeof value === "function") return `[Function: ${value.name || "(anonymous)"}]`;
  if (typeof value === "bigint") return `${value}n`;
  if (Array.isArray(value)) return `[ ${value.map(inner).join(", ")} ]`.replace("[  ]", "[]");
  if (value && typeof value === "object") {
    if (value instanceof Error) return describe(value);
    const entries = Object.entries(value).map(([k, v]) => `${k}: ${inner(v)}`);
    return entries.length ? `{ ${entries.join(", ")} }` : "{}";
  }
  return String(value);
}

function inner(value) {
  return typeof value === "string" ? `'${value}'` : show(value);
}

export const codeRunner = {
  run(program, limits) {
    const language = program.language.toLowerCase();
    if (!["javascript", "js", "nodejs", "node"].includes(language)) {
      const message = `this runner speaks javascript, not ${JSON.stringify(program.language)}\n`;
      return { termination: { tag: "exited", val: UNSUPPORTED_LANGUAGE }, stdout: "", stderr: message, truncated: false, durationMs: 0 };
    }
    const { status, stdout, stderr } = run(program);
    return { termination: { tag: "exited", val: status }, stdout, stderr, truncated: false, durationMs: 0 };
  },
};
