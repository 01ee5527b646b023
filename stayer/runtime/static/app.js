// stayer's dashboard: runs with live status and cost; a run's live events, per-step plot,
// transcript, and the buttons a person needs (approve / reject / cancel / talk).
// Every piece of run data is put on the page as text (textContent), never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { key: sessionStorage.getItem("stayer-key") || "", timer: null, stream: null };

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

async function api(path, options = {}) {
  const headers = { Authorization: `Bearer ${state.key}`, ...(options.body ? { "Content-Type": "application/json" } : {}) };
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) { signOut(); throw new Error("the API key was refused"); }
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
    throw new Error(`${response.status}: ${detail}`);
  }
  return body;
}

function show(id) {
  for (const section of ["login", "runs", "run"]) $(section).hidden = section !== id;
  $("signout").hidden = id === "login";
}

function signOut() {
  sessionStorage.removeItem("stayer-key");
  state.key = "";
  route();
}

// --- runs -------------------------------------------------------------------------------

async function loadRuns() {
  try {
    const page = await api("/v1/runs?limit=100");
    const body = $("runs-body");
    body.replaceChildren();
    for (const run of page.data) {
      const tr = el("tr");
      const link = el("a", run.id, "mono");
      link.href = `#/run/${encodeURIComponent(run.id)}`;
      const idCell = el("td");
      idCell.append(link);
      tr.append(idCell, el("td", run.task), el("td", run.model), el("td", run.status, `status ${run.status}`),
        el("td", run.steps, "num"), el("td", run.cost_usd, "num"), el("td", run.created_at.replace("T", " ").slice(0, 19)));
      body.append(tr);
    }
    $("runs-error").textContent = "";
  } catch (e) {
    $("runs-error").textContent = e.message;
  }
}

async function startRun(event) {
  event.preventDefault();
  const body = { task: $("new-task").value.trim(), model: $("new-model").value.trim() };
  if ($("new-cost").value.trim()) body.max_cost = $("new-cost").value.trim();
  if ($("new-confirm").checked) body.confirm_tools = ["bash"];
  try {
    const run = await api("/v1/runs", { method: "POST", body: JSON.stringify(body) });
    location.hash = `#/run/${encodeURIComponent(run.id)}`;
  } catch (e) {
    $("runs-error").textContent = e.message;
  }
}

// --- one run ----------------------------------------------------------------------------

const TERMINAL = new Set(["succeeded", "failed", "budget_exhausted", "cancelled", "error"]);

function renderRun(run) {
  $("run-id").textContent = run.id;
  $("run-status").textContent = run.status + (run.stop_reason && run.stop_reason !== run.status ? ` (${run.stop_reason})` : "");
  $("run-status").className = `status ${run.status}`;
  $("run-steps").textContent = run.steps;
  $("run-cost").textContent = run.cost_usd;
  $("run-task").textContent = run.task;
  $("run-model").textContent = run.model;
  $("cancel").hidden = TERMINAL.has(run.status);
  $("say").hidden = TERMINAL.has(run.status);
  const action = run.pending_action;
  $("action").hidden = !action;
  if (action) {
    $("action").dataset.callId = action.call_id;
    $("action-tool").textContent = `${action.call_id} · ${action.tool}`;
    $("action-args").textContent = JSON.stringify(action.arguments, null, 2);
    const cost = action.wait_cost || {};
    $("action-cost").textContent = cost.cache_expires_at
      ? `The prompt cache expires at ${cost.cache_expires_at}; deciding later makes the next call write ${cost.context_tokens} tokens again ($${cost.cost_if_cache_expires_usd}).`
      : "";
  }
}

function plot(steps) {
  const svg = $("plot");
  svg.replaceChildren();
  const ns = "http://www.w3.org/2000/svg";
  const W = 640, H = 220, L = 40, R = 10, T = 10, B = 24;
  const line = (x1, y1, x2, y2, cls) => {
    const l = document.createElementNS(ns, "line");
    Object.entries({ x1, y1, x2, y2 }).forEach(([k, v]) => l.setAttribute(k, v));
    l.setAttribute("class", cls);
    svg.append(l);
  };
  line(L, H - B, W - R, H - B, "axis");
  line(L, T, L, H - B, "axis");
  const label = (x, y, text, anchor) => {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", x); t.setAttribute("y", y); t.setAttribute("text-anchor", anchor || "start");
    t.textContent = text;
    svg.append(t);
  };
  if (!steps.length) { label(W / 2, H / 2, "no steps yet", "middle"); return; }
  let total = 0;
  const cost = steps.map((s) => (total += s.cost_usd === "unknown" ? 0 : Number(s.cost_usd)));
  const ctx = steps.map((s) => s.context_tokens || 0);
  const cache = steps.map((s) => s.cache_hit_ratio || 0);
  const n = steps.length;
  const x = (i) => L + (n === 1 ? (W - L - R) / 2 : (i * (W - L - R)) / (n - 1));
  const series = (values, top, colour) => {
    const max = top || Math.max(...values) || 1;
    const p = document.createElementNS(ns, "polyline");
    p.setAttribute("points", values.map((v, i) => `${x(i).toFixed(1)},${(H - B - (v / max) * (H - B - T)).toFixed(1)}`).join(" "));
    p.setAttribute("fill", "none"); p.setAttribute("stroke", colour); p.setAttribute("stroke-width", "2");
    svg.append(p);
  };
  series(cost, 0, "#2f6fed");
  series(ctx, 0, "#12b76a");
  series(cache, 1, "#f79009");
  label(L + 4, T + 8, `$${total.toFixed(4)} total`);
  label(L, H - 6, "step 1");
  label(W - R, H - 6, `step ${steps[n - 1].step}`, "end");
  label(W - R, T + 8, `${Math.max(...ctx).toLocaleString()} tokens`, "end");
}

