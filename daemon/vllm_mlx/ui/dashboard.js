// The status page: polls /v1/status every POLL_MS and renders it; a chat panel that
// streams /v1/chat/completions. Every value from the daemon is set as text, never as
// HTML (the page's Content-Security-Policy also forbids any other script).
"use strict";

const POLL_MS = 2000;
const KEY_STORAGE = "vllm-mlx-api-key"; // sessionStorage: gone when the tab closes
const $ = (id) => document.getElementById(id);

let polling = null;
let lastStatus = null;
let chat = { messages: [], controller: null };

// --- small helpers ---------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function mb(value) {
  if (value === null || value === undefined) return "–";
  return value >= 1024 ? `${(value / 1024).toFixed(2)} GiB` : `${value.toFixed(1)} MiB`;
}

function seconds(value) {
  if (value === null || value === undefined) return "–";
  if (value < 1) return `${Math.round(value * 1000)} ms`;
  if (value < 120) return `${value.toFixed(1)} s`;
  if (value < 7200) return `${Math.round(value / 60)} min`;
  return `${(value / 3600).toFixed(1)} h`;
}

function clock(epoch) {
  return new Date(epoch * 1000).toLocaleTimeString();
}

function key() {
  return sessionStorage.getItem(KEY_STORAGE) || "";
}

function headers(extra = {}) {
  const h = { ...extra };
  if (key()) h.Authorization = `Bearer ${key()}`;
  return h;
}

function banner(text) {
  const node = $("banner");
  node.hidden = !text;
  node.textContent = text || "";
}

async function errorText(response) {
  try {
    const body = await response.json();
    const error = body.error;
    if (typeof error === "string") return error;
    if (error && typeof error.message === "string") return error.message;
  } catch (_) { /* not JSON */ }
  return `${response.status} ${response.statusText}`;
}

// --- the key ---------------------------------------------------------------------

function askForKey(reason) {
  $("key-reason").textContent = reason;
  const dialog = $("key-dialog");
  if (!dialog.open) dialog.showModal();
  $("key-input").focus();
}

$("key-form").addEventListener("submit", () => {
  const value = $("key-input").value.trim();
  if (value) sessionStorage.setItem(KEY_STORAGE, value);
  $("key-input").value = "";
  poll();
});
$("key-forget").addEventListener("click", () => {
  sessionStorage.removeItem(KEY_STORAGE);
  $("key-dialog").close();
  poll();
});
$("key-button").addEventListener("click", () => askForKey(key()
  ? "Replace the key this tab uses."
  : "Enter a key from the daemon's auth settings."));

// --- polling ---------------------------------------------------------------------

async function poll() {
  clearTimeout(polling);
  try {
    const response = await fetch("v1/status", { headers: headers(), cache: "no-store" });
    if (response.status === 401 || response.status === 403) {
      const message = await errorText(response);
      setOverall("locked");
      banner("The daemon needs an API key with the admin scope to show its status.");
      askForKey(key() ? `That key was refused: ${message}` : "This daemon needs an API key.");
      return; // resumes when a key is entered
    }
    if (!response.ok) throw new Error(await errorText(response));
    lastStatus = await response.json();
    banner("");
    render(lastStatus);
  } catch (error) {
    setOverall("down");
    banner(`Cannot read the daemon's status: ${error.message || error}`);
  }
  polling = setTimeout(poll, POLL_MS);
}

function setOverall(word) {
  const node = $("overall");
  node.textContent = word;
  node.className = `badge ${word === "running" ? "ok" : word}`;
}

function render(doc) {
  setOverall(doc.status);
  $("summary").textContent =
    `v${doc.version} · up ${seconds(doc.uptime_s)} · ${doc.num_running} running, ` +
    `${doc.num_waiting} waiting · ${doc.total_requests_processed} requests served`;
  renderMemory(doc.memory);
  renderModels(doc.models);
  renderLive(doc.models);
  renderCharts(doc.activity);
  renderChatModels(doc.models);
  renderConfig(doc.config);
  renderMcp(doc.mcp.servers);
  renderDistributed(doc.distributed);
  renderErrors(doc.activity.errors);
}

