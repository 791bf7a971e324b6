// harombe's JavaScript session worker: one Node.js process whose globals persist between runs.
// Started by the in-sandbox supervisor as `node -e <this file>`. Requests arrive on fd 3 and
// replies leave on fd 4, as frames of [u32 json_len][u32 blob_len][json][blob] (big-endian);
// the blob of a request is the code. stdout and stderr are the run's output.
//
// Code runs with vm.runInThisContext, so `var`, functions and top-level `let`/`const` persist,
// `require` resolves from /workspace and NODE_PATH, and the completion value of the code (a
// promise is awaited) comes back as `result`, formatted by util.inspect. SIGINT (the
// supervisor's timeout or cancel) interrupts running code and keeps the state.
// Everything is inside one function so that none of the worker's names are globals that
// user code could collide with (`const util = …` must work in a cell).
(function harombeWorker() {
'use strict';
const fs = require('fs');
const net = require('net');
const vm = require('vm');
const util = require('util');
const { createRequire } = require('module');

// What a script run by `node -` (the fresh mode) can count on, as globals here.
// defineProperty, because `node -e` defines some of these itself, not always as plain data.
// (Node also exposes its built-in modules as globals here, as in its REPL: `fs`, `path`…)
const scope = {
  require: createRequire('/workspace/'),
  __filename: '[stdin]',
  __dirname: '/workspace',
};
for (const [name, value] of Object.entries(scope)) {
  Object.defineProperty(globalThis, name, { value, writable: true, configurable: true });
}
const RESULT_LIMIT = 10000;
let cell = 0;
let interrupt = null; // rejects the pending async part of a run on SIGINT
let interrupted = false; // SIGINT arrived during this run: stop waiting for pending work

// A call ends when its code and the work it left (timers, fs requests) are done, as a script
// run by `node -` ends when its event loop is empty. Timers are tracked as they are made,
// because an unref()'d one never shows among the active resources: a script would exit
// without it, so the session cannot be kept with it either (the supervisor restarts it).
const sleep = setTimeout;
const turn = setImmediate;
const timers = new Set();
function tracked(make) {
  const wrapper = function (...args) {
    const timer = Reflect.apply(make, this, args);
    if (timer && typeof timer === 'object') timers.add(timer);
    return timer;
  };
  Object.defineProperties(wrapper, Object.getOwnPropertyDescriptors(make));
  return wrapper;
}
const timersModule = require('timers');
for (const name of ['setTimeout', 'setInterval', 'setImmediate']) {
  const wrapped = tracked(globalThis[name]);
  for (const holder of [globalThis, timersModule]) {
    try { holder[name] = wrapped; } catch { /* left as it was: still seen while ref()'d */ }
  }
}
const WORK = /^(Timeout|Immediate)$|Req/; // timers and requests; handles (pipes, servers) wait for input

function stray() {
  const left = [];
  for (const timer of timers) {
    if (timer._destroyed) timers.delete(timer);
    else if (typeof timer.hasRef === 'function' && !timer.hasRef()) left.push('unref()\'d timer');
  }
  return left;
}

function summary(names) {
  const counts = new Map();
  for (const name of names) counts.set(name, (counts.get(name) || 0) + 1);
  return [...counts].slice(0, 16).map(([name, n]) => (n > 1 ? `${n} x ${name}` : name).slice(0, 64));
}

async function settle() {
  // One turn of the event loop first: process.nextTick callbacks and microtasks the code
  // queued run now, in this call, not in the next one.
  await new Promise((resolve) => { turn(resolve); });
  for (;;) {
    const unref = stray();
    if (unref.length) return summary(unref);
    const work = process.getActiveResourcesInfo().filter((name) => WORK.test(name));
    if (!work.length) return [];
    if (interrupted) return summary(work);
    await new Promise((resolve) => { sleep(resolve, 5); });
  }
}

process.on('SIGINT', () => {
  interrupted = true;
  if (interrupt) interrupt(new Error('Script execution was interrupted by `SIGINT`'));
});
process.on('uncaughtException', (err) => {
  process.stderr.write(`Uncaught ${err && err.stack ? err.stack : String(err)}\n`);
});
process.on('unhandledRejection', (err) => {
  process.stderr.write(`Unhandled rejection: ${err && err.stack ? err.stack : String(err)}\n`);
});

// The error as Node would print it, without the worker's own frames.
function describe(err) {
  if (!(err instanceof Error) || !err.stack) return `Uncaught ${util.inspect(err)}`;
  const lines = err.stack.split('\n');
  const first = lines.findIndex((line) => /^\s+at /.test(line));
  if (first < 0) return err.stack;
  const frames = lines.slice(first).filter((line) => line.includes('<cell '));
  return [...lines.slice(0, first), ...frames].join('\n');
}

function reply(msg) {
  const data = Buffer.from(JSON.stringify(msg));
  const header = Buffer.alloc(8);
  header.writeUInt32BE(data.length, 0);
  header.writeUInt32BE(0, 4);
  const frame = Buffer.concat([header, data]);
  let offset = 0;
  while (offset < frame.length) offset += fs.writeSync(4, frame, offset);
}

async function runCell(code, id) {
  cell += 1;
  interrupted = false;
  const started = process.cpuUsage();
  let exitCode = 0;
  let result = null;
  try {
    let value = vm.runInThisContext(code, { filename: `<cell ${cell}>`, breakOnSigint: true });
    if (value && typeof value.then === 'function') {
      value = await Promise.race([
        value,
        new Promise((_, reject) => { interrupt = reject; }),
      ]);
    }
    if (value !== undefined) {
      result = util.inspect(value).slice(0, RESULT_LIMIT);
    }
  } catch (err) {
    process.stderr.write(`${describe(err)}\n`);
    exitCode = 1;
  } finally {
    interrupt = null;
  }
  let leftover = [];
  try {
    leftover = await settle();
  } catch (err) {
    leftover = ['pending work that could not be checked'];
  }
  const used = process.cpuUsage(started);
  reply({
    cell: id,
    leftover,
    exit_code: exitCode,
    result,
    cpu_s: (used.user + used.system) / 1e6,
    maxrss_kb: process.resourceUsage().maxRSS,
  });
}

// A socket, not an fs stream: a pipe read on libuv's thread pool would hold up process.exit().
const input = new net.Socket({ fd: 3, readable: true, writable: false });
let buffer = Buffer.alloc(0);
// The first frame says the worker's own threads are up (libuv starts its pool on first use,
// so a stat starts it now): the supervisor counts any thread beyond these as user code's.
let queue = new Promise((resolve) => {
  fs.stat('/', () => {
    reply({ ready: true, threads: fs.readdirSync('/proc/self/task').slice(0, 256) });
    resolve();
  });
});
input.on('data', (chunk) => {
  buffer = Buffer.concat([buffer, chunk]);
  while (buffer.length >= 8) {
    const jlen = buffer.readUInt32BE(0);
    const blen = buffer.readUInt32BE(4);
    if (buffer.length < 8 + jlen + blen) break;
    const request = JSON.parse(buffer.subarray(8, 8 + jlen).toString('utf8'));
    const code = buffer.subarray(8 + jlen, 8 + jlen + blen).toString('utf8');
    buffer = buffer.subarray(8 + jlen + blen);
    queue = queue.then(() => runCell(code, request.cell));
  }
});
input.on('end', () => process.exit(0));
})();
