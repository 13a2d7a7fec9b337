// The engine's web page: three apps, one ES module each — chat (streamed from
// /v1/chat/completions), the live KV block map (/v1/kv_map/stream) and the KV cache calculator
// (/v1/plan) — started here. Plain JS, no dependencies, no build step; each app keeps its state
// in its own module.

import { initCalculator } from "/calculator.js";
import { initChat } from "/chat.js";
import { initKvMap } from "/kv_map.js";

initChat();
initKvMap();
initCalculator();
