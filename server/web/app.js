// The engine's web page: chat (streamed from /v1/chat/completions), the live KV block map
// (/v1/kv_map/stream) and the KV cache calculator (/v1/plan). Plain JS, no dependencies.
"use strict";

const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------- API helpers

function authHeaders(extra) {
  const h = Object.assign({}, extra || {});
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

// The message of a non-2xx answer: OpenAI's `error.message` when the body has one.
async function errorMessage(resp) {
  let text = "";
  try { text = await resp.text(); } catch (_) { /* body unreadable */ }
  try {
    const j = JSON.parse(text);
    if (j && j.error && j.error.message) return j.error.message + " (HTTP " + resp.status + ")";
  } catch (_) { /* not JSON */ }
  return "HTTP " + resp.status + (text ? ": " + text.slice(0, 300) : "");
}

// Reads an SSE body from a fetch Response, calling onData(dataString) for each event.
// Returning false from onData, or throwing, stops reading and cancels the body.
async function readSse(resp, onData) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += decoder.decode(value, { stream: true });
      buf = buf.replace(/\r\n?/g, "\n");
      let end;
      while ((end = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, end);
        buf = buf.slice(end + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
        if (data && onData(data) === false) return;
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

// ---------------------------------------------------------------- header: model info

const info = { model: null, maxLen: null };

async function loadModel() {
  try {
    const resp = await fetch("/v1/models", { headers: authHeaders() });
    if (!resp.ok) { $("model-name").textContent = "model unavailable: " + (await errorMessage(resp)); return; }
    const j = await resp.json();
    const m = j.data && j.data[0];
    if (!m) return;
    info.model = m.id;
    info.maxLen = m.max_model_len;
    $("model-name").textContent = m.id;
    $("model-len").textContent = m.max_model_len ? "max length " + m.max_model_len.toLocaleString() + " tokens" : "";
    if (m.max_model_len) $("max-tokens").max = String(m.max_model_len);
  } catch (e) {
    $("model-name").textContent = "server unreachable";
  }
}

// ---------------------------------------------------------------- chat

const chat = { history: [], controller: null, current: null };

function addMessage(role, text) {
  $("empty-hint").hidden = true;
  const div = document.createElement("div");
  div.className = "msg " + role;
  const body = document.createElement("span");
  body.className = "body";
  body.textContent = text;
  div.appendChild(body);
  $("messages").appendChild(div);
  scrollMessages();
  return div;
}

function scrollMessages() {
  const m = $("messages");
  m.scrollTop = m.scrollHeight;
}

function addError(text) {
  const div = document.createElement("div");
  div.className = "msg error";
  div.setAttribute("role", "alert");
  div.textContent = text;
  $("empty-hint").hidden = true;
  $("messages").appendChild(div);
  scrollMessages();
  return div;
}

function setMeta(div, text) {
  let meta = div.querySelector(".meta");
  if (!meta) { meta = document.createElement("span"); meta.className = "meta"; div.appendChild(meta); }
  meta.textContent = text;
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
}

function numberOr(id, fallback) {
  const v = Number($(id).value);
  return Number.isFinite(v) ? v : fallback;
}

async function send() {
  const text = $("prompt").value;
  if (!text.trim() || chat.controller) return;
  $("prompt").value = "";
  chat.history.push({ role: "user", content: text });
  addMessage("user", text);
  const div = addMessage("assistant", "");
  div.classList.add("streaming");
  div.dataset.deltas = "0";   // content chunks applied (one per streamed token)
  div.dataset.updates = "0";  // times the shown text grew
  div.dataset.state = "streaming";
  const body = div.querySelector(".body");
  const controller = new AbortController();
  chat.controller = controller;
  chat.current = div;
  setBusy(true);
  const started = performance.now();
  let content = "", finish = null, usage = null, failed = false;
  const req = {
    messages: chat.history.slice(),
    stream: true,
    stream_options: { include_usage: true },
    temperature: numberOr("temperature", 0.7),
    top_p: numberOr("top-p", 1),
    max_tokens: Math.max(1, Math.floor(numberOr("max-tokens", 256))),
  };
  if (info.model) req.model = info.model;
  if ($("ignore-eos").checked) req.ignore_eos = true;
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: authHeaders({ "Content-Type": "application/json" }),
      body: JSON.stringify(req),
      signal: controller.signal,
    });
    if (!resp.ok) throw new Error(await errorMessage(resp));
    await readSse(resp, (data) => {
      if (data === "[DONE]") return false;
      let chunk;
      try { chunk = JSON.parse(data); } catch (_) { throw new Error("malformed stream event: " + data.slice(0, 200)); }
      if (chunk.error) throw new Error(chunk.error.message || "the server reported an error");
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices || []) {
        const d = c.delta || {};
        if (typeof d.content === "string" && !d.role) {
          div.dataset.deltas = String(Number(div.dataset.deltas) + 1);
          if (d.content) {
            content += d.content;
            body.textContent = content;
            div.dataset.updates = String(Number(div.dataset.updates) + 1);
            scrollMessages();
          }
        }
        if (c.finish_reason) finish = c.finish_reason;
      }
      return true;
    });
  } catch (e) {
    if (e.name === "AbortError") {
      finish = "stopped";
    } else {
      failed = true;
      addError(e.message || String(e));
    }
  } finally {
    div.classList.remove("streaming");
    chat.controller = null;
    chat.current = null;
    setBusy(false);
  }
  const secs = (performance.now() - started) / 1000;
  if (content) {
    chat.history.push({ role: "assistant", content });
  } else {
    chat.history.pop();  // nothing came back: the question is not part of the conversation
    if (!failed && finish !== "stopped") body.textContent = "(empty reply)";
  }
  if (failed && !content) div.remove();
  div.dataset.state = failed ? "error" : finish === "stopped" ? "stopped" : "done";
  const tokens = usage ? usage.completion_tokens : Number(div.dataset.deltas);
  const parts = [tokens + " tokens", secs.toFixed(1) + " s"];
  if (secs > 0 && tokens > 0) parts.push((tokens / secs).toFixed(1) + " tok/s");
  if (finish) parts.push(finish === "stopped" ? "stopped" : "finish: " + finish);
  if (div.isConnected) setMeta(div, parts.join(" · "));
  $("prompt").focus();
}

