// The chat app and the header's model line: messages streamed from /v1/chat/completions (fetch
// + SSE parsed from the body stream, an AbortController to stop; each applied delta counted in
// the message's `data-deltas`). Its state (`info`, `chat`) is this module's own.

import { $, authHeaders, errorMessage, readSse } from "/shared.js";

// The model the header shows and the chat requests name.
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

// A reasoning model's thinking (`reasoning_content`, with the server's `--reasoning-parser`),
// shown collapsed above its answer; the conversation sent back holds the answers only.
function showReasoning(div, body, text) {
  let box = div.querySelector("details.reasoning");
  if (!box) {
    box = document.createElement("details");
    box.className = "reasoning";
    const summary = document.createElement("summary");
    summary.textContent = "Reasoning";
    box.append(summary, document.createElement("div"));
    div.insertBefore(box, body);
  }
  box.lastElementChild.textContent = text;
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
  let content = "", reasoning = "", finish = null, usage = null, failed = false;
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
        if (typeof d.reasoning_content === "string" && d.reasoning_content) {
          reasoning += d.reasoning_content;
          showReasoning(div, body, reasoning);
          div.dataset.deltas = String(Number(div.dataset.deltas) + 1);
        }
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

export function initChat() {
  $("api-key").addEventListener("change", () => { loadModel(); });
  $("key-form").addEventListener("submit", (e) => { e.preventDefault(); loadModel(); });
  loadModel();
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