function renderMemory(memory) {
  // Against the budget when one is set, else against the machine's memory.
  const used = memory.models_mb;
  const limit = memory.budget_mb || memory.system_gb * 1024;
  const meter = $("memory-meter");
  const share = limit ? Math.min(1, used / limit) : 0;
  meter.firstElementChild.style.width = `${(share * 100).toFixed(1)}%`;
  meter.classList.toggle("high", share > 0.8 && share <= 0.95);
  meter.classList.toggle("full", share > 0.95);
  meter.title = `${(share * 100).toFixed(0)}%`;
  const of = memory.budget_mb
    ? `of the ${mb(memory.budget_mb)} budget`
    : `of ${mb(limit)} on this machine (no memory budget set)`;
  $("memory-text").textContent =
    `Models reserve ${mb(used)} ${of} · process RSS ${memory.rss_gb.toFixed(2)} GiB`;
}

function stateWord(model) {
  const residency = model.residency;
  const idle = model.state === "not_loaded" || model.state === "stopped";
  if (idle && residency.load === "on_demand" && !model.error) return "on_demand";
  return model.state;
}

function keepAliveText(residency) {
  if (residency.keep_alive < 0) return "never unloads";
  if (residency.in_flight > 0) return `keep_alive ${seconds(residency.keep_alive)} after the last request`;
  if (residency.idle_s === null) return `keep_alive ${seconds(residency.keep_alive)}`;
  const left = Math.max(0, residency.keep_alive - residency.idle_s);
  return `unloads in ${seconds(left)} (idle ${seconds(residency.idle_s)})`;
}

async function modelAction(name, action, button) {
  button.disabled = true;
  try {
    const response = await fetch(`v1/models/${encodeURIComponent(name)}/${action}`, {
      method: "POST",
      headers: headers({ "Content-Type": "application/json" }),
      body: "{}",
    });
    if (!response.ok) banner(`${action} ${name}: ${await errorText(response)}`);
  } catch (error) {
    banner(`${action} ${name}: ${error.message || error}`);
  } finally {
    button.disabled = false;
    poll();
  }
}

function renderModels(models) {
  const box = $("models");
  box.replaceChildren(...models.map((model) => {
    const word = stateWord(model);
    const r = model.residency;
    const loaded = model.state === "running";
    const action = loaded ? "unload" : "load";
    const busy = model.state === "loading" || model.state === "unloading";
    const button = el("button", {
      type: "button", class: loaded ? "ghost" : "", "data-action": action, disabled: busy,
      text: action === "load" ? "Load" : "Unload",
    });
    button.addEventListener("click", () => modelAction(model.model, action, button));
    const facts = el("dl", { class: "facts" },
      el("dt", { text: "task" }), el("dd", { text: model.task }),
      el("dt", { text: "memory" }), el("dd", { text: loaded
        ? `${mb(r.memory_mb)}: weights ${mb(r.weights_mb)}, KV in use ${mb(r.kv_mb)}, ` +
          `prefix cache up to ${mb(r.prefix_cache_bound_mb)}` : "not loaded" }),
      el("dt", { text: "prefix cache" }), el("dd", { text: model.cache.type === "none"
        ? "–" : `${mb(model.cache.memory_mb)} held · ${model.cache.entries} entries · ` +
          `hit rate ${(model.cache.hit_rate * 100).toFixed(0)}%` }),
      el("dt", { text: "idle" }), el("dd", { text: r.pinned ? "pinned: never evicted" : keepAliveText(r) }),
      el("dt", { text: "served" }), el("dd", { text:
        `${model.total_requests_processed} requests · ${model.total_completion_tokens} tokens out` }),
    );
    return el("article", { class: "model", "data-model": model.model, "data-state": word },
      el("header", {}, el("span", { class: "name", text: model.model }),
        el("span", { class: `badge ${word}`, "data-testid": "model-state", text: word.replace("_", " ") })),
      model.error ? el("div", { class: "error", "data-testid": "model-error", text: model.error }) : null,
      facts,
      el("div", { class: "row" }, button,
        r.load === "startup" ? el("span", { class: "muted small", text: "loads at startup" }) : null),
    );
  }));
}

