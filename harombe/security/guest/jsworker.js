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
// run by `node -` ends when its event loop is empty. Every timer, ref()'d or not, sits in one
// of Node's timer lists whoever made it (setTimeout, timers/promises, AbortSignal.timeout…),
// so the worker reads those lists (the supervisor starts Node with --expose-internals for
// this) rather than a record of its own that a path around it would miss. An unref()'d timer
// would not keep a script alive, so the session cannot be kept with one either.
// What the worker calls after user code has run is captured now: user code may replace
// globals and prototype methods, and must not change what the worker sees or says.
const { timerListMap, immediateQueue, kRefed } = require('internal/timers');
const activeResources = process.getActiveResourcesInfo;
const call = Function.prototype.call.bind(Function.prototype.call);
const includes = String.prototype.includes;
const writeSync = fs.writeSync;
const stringify = JSON.stringify;
const parse = JSON.parse;
const inspect = util.inspect;
const runInThisContext = vm.runInThisContext;
const PromiseCtor = Promise;
const then = Promise.prototype.then;
const race = Promise.race;
const sleep = setTimeout;
const turn = setImmediate;

// Counts in a prototype-less object and one string: no method user code could have replaced.
function leftWork() {
  const counts = { __proto__: null };
  let any = false;
  for (const key in timerListMap) {
    const list = timerListMap[key];
    for (let timer = list._idleNext; timer && timer !== list; timer = timer._idleNext) {
      if (!timer[kRefed]) { counts['unref()\'d timer'] = (counts['unref()\'d timer'] || 0) + 1; any = true; }
    }
  }
  if (immediateQueue.head !== null && !any) {
    // ref()'d immediates show among the active resources below; only unref()'d ones count.
    for (let im = immediateQueue.head; im; im = im._idleNext) {
      if (!im[kRefed]) { counts['unref()\'d immediate'] = (counts['unref()\'d immediate'] || 0) + 1; any = true; }
    }
  }
  return any ? counts : null;
}

function refWork() {
  const names = call(activeResources, process);
  const counts = { __proto__: null };
  let any = false;
  for (let i = 0; i < names.length; i++) {
    const name = `${names[i]}`;
    // timers and requests; handles (pipes, servers) wait for input
    if (name === 'Timeout' || name === 'Immediate' || call(includes, name, 'Req')) {
      counts[name] = (counts[name] || 0) + 1;
      any = true;
    }
  }
  return any ? counts : null;
}

// Work on libuv's thread pool (crypto, zlib, some fs) keeps a script alive but is not among
// the active resources: a pool thread that is running (R) or in I/O (D) means such work is
// pending. Their /proc stat files are opened once and re-read in place (one pread each).
const POOL_THREAD = 'libuv-worker';
const poolStats = [];
const statBuf = Buffer.alloc(512);
const readSync = fs.readSync;

function findPool() {
  for (const tid of fs.readdirSync('/proc/self/task')) {
    const dir = `/proc/self/task/${tid}`;
    if (fs.readFileSync(`${dir}/comm`, 'latin1').trim() === POOL_THREAD) {
      poolStats.push(fs.openSync(`${dir}/stat`, 'r'));
    }
  }
}

function poolBusy() {
  let busy = 0;
  for (let i = 0; i < poolStats.length; i++) {
    let n;
    try {
      n = call(readSync, fs, poolStats[i], statBuf, 0, statBuf.length, 0);
    } catch {
      return -1;
    }
    let end = n - 1; // the state follows the last ')' (a thread's name may hold one)
    while (end > 0 && statBuf[end] !== 0x29) end--;
    const state = statBuf[end + 2];
    if (end <= 0) return -1;
    if (state === 0x52 || state === 0x44) busy++; // 'R', 'D'
  }
  return busy;
}

