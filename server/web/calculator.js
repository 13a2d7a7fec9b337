// The KV cache / VRAM calculator: its form (presets from GET /v1/plan, a custom shape over the
// nearest preset), the simulation's figures from POST /v1/plan and an SVG bar chart. Its state
// (`calc`, `colors`) is this module's own.

import { $, authHeaders, errorMessage, pct, readColors } from "/shared.js";

// The bar colours, read from the stylesheet by `initCalculator`.
let colors = {};

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

export async function initCalculator() {
  colors = readColors();
  window.addEventListener("resize", () => { if (calc.last) drawChart(calc.last); });
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
  if ($("calc-kv-dtype").value) body.kv_cache_dtype = $("calc-kv-dtype").value;
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
    ["Fit, paged (" + r.max_model_len + " tokens each)", r.fit.paged_max_len.toLocaleString() + " sequences"],
  ];
  if (r.model.sliding_layers > 0) {
    figures.push(["KV groups", r.model.sliding_layers + " of " + r.model.layers + " layers over a " + r.model.sliding_window + "-token window: their blocks leave with it"]);
  }
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
        { name: "Paged", value: r.fit.paged_mean_len, label: r.fit.paged_mean_len.toLocaleString(), color: colors.owned },
        { name: "Contiguous", value: r.fit.contiguous_max_len, label: r.fit.contiguous_max_len.toLocaleString(), color: colors.shared },
      ],
    },
    {
      title: "Simulated: mean running · KV utilization",
      rows: r.systems.map((s) => ({
        name: names[s.system] || s.system,
        value: s.mean_running,
        label: s.mean_running.toFixed(1) + " · " + pct(s.kv_util) + " util",
        color: s.system === "paged" ? colors.owned : colors.shared,
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