function renderLive(models) {
  const rows = [];
  for (const model of models) {
    for (const r of model.requests) {
      const tokens = r.phase === "prefill"
        ? `prompt ${r.prompt_tokens_processed}/${r.prompt_tokens}`
        : `${r.generated_tokens}/${r.max_tokens}`;
      rows.push(el("tr", { "data-request": r.request_id },
        el("td", { text: model.model }),
        el("td", { text: r.request_id.slice(0, 18) }),
        el("td", {}, el("span", { class: "badge", text: r.phase })),
        el("td", { class: "num", text: tokens }),
        el("td", { class: "num", text: r.tokens_per_second ? r.tokens_per_second.toFixed(1) : "–" }),
        el("td", { class: "num", text: seconds(r.ttft_s) }),
        el("td", { class: "num", text: String(r.cached_tokens) }),
        el("td", { class: "num", text: seconds(r.elapsed_s) }),
      ));
    }
  }
  $("live").tBodies[0].replaceChildren(...rows);
  $("live-empty").hidden = rows.length > 0;
}

function bars(svg, values, label) {
  const width = 240, height = 60;
  const top = Math.max(...values.map((v) => v || 0), 0);
  const step = width / Math.max(1, values.length);
  const ns = "http://www.w3.org/2000/svg";
  const shapes = values.map((v, i) => {
    if (!v) return null;
    const h = Math.max(1, (v / top) * (height - 2));
    const rect = document.createElementNS(ns, "rect");
    rect.setAttribute("x", (i * step).toFixed(2));
    rect.setAttribute("y", (height - h).toFixed(2));
    rect.setAttribute("width", Math.max(0.5, step - 0.6).toFixed(2));
    rect.setAttribute("height", h.toFixed(2));
    const title = document.createElementNS(ns, "title");
    title.textContent = label(v);
    rect.append(title);
    return rect;
  }).filter(Boolean);
  svg.replaceChildren(...shapes);
  return top;
}

function renderCharts(activity) {
  const buckets = activity.buckets;
  const perSecond = buckets.map((b) => b.generated_tokens / activity.bucket_s);
  const peak = bars($("throughput-chart"), perSecond, (v) => `${v.toFixed(1)} tok/s`);
  const recent = buckets.slice(-6); // the last 30 s
  const now = recent.reduce((sum, b) => sum + b.generated_tokens, 0) / (recent.length * activity.bucket_s);
  $("throughput-text").textContent = `now ${now.toFixed(1)} tok/s · peak ${peak.toFixed(1)} tok/s`;
  const ttft = buckets.map((b) => b.ttft_avg_s);
  const worst = bars($("ttft-chart"), ttft, (v) => seconds(v));
  const seen = ttft.filter((v) => v !== null);
  const mean = seen.length ? seen.reduce((a, b) => a + b, 0) / seen.length : null;
  $("ttft-text").textContent = seen.length
    ? `mean ${seconds(mean)} · worst ${seconds(worst)} · ${buckets.reduce((s, b) => s + b.requests, 0)} requests`
    : "no requests finished in the last 10 minutes";
}

function renderConfig(config) {
  const facts = [
    ["file", config.path || "built-in defaults"],
    ["loaded", config.loaded_at ? clock(config.loaded_at) : "–"],
    ["last reload", config.last_error ? "failed: the running config was kept" : "ok"],
  ];
  const nodes = facts.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })]);
  if (config.last_error) {
    nodes.push(el("dt", { text: "error" }),
      el("dd", { class: "error", "data-testid": "config-error", text: config.last_error }));
  }
  nodes.push(el("dt", { text: "needs restart" }), el("dd", { text: config.pending_changes.length
    ? config.pending_changes.join(", ") : "nothing" }));
  $("config").replaceChildren(...nodes);
}

function renderMcp(servers) {
  $("mcp").replaceChildren(...(servers.length ? servers.map((s) => el("li", {},
    el("span", { class: `badge ${s.state === "ready" ? "ok" : s.state === "failed" ? "failed" : ""}`, text: s.state }),
    el("strong", { text: s.name }),
    s.tools !== undefined ? el("span", { class: "muted", text: `${s.tools} tools` }) : null,
    s.error ? el("span", { class: "muted", text: s.error }) : null,
  )) : [el("li", { class: "muted", text: "none configured" })]));
}