function stop() {
  if (chat.controller) chat.controller.abort();
}

function initChat() {
  $("chat-form").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && chat.controller) { e.preventDefault(); stop(); }
  });
  $("stop").addEventListener("click", stop);
  $("clear-chat").addEventListener("click", () => {
    stop();
    chat.history = [];
    for (const m of Array.from($("messages").querySelectorAll(".msg"))) m.remove();
    $("empty-hint").hidden = false;
  });
  for (const [id, out] of [["temperature", "temperature-value"], ["top-p", "top-p-value"]]) {
    const show = () => { $(out).textContent = Number($(id).value).toFixed(2); };
    $(id).addEventListener("input", show);
    show();
  }
}

// ---------------------------------------------------------------- KV map

const COLORS = {};
function loadColors() {
  const s = getComputedStyle(document.documentElement);
  for (const k of ["free", "cached", "owned", "shared", "swapped"]) COLORS[k] = s.getPropertyValue("--" + k).trim();
}
const STATE_NAME = { ".": "free", c: "cached", o: "owned", s: "shared" };
// Which state a cell of several blocks shows: the most telling one it holds.
const RANK = { ".": 0, c: 1, o: 2, s: 3 };
const MAX_CELLS = 4096;

const kv = { snap: null, selected: null, layout: null, hostLayout: null, items: new Map() };

function tableKey(t) { return t.key + ":" + t.seq; }

