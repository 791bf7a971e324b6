"use strict";
// Every piece of server data reaches the page through textContent or attributes set with
// setAttribute: never through innerHTML, so code holding markup shows as text.
(function () {
  const MAX_FEED_ROWS = 200;
  const RECONNECT_MAX_S = 10;
  const state = { key: null, pending: new Map(), clockSkewMs: 0, backoffS: 1, refreshTimer: null };
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== null && value !== undefined) node.setAttribute(name, String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  // ---- the key: taken from the address, then kept in memory only -------------------------
  function takeKeyFromAddress() {
    const url = new URL(window.location.href);
    const key = url.searchParams.get("key");
    if (key === null) return null;
    url.searchParams.delete("key");
    history.replaceState(null, "", url.pathname + url.search + url.hash);
    return key.trim() || null;
  }

  function showNotice(text, askForKey) {
    $("notice-text").textContent = text;
    $("key-form").hidden = !askForKey;
    $("notice").hidden = false;
  }

  function hideNotice() { $("notice").hidden = true; }

  function setConn(text, live) {
    const conn = $("conn");
    conn.textContent = text;
    conn.dataset.state = live === null ? "idle" : live ? "live" : "down";
  }

  async function api(path, options) {
    const headers = Object.assign({ "Authorization": "Bearer " + state.key }, (options || {}).headers);
    return fetch(path, Object.assign({}, options, { headers, cache: "no-store" }));
  }

  async function problemText(response) {
    try {
      const body = await response.json();
      if (body && typeof body.message === "string") return body.message;
    } catch (err) { /* not JSON: fall through */ }
    return "HTTP " + response.status;
  }

  function keyRefused(message) {
    state.key = null;
    setConn("not connected", false);
    showNotice("The approval key was refused (" + message + "). Open the address that " +
               "`harombe serve` printed at start, or enter the key below.", true);
  }

  // ---- a tiny highlighter: keywords, strings, comments, numbers ---------------------------
  const KEYWORDS = {
    python: "False None True and as assert async await break class continue def del elif else except " +
            "finally for from global if import in is lambda match case nonlocal not or pass raise return " +
            "try while with yield print",
    javascript: "async await break case catch class const continue debugger default delete do else export " +
                "extends false finally for function if import in instanceof let new null of return static " +
                "super switch this throw true try typeof undefined var void while with yield require",
    shell: "if then else elif fi for while until do done case esac in function return export local " +
           "readonly unset set shift exit source echo cd",
  };
  const NUMBER = "\\b\\d[\\d_]*(?:\\.\\d+)?(?:[eE][+-]?\\d+)?\\b|\\b0[xX][0-9a-fA-F]+\\b";
  const TOKENS = {
    python: [["com", "#[^\\n]*"],
             ["str", "[rRbBuUfF]{0,2}(?:\"\"\"[\\s\\S]*?(?:\"\"\"|$)|'''[\\s\\S]*?(?:'''|$)" +
                     "|\"(?:\\\\.|[^\"\\\\\\n])*\"?|'(?:\\\\.|[^'\\\\\\n])*'?)"],
             ["num", NUMBER], ["id", "[A-Za-z_]\\w*"]],
    javascript: [["com", "\\/\\/[^\\n]*|\\/\\*[\\s\\S]*?(?:\\*\\/|$)"],
                 ["str", "`(?:\\\\[\\s\\S]|[^`\\\\])*`?|\"(?:\\\\.|[^\"\\\\\\n])*\"?|'(?:\\\\.|[^'\\\\\\n])*'?"],
                 ["num", NUMBER], ["id", "[A-Za-z_$][\\w$]*"]],
    shell: [["com", "(?<![^\\s;|&(])#[^\\n]*"],
            ["str", "'[^']*'?|\"(?:\\\\[\\s\\S]|[^\"\\\\])*\"?"],
            ["var", "\\$\\{[^}\\n]*\\}?|\\$[A-Za-z_]\\w*|\\$[0-9#?@*$!-]"],
            ["num", NUMBER], ["id", "[A-Za-z_][\\w-]*"]],
  };
  const LEXERS = {};
  for (const [lang, parts] of Object.entries(TOKENS)) {
    LEXERS[lang] = { classes: parts.map((p) => p[0]), keywords: new Set(KEYWORDS[lang].split(" ")),
                     regex: new RegExp(parts.map((p) => "(" + p[1] + ")").join("|"), "g") };
  }

  /** [[className|null, text], …] covering `code` whole. */
  function tokenize(code, language) {
    const lexer = LEXERS[language === "bash" || language === "sh" ? "shell" : language];
    if (!lexer) return [[null, code]];
    const out = [];
    let last = 0;
    lexer.regex.lastIndex = 0;
    for (let m = lexer.regex.exec(code); m !== null; m = lexer.regex.exec(code)) {
      if (m[0] === "") { lexer.regex.lastIndex++; continue; }
      if (m.index > last) out.push([null, code.slice(last, m.index)]);
      let cls = lexer.classes[m.slice(1).findIndex((g) => g !== undefined)];
      if (cls === "id") cls = lexer.keywords.has(m[0]) ? "kw" : null;
      out.push([cls, m[0]]);
      last = m.index + m[0].length;
    }
    if (last < code.length) out.push([null, code.slice(last)]);
    return out;
  }

  /** A <pre> of the code, one numbered line per source line; `flagged` lines are marked. */
  function codeBlock(code, language, flagged) {
    const pre = el("pre", { class: "code", tabindex: "0", "aria-label": "Code, " + (language || "text") });
    let number = 0;
    let line = null;
    const newLine = () => {
      number += 1;
      line = el("span", { class: flagged.has(number) ? "line flagged" : "line", "data-line": number },
                el("span", { class: "gutter" }, String(number)));
      pre.append(line);
    };
    newLine();
    // A final newline ends the last line; it does not start an empty one.
    const source = code.endsWith("\n") ? code.slice(0, -1) : code;
    for (const [cls, text] of tokenize(source, language)) {
      text.split("\n").forEach((piece, index) => {
        if (index > 0) newLine();
        if (piece) line.append(cls ? el("span", { class: "tok-" + cls }, piece) : document.createTextNode(piece));
      });
    }
    return pre;
  }

  // ---- pending requests -------------------------------------------------------------------
  function reasonItem(reason) {
    const where = reason.line !== null && reason.line !== undefined ? "Line " + reason.line + ": " : "";
    return el("li", { "data-line": reason.line },
              el("span", { class: "where" }, where),
              el("span", { class: "risk risk-" + reason.risk }, String(reason.risk)), " ",
              String(reason.rule) + (reason.detail ? " — " + reason.detail : ""));
  }

  function paramList(params) {
    const dl = el("dl", { class: "meta params" });
    for (const [name, value] of Object.entries(params)) {
      if (name === "code") continue;
      dl.append(el("dt", {}, name),
                el("dd", {}, typeof value === "string" ? value : JSON.stringify(value)));
    }
    return dl.children.length ? dl : null;
  }

  function card(approval) {
    const titleId = "approval-" + approval.id + "-title";
    const params = approval.params || {};
    const flagged = new Set(approval.reasons.map((r) => r.line).filter((n) => Number.isInteger(n)));
    const countdown = el("span", { class: "countdown", "aria-label": "time left" });
    const status = el("p", { class: "status", role: "alert" });
    const buttons = [["approve", "Approve once", "approve"],
                     ["approve_sandbox", "Approve for this sandbox", "approve-sandbox"],
                     ["deny", "Deny", "deny"]].map(([decision, label, cls]) =>
      el("button", { type: "button", class: cls, "data-decision": decision, "aria-describedby": titleId }, label));
    const node = el("article", { class: "approval", "data-id": approval.id, "data-risk": approval.risk,
                                 "aria-labelledby": titleId },
      el("h3", { id: titleId },
         el("span", { class: "tool" }, String(approval.tool)),
         el("span", { class: "risk risk-" + approval.risk }, String(approval.risk)),
         countdown),
      el("dl", { class: "meta" },
         el("dt", {}, "sandbox"), el("dd", { class: "sandbox" }, approval.sandbox_id || "a new sandbox"),
         el("dt", {}, "tenant"), el("dd", { class: "tenant" }, approval.tenant || "—"),
         el("dt", {}, "id"), el("dd", {}, approval.id)),
      el("h4", { class: "visually-hidden" }, "Reasons"),
      el("ul", { class: "reasons" }, ...approval.reasons.map(reasonItem)),
      typeof params.code === "string" ? codeBlock(params.code, params.language, flagged) : null,
      paramList(params),
      el("div", { class: "actions", role: "group", "aria-label": "Decision" }, ...buttons),
      status);
    for (const button of buttons) {
      button.addEventListener("click", () => decide(approval.id, button.dataset.decision));
    }
    return { approval, node, countdown, status, buttons };
  }

  function addPending(approval) {
    if (state.pending.has(approval.id)) return;
    if (approval.expires_at * 1000 <= serverNow()) return;
    const entry = card(approval);
    state.pending.set(approval.id, entry);
    const list = $("pending");
    // Oldest first, as the service lists them.
    const later = [...state.pending.values()].find((other) => other !== entry &&
                                                   other.approval.created_at > approval.created_at);
    list.insertBefore(entry.node, later ? later.node : null);
    tick();
    renderCount();
  }

  function removePending(id) {
    const entry = state.pending.get(id);
    if (!entry) return;
    const hadFocus = entry.node.contains(document.activeElement);
    entry.node.remove();
    state.pending.delete(id);
    renderCount();
    if (hadFocus) {
      const next = $("pending").querySelector("button");
      (next || $("pending-title")).focus();
    }
  }

  function renderCount() {
    const count = state.pending.size;
    $("pending-count").textContent = count ? "(" + count + ")" : "";
    $("pending-empty").hidden = count > 0;
    document.title = (count ? "(" + count + ") " : "") + "harombe approvals";
  }

  async function decide(id, decision) {
    const entry = state.pending.get(id);
    if (!entry || !state.key) return;
    entry.buttons.forEach((b) => { b.disabled = true; });
    entry.status.textContent = "";
    let response;
    try {
      response = await api("/v1/approvals/" + encodeURIComponent(id), {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ decision }) });
    } catch (err) {
      entry.status.textContent = "Could not reach the service: " + err.message + ". Try again.";
      entry.buttons.forEach((b) => { b.disabled = false; });
      return;
    }
    if (response.ok || response.status === 404) { removePending(id); return; }
    const message = await problemText(response);
    if (response.status === 401 || response.status === 403) { keyRefused(message); return; }
    entry.status.textContent = "Not decided: " + message;
    entry.buttons.forEach((b) => { b.disabled = false; });
  }

  function serverNow() { return Date.now() + state.clockSkewMs; }

  function tick() {
    const now = serverNow();
    for (const entry of state.pending.values()) {
      const left = Math.max(0, Math.ceil((entry.approval.expires_at * 1000 - now) / 1000));
      entry.countdown.textContent = left > 0 ? left + " s left" : "expiring…";
      entry.countdown.classList.toggle("soon", left <= 10);
      if (left === 0) entry.buttons.forEach((b) => { b.disabled = true; });
    }
  }

  async function refreshPending() {
    const response = await api("/v1/approvals");
    if (!response.ok) {
      if (response.status === 401 || response.status === 403) keyRefused(await problemText(response));
      return false;
    }
    const date = Date.parse(response.headers.get("Date") || "");
    if (!Number.isNaN(date) && Math.abs(date - Date.now()) > 2000) state.clockSkewMs = date - Date.now();
    const held = (await response.json()).approvals;
    const ids = new Set(held.map((a) => a.id));
    for (const id of [...state.pending.keys()]) if (!ids.has(id)) removePending(id);
    held.forEach(addPending);
    return true;
  }

  function refreshSoon() {
    clearTimeout(state.refreshTimer);
    state.refreshTimer = setTimeout(() => refreshPending().catch(() => {}), 150);
  }

  // ---- the audit feed ---------------------------------------------------------------------
  function summary(event) {
    switch (event.type) {
      case "approval.requested": {
        const a = event.approval || {};
        return a.tool + " (" + a.risk + ") in " + (a.sandbox_id || "a new sandbox") +
               " for " + (a.tenant || "—") + " — id " + a.id;
      }
      case "approval.decided": return event.decision + " by " + event.by + " — id " + event.id;
      case "approval.expired": return "no answer in time: denied — id " + event.id;
      case "tool.called":
        return event.tool + " by " + event.tenant + " in " + (event.sandbox_id || "no sandbox") + ": " +
               (event.success ? "ok" : "failed") +
               (event.status && event.status !== "ok" ? " (" + event.status + ")" : "") +
               (event.approval ? ", approval " + event.approval : "") + (event.error ? ", " + event.error : "");
      default: return "";
    }
  }

  function addFeedRow(event) {
    const at = new Date((event.at || 0) * 1000);
    const row = el("li", { "data-type": event.type, "data-seq": event.seq },
                   el("time", { datetime: at.toISOString() }, at.toTimeString().slice(0, 8)),
                   el("span", { class: "kind" }, String(event.type)), summary(event));
    const feed = $("feed");
    feed.prepend(row);
    while (feed.children.length > MAX_FEED_ROWS) feed.lastElementChild.remove();
  }

  function onEvent(event) {
    addFeedRow(event);
    if (event.type === "approval.requested" && event.approval) addPending(event.approval);
    if (event.type === "approval.decided" || event.type === "approval.expired") removePending(event.id);
    if (event.type.startsWith("approval.")) refreshSoon();
  }

  /** Server-sent events read with fetch (EventSource cannot send the bearer header). */
  async function follow() {
    const response = await api("/v1/approvals/events", { headers: { "Accept": "text/event-stream" } });
    if (response.status === 401 || response.status === 403) {
      keyRefused(await problemText(response));
      return "refused";
    }
    if (!response.ok || !response.body) throw new Error("HTTP " + response.status);
    $("feed").replaceChildren();  // the stream starts with the recent events again
    state.backoffS = 1;
    setConn("live", true);
    await refreshPending();
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return "ended";
      buffer += value.replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data:"))
                          .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
        if (data) onEvent(JSON.parse(data));
      }
    }
  }

  async function run() {
    while (state.key) {
      let outcome;
      try { outcome = await follow(); } catch (err) { outcome = "error"; }
      if (outcome === "refused" || !state.key) return;
      const wait = state.backoffS;
      state.backoffS = Math.min(RECONNECT_MAX_S, state.backoffS * 2);
      setConn("disconnected — reconnecting in " + wait + " s", false);
      await new Promise((resolve) => setTimeout(resolve, wait * 1000));
    }
  }

  function start(key) {
    state.key = key;
    hideNotice();
    setConn("connecting…", null);
    run();
  }

  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("key-input").value.trim();
    $("key-input").value = "";
    if (key) start(key);
  });
  // The highlighter, for inspection from the browser's console (and the page's tests).
  window.approvalsPage = Object.freeze({ tokenize });
  setInterval(tick, 1000);
  renderCount();
  const key = takeKeyFromAddress();
  if (key) {
    start(key);
  } else {
    setConn("not connected", false);
    showNotice("This page needs the service's approval key. Open the address that " +
               "`harombe serve` printed at start (it ends in /approvals?key=…), or enter the key below.",
               true);
  }
})();