// A pool thread is seen busy only once it has picked its job up, and on a loaded host that can
// be after the call looked. So jobs are also counted as they are handed to the pool (a crypto
// job's run() with a callback, a compression stream's async write) and as their callbacks
// come back; these bindings are what every crypto and zlib API uses underneath.
let poolJobs = 0;
function countPoolJobs() {
  const quiet = process.emitWarning; // the module warns that it is internal: we know
  process.emitWarning = () => {};
  let internalBinding;
  try {
    ({ internalBinding } = require('internal/test/binding'));
  } finally {
    process.emitWarning = quiet;
  }
  const apply = Function.prototype.apply;
  const done = (fn) => function jobDone(...args) {
    if (poolJobs > 0) poolJobs--;
    return call(apply, fn, this, args);
  };
  // Counted before the hand-over (a callback cannot come sooner) and uncounted if the
  // hand-over throws: a refused job never calls back and must not hold the call open.
  const submit = (fn, self, args) => {
    poolJobs++;
    try {
      return call(apply, fn, self, args);
    } catch (err) {
      if (poolJobs > 0) poolJobs--;
      throw err;
    }
  };
  const crypto = internalBinding('crypto');
  for (const name of Object.keys(crypto)) {
    const proto = /Job$/.test(name) && crypto[name] && crypto[name].prototype;
    if (!proto || typeof proto.run !== 'function') continue;
    const run = proto.run;
    proto.run = function run_(...args) {
      if (typeof this.ondone !== 'function') return call(apply, run, this, args); // sync mode
      this.ondone = done(this.ondone); // async mode: the pool calls ondone back
      return submit(run, this, args);
    };
  }
  const zlib = internalBinding('zlib');
  for (const name of Object.keys(zlib)) {
    const proto = zlib[name] && zlib[name].prototype;
    if (!proto || typeof proto.write !== 'function' || typeof proto.init !== 'function') continue;
    const { write, init } = proto;
    // each async write calls back the function init was given
    proto.write = function write_(...args) { return submit(write, this, args); };
    proto.init = function init_(...args) {
      for (let i = 0; i < args.length; i++) {
        if (typeof args[i] === 'function') args[i] = done(args[i]);
      }
      return call(apply, init, this, args);
    };
  }
}

function summary(counts) {
  let text = '';
  let n = 0;
  for (const name in counts) {
    if (n++ === 16) break;
    text += `${text ? ', ' : ''}${counts[name] > 1 ? `${counts[name]} x ` : ''}${name}`;
  }
  return [text || 'pending work'];
}

function pause(ms) {
  return new PromiseCtor((resolve) => { if (ms) sleep(resolve, ms); else turn(resolve); });
}

// Writes to a full pipe are queued in the worker's memory: the call ends once what it printed
// has reached the supervisor (as a script's exit waits for it), not in a later call's output.
const outputStreams = [process.stdout, process.stderr];
async function flushed() {
  for (const stream of outputStreams) {
    while (!interrupted && stream.writableLength > 0) await pause(1);
  }
}

async function settle() {
  // One turn of the event loop first: process.nextTick callbacks and microtasks the code
  // queued run now, in this call, not in the next one.
  await pause(0);
  for (;;) {
    const unref = leftWork();
    if (unref) return summary(unref);
    let work = refWork();
    const running = poolBusy();
    const busy = running < 0 ? -1 : (running > poolJobs ? running : poolJobs);
    if (busy) {
      work = work || { __proto__: null };
      work[busy < 0 ? 'thread-pool state that could not be read' : 'thread-pool job'] = busy;
    }
    if (!work) return [];
    if (interrupted || busy < 0) return summary(work);
    await pause(5);
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
  const data = Buffer.from(call(stringify, JSON, msg));
  const header = Buffer.alloc(8);
  header.writeUInt32BE(data.length, 0);
  header.writeUInt32BE(0, 4);
  const frame = Buffer.concat([header, data]);
  let offset = 0;
  while (offset < frame.length) offset += call(writeSync, fs, 4, frame, offset);
}

async function runCell(code, id) {
  cell += 1;
  interrupted = false;
  const started = process.cpuUsage();
  let exitCode = 0;
  let result = null;
  try {
    let value = call(runInThisContext, vm, code, { filename: `<cell ${cell}>`, breakOnSigint: true });
    if (value && typeof value.then === 'function') {
      value = await call(race, PromiseCtor, [
        value,
        new PromiseCtor((_, reject) => { interrupt = reject; }),
      ]);
    }
    if (value !== undefined) {
      result = `${call(inspect, util, value)}`.slice(0, RESULT_LIMIT);
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
  try { await flushed(); } catch { /* streams user code broke: what was queued is lost */ }
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
let queue = new PromiseCtor((resolve) => {
  fs.stat('/', () => {
    try { findPool(); } catch { /* no /proc: pool jobs are seen only by their count */ }
    try { countPoolJobs(); } catch { /* another Node: running pool jobs are still seen */ }
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
    const request = call(parse, JSON, buffer.subarray(8, 8 + jlen).toString('utf8'));
    const code = buffer.subarray(8 + jlen, 8 + jlen + blen).toString('utf8');
    buffer = buffer.subarray(8 + jlen + blen);
    queue = call(then, queue, () => runCell(code, request.cell));
  }
});
input.on('end', () => process.exit(0));
})();