// Grid geometry for `n` blocks on a canvas of CSS width `width`.
function gridLayout(n, width) {
  const per = Math.max(1, Math.ceil(n / MAX_CELLS));
  const cells = Math.max(1, Math.ceil(n / per));
  let size = Math.floor(Math.sqrt((width * Math.min(260, Math.max(90, width * 0.55))) / cells));
  size = Math.max(4, Math.min(22, size));
  const cols = Math.max(1, Math.floor(width / size));
  const rows = Math.ceil(cells / cols);
  return { per, cells, size, cols, rows, n };
}

function drawPool(canvas, states, isHost, highlight) {
  const width = Math.max(120, canvas.parentElement.clientWidth || canvas.clientWidth || 300);
  const L = gridLayout(states.length, width);
  const dpr = window.devicePixelRatio || 1;
  const height = L.rows * L.size;
  if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(height * dpr)) {
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
    canvas.style.height = height + "px";
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);
  const gap = L.size >= 8 ? 1.5 : 1;
  const hl = highlight && highlight.size ? highlight : null;
  for (let c = 0; c < L.cells; c++) {
    let best = ".", lit = false;
    const end = Math.min(states.length, (c + 1) * L.per);
    for (let b = c * L.per; b < end; b++) {
      const ch = states[b];
      if ((RANK[ch] || 0) > RANK[best]) best = ch;
      if (hl && hl.has(b)) lit = true;
    }
    let color = COLORS[STATE_NAME[best] || "free"];
    if (isHost && best !== "." && best !== "c") color = COLORS.swapped;
    const x = (c % L.cols) * L.size, y = Math.floor(c / L.cols) * L.size;
    ctx.globalAlpha = hl && !lit ? 0.28 : 1;
    ctx.fillStyle = color;
    ctx.fillRect(x, y, L.size - gap, L.size - gap);
    if (lit) {
      ctx.globalAlpha = 1;
      ctx.strokeStyle = "#111827";
      ctx.lineWidth = 1.5;
      ctx.strokeRect(x + 0.75, y + 0.75, L.size - gap - 1.5, L.size - gap - 1.5);
    }
  }
  ctx.globalAlpha = 1;
  return L;
}

function selectedTable() {
  if (!kv.snap || !kv.selected) return null;
  return kv.snap.tables.find((t) => tableKey(t) === kv.selected) || null;
}

function render() {
  const s = kv.snap;
  if (!s) return;
  const sel = selectedTable();
  const dev = new Set(), host = new Set();
  if (sel) for (const b of sel.blocks) (sel.swapped ? host : dev).add(b);
  kv.layout = drawPool($("kv-canvas"), s.device, false, sel ? dev : null);
  const canvas = $("kv-canvas");
  canvas.dataset.owned = String(count(s.device, "o"));
  canvas.dataset.shared = String(count(s.device, "s"));
  canvas.dataset.cached = String(count(s.device, "c"));
  canvas.dataset.free = String(count(s.device, "."));
  canvas.dataset.generation = String(s.generation);
  canvas.setAttribute("aria-label", "Device block pool: " + s.device.length + " blocks, " +
    canvas.dataset.owned + " owned, " + canvas.dataset.shared + " shared, " + canvas.dataset.cached + " cached");
  const L = kv.layout;
  $("kv-caption").textContent = s.device.length.toLocaleString() + " device blocks of " + s.block_size +
    " tokens" + (L.per > 1 ? " · one cell = " + L.per + " blocks (the busiest state shown)" : " · one cell per block");
  if (s.host && s.host.length) {
    $("host-wrap").hidden = false;
    kv.hostLayout = drawPool($("host-canvas"), s.host, true, sel && sel.swapped ? host : null);
  } else {
    $("host-wrap").hidden = true;
  }
  renderBlockTable(sel);
}

function count(str, ch) {
  let n = 0;
  for (let i = 0; i < str.length; i++) if (str[i] === ch) n++;
  return n;
}

