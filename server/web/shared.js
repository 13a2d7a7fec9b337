// What the page's three apps (chat, KV map, calculator) share: element lookup, the API key's
// header, error messages of non-2xx answers, an SSE reader over a fetch body, the palette and a
// percentage. Functions only: no state lives here, so no app can see another's.

export const $ = (id) => document.getElementById(id);

export function authHeaders(extra) {
  const h = Object.assign({}, extra || {});
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

// The message of a non-2xx answer: OpenAI's `error.message` when the body has one.
export async function errorMessage(resp) {
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
export async function readSse(resp, onData) {
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

// The block-state colours of the stylesheet (`--free`, `--cached`, …), read once by each app
// that draws with them.
export function readColors() {
  const s = getComputedStyle(document.documentElement);
  const colors = {};
  for (const k of ["free", "cached", "owned", "shared", "swapped"]) colors[k] = s.getPropertyValue("--" + k).trim();
  return colors;
}

export function pct(x) { return (100 * x).toFixed(x > 0 && x < 0.1 ? 1 : 0) + "%"; }
