// txoutbox dashboard: polls the relay's own admin API; no other origin is contacted.
"use strict";

const $ = (id) => document.getElementById(id);
const TOKEN_KEY = "txoutbox-admin-token";

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

function say(text, isError) {
  const m = $("message");
  m.textContent = text;
  m.className = isError ? "error" : "";
}

async function getJson(path) {
  const headers = token() ? { Authorization: "Bearer " + token() } : {};
  const r = await fetch(path, { headers });
  if (!r.ok) throw new Error(path + ": " + r.status);
  return r.json();
}

function age(secs) {
  if (secs === null || secs === undefined) return "–";
  if (secs < 60) return secs.toFixed(0) + " s";
  if (secs < 3600) return (secs / 60).toFixed(1) + " min";
  return (secs / 3600).toFixed(1) + " h";
}

function renderStatus(s) {
  $("pending").textContent = s.pending;
  $("leased").textContent = s.leased;
  $("dead").textContent = s.dead;
  $("dead").className = "value" + (s.dead > 0 ? " alert" : "");
  $("processed").textContent = s.processed;
  $("oldest").textContent = age(s.oldest_pending_age_secs);
  $("table").textContent = s.table;
  $("relay").textContent = s.relay_id ? "relay " + s.relay_id : "";
  // The counts are the relay's last reading (every --metrics-interval), not this poll's.
  const at = s.sampled_at ? new Date(s.sampled_at) : new Date();
  $("updated").textContent = "updated " + at.toLocaleTimeString();
}

function points(values, max) {
  const n = values.length;
  if (n === 0) return "";
  const step = n > 1 ? 600 / (n - 1) : 0;
  return values
    .map((v, i) => (i * step).toFixed(1) + "," + (135 - (max > 0 ? (v / max) * 125 : 0)).toFixed(1))
    .join(" ");
}

function renderHistory(h) {
  const s = h.samples || [];
  const rate = s.map((x) => x.published_per_sec || 0);
  const lat = s.map((x) => x.latency_secs || 0);
  $("rate-line").setAttribute("points", points(rate, Math.max(1, ...rate)));
  $("latency-line").setAttribute("points", points(lat, Math.max(0.001, ...lat)));
  const last = s[s.length - 1];
  const ms = (secs) => (secs * 1000).toFixed(0) + " ms";
  $("rate-now").textContent = last
    ? last.published_per_sec.toFixed(1) + " (peak " + Math.max(...rate).toFixed(1) + ")"
    : "–";
  $("latency-now").textContent =
    (last && last.latency_secs !== null ? ms(last.latency_secs) : "–") +
    (lat.length ? " (peak " + ms(Math.max(...lat)) + ")" : "");
}

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

let shownDead = "";

function renderDead(page) {
  // Rebuild only on change: a row replaced under the pointer would swallow a click.
  const key = JSON.stringify(page.events.map((e) => [e.id, e.attempts, e.last_error]));
  if (key === shownDead) return;
  shownDead = key;
  const body = $("dead-table").querySelector("tbody");
  body.replaceChildren();
  for (const e of page.events) {
    const tr = document.createElement("tr");
    tr.dataset.id = e.id;
    cell(tr, e.seq);
    cell(tr, e.id, "id");
    cell(tr, e.event_type);
    cell(tr, e.aggregate_type + "/" + e.aggregate_id);
    cell(tr, e.attempts);
    cell(tr, e.dead_at ? new Date(e.dead_at).toLocaleString() : "");
    cell(tr, e.last_error || "", "error");
    const td = cell(tr, "");
    for (const [action, label] of [["retry", "Retry"], ["discard", "Discard"]]) {
      const b = document.createElement("button");
      b.type = "button";
      b.className = action;
      b.textContent = label;
      b.dataset.id = e.id;
      b.addEventListener("click", () => act(action, e.id));
      td.appendChild(b);
    }
    body.appendChild(tr);
  }
  $("no-dead").hidden = page.events.length > 0;
}

async function act(action, id) {
  if (action === "discard" && !confirm("Delete dead letter " + id + " for good?")) return;
  const r = await fetch("/api/v1/dead-letters/" + encodeURIComponent(id) + "/" + action, {
    method: "POST",
    headers: token() ? { Authorization: "Bearer " + token() } : {},
  });
  const body = await r.json().catch(() => ({}));
  if (r.ok) {
    say(action === "retry" ? "Put back in line: " + id : "Discarded: " + id, false);
  } else {
    say(action + " failed: " + (body.error || r.status), true);
  }
  refresh();
}

async function refresh() {
  try {
    const [status, history, dead] = await Promise.all([
      getJson("/api/v1/status"),
      getJson("/api/v1/history"),
      getJson("/api/v1/dead-letters?limit=50"),
    ]);
    renderStatus(status);
    renderHistory(history);
    renderDead(dead);
  } catch (err) {
    $("updated").textContent = "refresh failed: " + err.message;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("token").value = token();
  $("token-save").addEventListener("click", () => {
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    say("Token set for this tab.", false);
    refresh();
  });
  refresh();
  setInterval(refresh, 2000);
});