function pct(x) { return (100 * x).toFixed(x > 0 && x < 0.1 ? 1 : 0) + "%"; }

function applySnapshot(s) {
  kv.snap = s;
  const c = s.counters;
  $("c-usage").textContent = pct(c.kv_usage);
  $("c-hit").textContent = c.prefix_queried_tokens ? pct(c.prefix_hit_rate) : "–";
  $("c-running").textContent = c.num_running;
  $("c-waiting").textContent = c.num_waiting;
  $("c-swapped").textContent = c.num_swapped;
  $("c-preempt").textContent = c.num_preemptions;
  renderTables(s.tables);
  render();
}

function renderTables(tables) {
  const list = $("tables");
  const seen = new Set();
  let prev = null;
  for (const t of tables) {
    const k = tableKey(t);
    seen.add(k);
    let li = kv.items.get(k);
    if (!li) {
      li = document.createElement("li");
      li.tabIndex = 0;
      li.dataset.key = k;
      const id = document.createElement("span"); id.className = "rid";
      const meta = document.createElement("span"); meta.className = "rinfo";
      li.append(id, meta);
      const pick = () => { kv.selected = k; markSelected(); render(); };
      const unpick = () => { if (kv.selected === k && document.activeElement !== li) { kv.selected = null; markSelected(); render(); } };
      li.addEventListener("mouseenter", pick);
      li.addEventListener("focus", pick);
      li.addEventListener("mouseleave", unpick);
      li.addEventListener("blur", () => { if (kv.selected === k) { kv.selected = null; markSelected(); render(); } });
      kv.items.set(k, li);
    }
    li.firstChild.textContent = t.id + (t.seq ? " #" + t.seq : "");
    li.lastChild.textContent = t.tokens + " tokens · " + t.blocks.length + " blocks" + (t.swapped ? " · swapped" : "");
    li.setAttribute("aria-label", "Sequence " + t.id + (t.seq ? " sample " + t.seq : "") + ": " + t.tokens +
      " tokens in " + t.blocks.length + " blocks" + (t.swapped ? ", swapped out" : ""));
    // The server's order; an item already in place is not moved (moving one would blur it).
    const want = prev ? prev.nextSibling : list.firstChild;
    if (want !== li) list.insertBefore(li, want);
    prev = li;
  }
  for (const [k, li] of kv.items) {
    if (!seen.has(k)) { li.remove(); kv.items.delete(k); if (kv.selected === k) kv.selected = null; }
  }
  $("no-tables").hidden = tables.length > 0;
  markSelected();
}

function markSelected() {
  for (const [k, li] of kv.items) li.classList.toggle("selected", k === kv.selected);
}

function renderBlockTable(t) {
  const box = $("block-table");
  box.textContent = "";
  if (!t) return;
  const title = document.createElement("div");
  title.className = "bt-title";
  title.textContent = "Block table of " + t.id + (t.seq ? " #" + t.seq : "") + " (logical → physical" +
    (t.swapped ? ", host pool" : "") + "):";
  const grid = document.createElement("div");
  grid.className = "bt-grid";
  const states = t.swapped ? kv.snap.host : kv.snap.device;
  t.blocks.forEach((p, i) => {
    const cell = document.createElement("span");
    cell.className = "bt-cell" + (states[p] === "s" ? " shared" : "");
    cell.append(String(i) + " → ");
    const b = document.createElement("b");
    b.textContent = String(p);
    cell.appendChild(b);
    grid.appendChild(cell);
  });
  box.append(title, grid);
}