function transcriptItem(event) {
  const d = event.data;
  let who, text, cls = "";
  if (event.event === "message") {
    who = d.role === "user" ? "person" : d.model || "model";
    cls = d.role === "user" ? "user" : "";
    const calls = (d.tool_calls || []).map((c) => `→ ${c.name} ${c.arguments}`).join("\n");
    text = [d.content, calls].filter(Boolean).join("\n");
  } else if (event.event === "tool.result") {
    who = d.name; cls = d.is_error ? "err" : ""; text = d.output + (d.truncated ? "\n…" : "");
  } else if (event.event === "requires_action") {
    who = "waiting"; text = `${d.call_id}: ${d.tool} ${JSON.stringify(d.arguments)}`;
  } else if (event.event === "run.status") {
    who = "status"; text = d.status + (d.stop_reason && d.stop_reason !== d.status ? ` (${d.stop_reason})` : "");
  } else if (event.event === "compaction" || event.event === "breaker") {
    who = event.event; text = JSON.stringify(d);
  } else {
    return null;
  }
  const li = el("li", null, cls);
  li.append(el("span", who, "who"), el("pre", text));
  return li;
}

async function follow(runId, signal) {
  const steps = [];
  const response = await fetch(`/v1/runs/${encodeURIComponent(runId)}/events`, { headers: { Authorization: `Bearer ${state.key}` }, signal });
  if (!response.ok) throw new Error(`events: ${response.status}`);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value.replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const raw = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const event = {};
      for (const line of raw.split("\n")) {
        if (!line || line.startsWith(":")) continue;
        const i = line.indexOf(":");
        event[line.slice(0, i)] = line.slice(i + 1).replace(/^ /, "");
      }
      if (!event.data) continue;
      event.data = JSON.parse(event.data);
      if (event.event === "step" && event.data.kind !== "lost_in_flight") { steps.push(event.data); plot(steps); }
      const item = transcriptItem(event);
      if (item) $("transcript").append(item);
      if (event.event === "run.status" || event.event === "step" || event.event === "requires_action") refreshRun(runId);
    }
  }
}

async function refreshRun(runId) {
  try { renderRun(await api(`/v1/runs/${encodeURIComponent(runId)}`)); $("run-error").textContent = ""; }
  catch (e) { $("run-error").textContent = e.message; }
}

async function openRun(runId) {
  show("run");
  $("transcript").replaceChildren();
  plot([]);
  await refreshRun(runId);
  state.stream = new AbortController();
  follow(runId, state.stream.signal).catch((e) => { if (e.name !== "AbortError") $("run-error").textContent = e.message; });
}

async function act(path, body) {
  const runId = $("run-id").textContent;
  try {
    renderRun(await api(`/v1/runs/${encodeURIComponent(runId)}${path}`, { method: "POST", body: body && JSON.stringify(body) }));
  } catch (e) {
    $("run-error").textContent = e.message;
  }
}

function decide(decision) {
  const message = $("action-message").value.trim() || null;
  $("action-message").value = "";
  act("/actions", { call_id: $("action").dataset.callId, decision, message });
}

async function say(event) {
  event.preventDefault();
  const text = $("say-text").value.trim();
  if (!text) return;
  $("say-text").value = "";
  try { await api(`/v1/runs/${encodeURIComponent($("run-id").textContent)}/messages`, { method: "POST", body: JSON.stringify({ content: text }) }); }
  catch (e) { $("run-error").textContent = e.message; }
}

// --- routing ------------------------------------------------------------------------------

function route() {
  clearInterval(state.timer);
  if (state.stream) { state.stream.abort(); state.stream = null; }
  if (!state.key) { show("login"); return; }
  const match = location.hash.match(/^#\/run\/(.+)$/);
  if (match) { openRun(decodeURIComponent(match[1])); return; }
  show("runs");
  loadRuns();
  state.timer = setInterval(loadRuns, 2000);
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    state.key = $("key").value.trim();
    try {
      await api("/v1/runs?limit=1");
      sessionStorage.setItem("stayer-key", state.key);
      $("login-error").textContent = "";
      route();
    } catch (e) {
      $("login-error").textContent = e.message;
    }
  });
  $("signout").addEventListener("click", signOut);
  $("new-run").addEventListener("submit", startRun);
  $("cancel").addEventListener("click", () => act("/cancel"));
  $("approve").addEventListener("click", () => decide("approve"));
  $("reject").addEventListener("click", () => decide("reject"));
  $("say").addEventListener("submit", say);
  window.addEventListener("hashchange", route);
  route();
});