function renderDistributed(group) {
  $("distributed-card").hidden = !group;
  if (!group) return;
  $("distributed").tBodies[0].replaceChildren(...group.ranks.map((r) => el("tr", {},
    el("td", { text: String(r.rank) }), el("td", { text: r.host || "–" }),
    el("td", { text: r.state }), el("td", { class: "num", text: String(r.steps) }),
    el("td", { class: "num", text: r.step_ms.toFixed(1) }),
    el("td", { class: "num", text: r.sync_ms.toFixed(1) }),
    el("td", { class: "num", text: mb(r.weight_bytes / 2 ** 20) }),
  )));
}

function renderErrors(errors) {
  $("errors").replaceChildren(...(errors.length ? errors.map((e) => el("li", {},
    el("span", { class: "when", text: clock(e.at) }),
    el("span", { class: `badge ${e.status >= 500 ? "failed" : "degraded"}`, text: String(e.status) }),
    el("code", { text: e.route }),
    e.model ? el("span", { class: "muted", text: e.model }) : null,
    el("span", { text: e.message }),
  )) : [el("li", { class: "muted", text: "none" })]));
}

// --- the chat panel --------------------------------------------------------------

function renderChatModels(models) {
  const select = $("chat-model");
  const names = models.filter((m) => m.task === "generate").map((m) => m.model);
  const current = [...select.options].map((o) => o.value);
  if (names.join("\n") === current.join("\n")) return; // keep the person's choice
  const chosen = select.value;
  select.replaceChildren(...names.map((n) => el("option", { value: n, text: n })));
  if (names.includes(chosen)) select.value = chosen;
}

function chatMessage(role, text) {
  const node = el("div", { class: `msg ${role}`, "data-role": role, text });
  $("chat-log").append(node);
  node.scrollIntoView({ block: "nearest" });
  return node;
}

async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of block.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        onEvent(JSON.parse(data));
      }
    }
  }
}

async function sendChat(event) {
  event.preventDefault();
  const text = $("chat-input").value.trim();
  const model = $("chat-model").value;
  if (!text || !model || chat.controller) return;
  $("chat-input").value = "";
  chat.messages.push({ role: "user", content: text });
  chatMessage("user", text);
  const answer = chatMessage("assistant", "");
  chat.controller = new AbortController();
  $("chat-send").disabled = true;
  $("chat-stop").disabled = false;
  const started = performance.now();
  let first = null, pieces = 0, usage = null;
  try {
    const response = await fetch("v1/chat/completions", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify({
        model, messages: chat.messages, stream: true, max_tokens: 512,
        stream_options: { include_usage: true },
      }),
      signal: chat.controller.signal,
    });
    if (!response.ok) throw new Error(await errorText(response));
    await readEvents(response, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message || "the stream failed");
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      const piece = delta && (delta.content || delta.reasoning_content || "");
      if (piece) {
        if (first === null) first = performance.now();
        pieces += 1;
        answer.textContent += piece;
        $("chat-stats").textContent = `${pieces} chunks`;
      }
    });
    chat.messages.push({ role: "assistant", content: answer.textContent });
    const total = (performance.now() - started) / 1000;
    const ttft = first === null ? null : (first - started) / 1000;
    const out = usage ? usage.completion_tokens : pieces;
    $("chat-stats").textContent =
      `${out} tokens · TTFT ${seconds(ttft)} · ${seconds(total)} total` +
      (usage && usage.prompt_tokens_details ? ` · ${usage.prompt_tokens_details.cached_tokens} cached` : "");
  } catch (error) {
    chat.messages.pop(); // the question is asked again with the next send
    if (error.name === "AbortError") {
      $("chat-stats").textContent = "stopped";
    } else {
      answer.className = "msg error";
      answer.textContent = error.message || String(error);
      if (/key/i.test(answer.textContent)) askForKey(answer.textContent);
    }
  } finally {
    chat.controller = null;
    $("chat-send").disabled = false;
    $("chat-stop").disabled = true;
  }
}

$("chat-form").addEventListener("submit", sendChat);
$("chat-input").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) sendChat(event);
});
$("chat-stop").addEventListener("click", () => chat.controller && chat.controller.abort());
$("chat-clear").addEventListener("click", () => {
  chat.messages = [];
  $("chat-log").replaceChildren();
  $("chat-stats").textContent = "";
});

poll();