function canvasTip(canvas, layoutOf, statesOf, label) {
  canvas.addEventListener("mousemove", (e) => {
    const L = layoutOf(), states = statesOf();
    const tip = $("kv-tip");
    if (!L || !states) return;
    const r = canvas.getBoundingClientRect();
    const col = Math.floor((e.clientX - r.left) / L.size), row = Math.floor((e.clientY - r.top) / L.size);
    const cell = row * L.cols + col;
    if (col >= L.cols || cell >= L.cells || canvas.id !== "kv-canvas") { tip.hidden = true; return; }
    const first = cell * L.per, last = Math.min(states.length, first + L.per) - 1;
    let text = label + (L.per > 1 ? " blocks " + first + "–" + last : " block " + first) + ": ";
    if (L.per === 1) {
      text += STATE_NAME[states[first]] || "?";
      const owners = kv.snap.tables.filter((t) => !t.swapped && t.blocks.includes(first)).map((t) => t.id);
      if (owners.length) text += " · " + owners.join(", ");
    } else {
      const tally = {};
      for (let b = first; b <= last; b++) tally[states[b]] = (tally[states[b]] || 0) + 1;
      text += Object.entries(tally).map(([k, v]) => v + " " + STATE_NAME[k]).join(", ");
    }
    tip.textContent = text;
    tip.style.left = (e.clientX - r.left) + "px";
    tip.style.top = (e.clientY - r.top) + "px";
    tip.hidden = false;
  });
  canvas.addEventListener("mouseleave", () => { $("kv-tip").hidden = true; });
}

function setKvStatus(text, cls) {
  const el = $("kv-status");
  el.textContent = text;
  el.className = "status " + (cls || "");
}

async function kvLoop() {
  let delay = 1000;
  for (;;) {
    try {
      const resp = await fetch("/v1/kv_map/stream?interval_ms=250", { headers: authHeaders() });
      if (!resp.ok) {
        setKvStatus(await errorMessage(resp), "down");
      } else {
        setKvStatus("live", "live");
        delay = 1000;
        await readSse(resp, (data) => {
          let s;
          try { s = JSON.parse(data); } catch (_) { return true; }
          if (s.error) { setKvStatus(s.error.message || "error", "down"); return false; }
          applySnapshot(s);
          return true;
        });
        setKvStatus("reconnecting…", "down");
      }
    } catch (e) {
      setKvStatus("disconnected — retrying", "down");
    }
    await new Promise((r) => setTimeout(r, delay));
    delay = Math.min(10000, delay * 2);
  }
}

// ---------------------------------------------------------------- calculator

const calc = { presets: null, last: null };

function fmtBytes(b) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
  return String(i ? +b.toFixed(b < 10 ? 2 : 1) : b) + " " + units[i];
}

function fillModel(name) {
  const m = calc.presets.models.find((x) => x.name === name);
  if (!m) return;
  $("calc-layers").value = m.layers;
  $("calc-kv-heads").value = m.kv_heads;
  $("calc-head-dim").value = m.head_dim;
  $("calc-dtype").value = String(m.dtype_bytes);
  $("calc-params").value = +(m.params / 1e9).toPrecision(4);
}

function fillHardware(name) {
  const h = calc.presets.hardware.find((x) => x.name === name);
  if (h) $("calc-mem").value = +h.memory_gib.toFixed(1);
}

async function initCalc() {
  try {
    const resp = await fetch("/v1/plan", { headers: authHeaders() });
    if (!resp.ok) throw new Error(await errorMessage(resp));
    calc.presets = await resp.json();
  } catch (e) {
    showCalcError("could not load the calculator's presets: " + (e.message || e));
    return;
  }
  const model = $("calc-model");
  for (const m of calc.presets.models) model.add(new Option(m.name, m.name));
  model.add(new Option("custom", "custom"));
  const hw = $("calc-hw");
  for (const h of calc.presets.hardware) hw.add(new Option(h.name + " · " + (h.memory_gib * 1.073741824).toFixed(0) + " GB", h.name));
  model.value = "llama2-7b";
  fillModel("llama2-7b");
  hw.value = "a100-40gb";
  fillHardware("a100-40gb");
  model.addEventListener("change", () => { if (model.value !== "custom") fillModel(model.value); });
  hw.addEventListener("change", () => fillHardware(hw.value));
  for (const id of ["calc-layers", "calc-kv-heads", "calc-head-dim", "calc-dtype", "calc-params"]) {
    $(id).addEventListener("input", () => { model.value = "custom"; });
  }
  $("calc-form").addEventListener("submit", (e) => { e.preventDefault(); runPlan(); });
  runPlan();
}

