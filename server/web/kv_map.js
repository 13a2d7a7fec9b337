// The live KV block map: snapshots from /v1/kv_map/stream drawn on a canvas (cells aggregate
// blocks past 4096; a hovered or focused sequence outlines its blocks and lists its block
// table), the host swap pool, the counters. Its state (`kv`) is this module's own; `kv`,
// `gridLayout`, `drawPool`, `applySnapshot` and `render` are exported for the browser test.

import { $, authHeaders, errorMessage, pct, readColors, readSse } from "/shared.js";

// Read from the stylesheet by `initKvMap` (before the first snapshot is drawn).
let COLORS = {};
const STATE_NAME = { ".": "free", c: "cached", o: "owned", s: "shared" };
// Which state a cell of several blocks shows: the most telling one it holds.
const RANK = { ".": 0, c: 1, o: 2, s: 3 };
const MAX_CELLS = 4096;

export const kv = { snap: null, selected: null, layout: null, hostLayout: null, items: new Map() };

function tableKey(t) { return t.key + ":" + t.seq + (t.group ? ":" + t.group : ""); }

/// "#2", "window 512", … : which sample and which KV cache group a table is (empty for the one
/// full group of a model without windows).
function tableSuffix(t) {
  return (t.seq ? " #" + t.seq : "") + (t.window ? " · window " + t.window + " (group " + t.group + ")" : t.group ? " (group " + t.group + ")" : "");
}

// Grid geometry for `n` blocks on a canvas of CSS width `width`.
export function gridLayout(n, width) {
  const per = Math.max(1, Math.ceil(n / MAX_CELLS));
  const cells = Math.max(1, Math.ceil(n / per));
  let size = Math.floor(Math.sqrt((width * Math.min(260, Math.max(90, width * 0.55))) / cells));
  size = Math.max(4, Math.min(22, size));
  const cols = Math.max(1, Math.floor(width / size));
  const rows = Math.ceil(cells / cols);
  return { per, cells, size, cols, rows, n };
}

export function drawPool(canvas, states, isHost, highlight) {
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

export function render() {
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

export function applySnapshot(s) {
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
    li.firstChild.textContent = t.id + tableSuffix(t);
    li.lastChild.textContent = t.tokens + " tokens · " + t.blocks.length + " blocks" +
      (t.first_block ? " (" + t.first_block + " released)" : "") + (t.swapped ? " · swapped" : "");
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
  title.textContent = "Block table of " + t.id + tableSuffix(t) + " (logical → physical" +
    (t.swapped ? ", host pool" : "") + "):";
  const grid = document.createElement("div");
  grid.className = "bt-grid";
  const states = t.swapped ? kv.snap.host : kv.snap.device;
  t.blocks.forEach((p, i) => {
    const cell = document.createElement("span");
    cell.className = "bt-cell" + (states[p] === "s" ? " shared" : "");
    cell.append(String(i + (t.first_block || 0)) + " → ");
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

export function initKvMap() {
  COLORS = readColors();
  canvasTip($("kv-canvas"), () => kv.layout, () => kv.snap && kv.snap.device, "device");
  window.addEventListener("resize", render);
  kvLoop();
}