function showCalcError(msg) {
  const box = $("calc-error");
  box.textContent = msg;
  box.hidden = false;
}

function intField(id) {
  const v = Number($(id).value);
  return Number.isFinite(v) ? Math.round(v) : NaN;
}

async function runPlan() {
  $("calc-error").hidden = true;
  const preset = $("calc-model").value;
  const body = {
    hardware: $("calc-hw").value,
    gpu_memory_gib: Number($("calc-mem").value),
    gpu_memory_utilization: Number($("calc-util").value),
    block_size: intField("calc-block"),
    max_model_len: intField("calc-ctx"),
    trace: $("calc-trace").value,
    num_requests: intField("calc-requests"),
    max_num_seqs: intField("calc-seqs"),
    points: 60,
  };
  // A preset is sent by name; custom sends its shape over the nearest preset.
  body.model = preset === "custom" ? "llama2-7b" : preset;
  if (preset === "custom") {
    body.layers = intField("calc-layers");
    body.kv_heads = intField("calc-kv-heads");
    body.head_dim = intField("calc-head-dim");
    body.dtype_bytes = intField("calc-dtype");
    body.params = Number($("calc-params").value) * 1e9;
  }
  $("calc-run").disabled = true;
  $("calc-status").textContent = "simulating…";
  const t0 = performance.now();
  try {
    const resp = await fetch("/v1/plan", {
      method: "POST",
      headers: authHeaders({ "Content-Type": "application/json" }),
      body: JSON.stringify(body, (k, v) => (typeof v === "number" && !Number.isFinite(v) ? null : v)),
    });
    if (!resp.ok) throw new Error(await errorMessage(resp));
    const r = await resp.json();
    showPlan(r);
    $("calc-status").textContent = "simulated " + r.trace.requests + " requests in " +
      ((performance.now() - t0) / 1000).toFixed(2) + " s";
  } catch (e) {
    $("calc-status").textContent = "";
    showCalcError(e.message || String(e));
  } finally {
    $("calc-run").disabled = false;
  }
}

function showPlan(r) {
  const sys = Object.fromEntries(r.systems.map((s) => [s.system, s]));
  const paged = sys["paged"], max = sys["orca-max"];
  const figures = [
    ["KV per token", fmtBytes(r.kv_bytes_per_token)],
    ["KV memory (weights: " + r.weights_gib.toFixed(1) + " GiB)", r.kv_memory_gib.toFixed(2) + " GiB"],
    ["Token slots", r.kv_tokens.toLocaleString()],
    ["Blocks", r.num_blocks.toLocaleString() + " × " + r.block_size + " tokens"],
    ["Fit, contiguous (" + r.max_model_len + " reserved each)", r.fit.contiguous_max_len.toLocaleString() + " sequences"],
    ["Fit, paged (mean " + Math.round(r.trace.mean_input + r.trace.mean_output) + " tokens)", r.fit.paged_mean_len.toLocaleString() + " sequences"],
  ];
  if (paged && max) {
    figures.push(["Simulated running, paged", paged.mean_running.toFixed(1) + " mean · " + paged.max_running + " max"]);
    figures.push(["Simulated running, Orca (max)", max.mean_running.toFixed(1) + " mean · " + max.max_running + " max"]);
  }
  const dl = $("calc-figures");
  dl.textContent = "";
  for (const [k, v] of figures) {
    const d = document.createElement("div");
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = v;
    d.append(dt, dd);
    dl.appendChild(d);
  }
  $("calc-results").hidden = false;
  drawChart(r);
}

const SVG = "http://www.w3.org/2000/svg";
function el(name, attrs, text) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

// Two bar groups, each on its own scale: how many sequences fit in the KV memory (paged blocks
// of the mix's mean length vs contiguous max-length reservations), then the simulation's mean
// sequences running per system with its KV utilization.
function drawChart(r) {
  const names = { paged: "Paged (vLLM)", "orca-oracle": "Orca (oracle)", "orca-pow2": "Orca (pow2)", "orca-max": "Orca (max)" };
  const groups = [
    {
      title: "Sequences that fit in KV memory",
      rows: [
        { name: "Paged", value: r.fit.paged_mean_len, label: r.fit.paged_mean_len.toLocaleString(), color: COLORS.owned },
        { name: "Contiguous", value: r.fit.contiguous_max_len, label: r.fit.contiguous_max_len.toLocaleString(), color: COLORS.shared },
      ],
    },
    {
      title: "Simulated: mean running · KV utilization",
      rows: r.systems.map((s) => ({
        name: names[s.system] || s.system,
        value: s.mean_running,
        label: s.mean_running.toFixed(1) + " · " + pct(s.kv_util) + " util",
        color: s.system === "paged" ? COLORS.owned : COLORS.shared,
      })),
    },
  ];
  calc.last = r;
  // Drawn at the box's own width (one SVG unit = one CSS pixel), so text keeps its size on a phone.
  const W = Math.max(300, Math.round($("calc-chart").clientWidth || 640));
  const left = W < 480 ? 92 : 120, right = W < 480 ? 96 : 120, rowH = 30, titleH = 26, gapH = 14;
  const H = groups.reduce((h, g) => h + titleH + g.rows.length * rowH + gapH, 0);
  const svg = el("svg", { viewBox: "0 0 " + W + " " + H, role: "img",
    "aria-label": "Sequences that fit: paged " + r.fit.paged_mean_len + ", contiguous " + r.fit.contiguous_max_len +
      "; simulated mean running, paged " + (r.systems[0] ? r.systems[0].mean_running.toFixed(1) : "–") });
  let y = 0;
  for (const g of groups) {
    svg.appendChild(el("text", { x: 0, y: y + 16, "font-weight": 600 }, g.title));
    y += titleH;
    const top = y;
    const scale = (W - left - right) / Math.max(1e-9, ...g.rows.map((x) => x.value));
    for (const row of g.rows) {
      svg.appendChild(el("text", { x: left - 8, y: y + 19, "text-anchor": "end" }, row.name));
      const w = Math.max(1, row.value * scale);
      svg.appendChild(el("rect", { x: left, y: y + 5, width: w, height: rowH - 10, rx: 3, fill: row.color }));
      svg.appendChild(el("text", { x: left + w + 6, y: y + 19, class: "label-muted" }, row.label));
      y += rowH;
    }
    svg.appendChild(el("line", { x1: left, x2: left, y1: top, y2: y, stroke: "#c9ced6" }));
    y += gapH;
  }
  const box = $("calc-chart");
  box.textContent = "";
  box.appendChild(svg);
  $("chart-caption").textContent = r.kv_memory_gib.toFixed(1) + " GiB of KV memory, " + r.trace.requests + " " +
    r.trace.name + " requests: paged runs ×" +
    (r.concurrency_paged_over_oracle ? r.concurrency_paged_over_oracle.toFixed(2) : "–") + " the sequences of the Orca oracle";
}

// ---------------------------------------------------------------- start

function start() {
  loadColors();
  initChat();
  canvasTip($("kv-canvas"), () => kv.layout, () => kv.snap && kv.snap.device, "device");
  window.addEventListener("resize", () => {
    render();
    if (calc.last) drawChart(calc.last);
  });
  $("api-key").addEventListener("change", () => { loadModel(); });
  $("key-form").addEventListener("submit", (e) => { e.preventDefault(); loadModel(); });
  loadModel();
  kvLoop();
  initCalc();
}

start();
