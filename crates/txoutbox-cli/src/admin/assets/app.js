// txoutbox dashboard: polls the relay's own admin API; no other origin is contacted.
"use strict";

const $ = (id) => document.getElementById(id);
const TOKEN_KEY = "txoutbox-admin-token";
const OUTBOX_KEY = "txoutbox-outbox";

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

// The relay's [[outbox]] entries, from GET /api/v1/outboxes: null until known, empty for a
// relay of one table (its calls then take no `outbox` parameter).
let outboxes = null;
// The outbox the page shows (its name), when there are named ones.
let outbox = null;

// An /api/v1 path for the outbox shown: `outbox=NAME` added when the relay runs [[outbox]]s.
function api(path) {
  if (outbox === null) return path;
  return path + (path.includes("?") ? "&" : "?") + "outbox=" + encodeURIComponent(outbox);
}

// The outbox named in the address (#outbox=NAME), if any.
function hashOutbox() {
  return new URLSearchParams(location.hash.slice(1)).get("outbox");
}

// Ask the relay which outboxes it runs. A relay of one table is asked once; with [[outbox]]
// entries on every refresh, so the picker shows which ones run. A failed call keeps what was
// known (the calls after it say what is wrong).
async function loadOutboxes() {
  let list;
  try {
    list = (await getJson("/api/v1/outboxes")).outboxes || [];
  } catch (err) {
    return;
  }
  outboxes = list.filter((o) => typeof o.name === "string");
  if (!outboxes.length) {
    outbox = null;
    $("outbox-picker").hidden = true;
    return;
  }
  if (!outboxes.some((o) => o.name === outbox)) {
    const wanted = hashOutbox() || localStorage.getItem(OUTBOX_KEY);
    const first = outbox === null;
    outbox = outboxes.some((o) => o.name === wanted) ? wanted : outboxes[0].name;
    if (!first) clearView();
    remember();
  }
  renderOutboxes();
}

// The choice, kept in the address (a reload or a shared link shows the same outbox) and in
// local storage (a new tab starts with it).
function remember() {
  localStorage.setItem(OUTBOX_KEY, outbox);
  history.replaceState(null, "", "#outbox=" + encodeURIComponent(outbox));
}

let shownOutboxes = "";

function renderOutboxes() {
  const select = $("outbox");
  const key = JSON.stringify(outboxes.map((o) => [o.name, o.running]));
  if (key !== shownOutboxes) {
    shownOutboxes = key;
    select.replaceChildren();
    for (const o of outboxes) {
      const opt = document.createElement("option");
      opt.value = o.name;
      opt.textContent = o.running ? o.name : o.name + " (not running)";
      if (!o.running) opt.className = "down";
      select.appendChild(opt);
    }
  }
  select.value = outbox;
  $("outbox-picker").hidden = false;
  const o = shownOutbox();
  if (o !== undefined && !o.running) {
    $("table").textContent = o.table;
    $("relay").textContent = o.relay_id ? "relay " + o.relay_id : "";
  }
  renderBanner();
}

// The picked outbox's entry of GET /api/v1/outboxes (undefined for a relay of one table).
function shownOutbox() {
  return outboxes ? outboxes.find((x) => x.name === outbox) : undefined;
}

// What the page knows of the relay's health, for the banner and the tiles' freshness:
// the last answer of GET /api/v1/readiness (or why it failed), why the last poll of the data
// failed (null: it worked), the reading's own stale_since, and since when the page has shown
// a stale reading.
let readiness = null;
let readinessError = null;
let pollError = null;
let serverStale = null;
let staleSince = null;
let sampledAt = null;

// One banner, on every page: the database, the broker and the last error, as /readyz checks
// them; "not running" first for an [[outbox]] whose relay does not run.
function renderBanner() {
  const b = $("readiness");
  const lines = [];
  const o = shownOutbox();
  if (o !== undefined && !o.running) {
    lines.push([["Outbox " + o.name + " is not running: " + (o.error || "not connected yet"), false]]);
  }
  if (readinessError) {
    lines.push([["The relay's admin API does not answer: " + readinessError, false]]);
  } else if (readiness) {
    lines.push([
      [readiness.ready ? "Ready" : "Not ready", readiness.ready],
      ["Database: " + readiness.database, readiness.database === "ok"],
      ["Broker: " + readiness.broker, readiness.broker === "ok"],
    ]);
    if (readiness.relay) lines.push([["Relay: " + readiness.relay, false]]);
    if (readiness.last_error) lines.push([["Last error: " + readiness.last_error, false]]);
  } else {
    lines.push([["checking readiness…", true]]);
  }
  const down = lines.some((line) => line.some(([, ok]) => !ok));
  b.className = down ? "down" : "";
  b.setAttribute("role", down ? "alert" : "status");
  b.replaceChildren();
  for (const line of lines) {
    const div = document.createElement("div");
    line.forEach(([text, ok], i) => {
      if (i > 0) {
        const sep = document.createElement("span");
        sep.className = "sep";
        sep.textContent = " · ";
        div.appendChild(sep);
      }
      const span = document.createElement("span");
      span.className = ok ? "ok" : "bad";
      span.textContent = text;
      div.appendChild(span);
    });
    if (line.length === 1 && !line[0][1]) div.className = "bad";
    b.appendChild(div);
  }
}

// The tiles show the last good reading. While a poll fails, the database's admin queries fail
// (the status says its reading is stale), or readiness says the database is down, they stay,
// marked "stale since" the first sign of it.
function renderFreshness() {
  const dbDown = readiness && !readinessError && readiness.database !== "ok";
  // Short: the banner says the rest.
  const why =
    pollError ||
    (serverStale && "the relay's database queries fail") ||
    (dbDown && "the database is down") ||
    (readinessError && "the admin API does not answer");
  const updated = $("updated");
  if (!why) {
    staleSince = null;
    $("cards").classList.remove("stale");
    updated.className = "muted";
    updated.textContent = sampledAt ? "updated " + sampledAt.toLocaleTimeString() : "";
    return;
  }
  if (staleSince === null) staleSince = serverStale ? new Date(serverStale) : new Date();
  $("cards").classList.add("stale");
  updated.className = "muted stale";
  updated.textContent = "stale since " + staleSince.toLocaleTimeString() + " (" + why + ")";
}

// Show another outbox: nothing of the last one stays on the page.
function pick(name) {
  if (name === outbox || !outboxes || !outboxes.some((o) => o.name === name)) return;
  outbox = name;
  remember();
  clearView();
  renderOutboxes();
  refresh();
}

function clearView() {
  for (const id of ["pending", "leased", "dead", "processed", "oldest", "rate-now", "latency-now"]) {
    $(id).textContent = "–";
  }
  $("dead").className = "value";
  for (const id of ["table", "relay", "updated", "message", "wal-slot"]) $(id).textContent = "";
  for (const id of ["grid", "ticks"]) $(id).replaceChildren();
  for (const id of ["rate-line", "latency-line"]) $(id).setAttribute("points", "");
  for (const id of ["relays-table", "dead-table"]) $(id).querySelector("tbody").replaceChildren();
  for (const id of ["wal", "no-relays", "no-dead"]) $(id).hidden = true;
  shownDead = "";
  readiness = readinessError = pollError = serverStale = staleSince = sampledAt = null;
  $("cards").classList.remove("stale");
  renderBanner();
}

function age(secs) {
  if (secs === null || secs === undefined) return "–";
  if (secs < 10) return secs.toFixed(1) + " s";
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
  sampledAt = s.sampled_at ? new Date(s.sampled_at) : new Date();
  serverStale = s.stale_since || null;
}

// The chart's plot area inside its 800 x 250 viewBox (index.html draws the axes there).
const PLOT = { left: 64, right: 736, top: 12, bottom: 200 };

function svg(tag, attrs, text) {
  // The chart's own namespace (SVG's), so no URL needs spelling out here.
  const el = document.createElementNS($("chart").namespaceURI, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

// A round axis maximum at or above `v`: four ticks of 1, 2 or 5 times a power of ten.
function niceMax(v) {
  if (!(v > 0)) return 4;
  const quarter = v / 4;
  const p = Math.pow(10, Math.floor(Math.log10(quarter)));
  const step = [1, 2, 5, 10].map((m) => m * p).find((s) => s >= quarter);
  return 4 * step;
}

function label(v) {
  if (v === 0) return "0";
  if (v >= 1000) return (v / 1000).toFixed(v % 1000 ? 1 : 0) + "k";
  return Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(3)));
}

const x = (t, t0, span) => PLOT.left + ((t - t0) / span) * (PLOT.right - PLOT.left);
const y = (v, max) => PLOT.bottom - (v / max) * (PLOT.bottom - PLOT.top);

function points(ts, values, t0, span, max) {
  return values.map((v, i) => x(ts[i], t0, span).toFixed(1) + "," + y(v, max).toFixed(1)).join(" ");
}

// Gridlines and tick labels: published/s on the left, latency in ms on the right, seconds or
// minutes before the last sample along the bottom.
function drawAxes(t0, span, rateMax, latMsMax) {
  const grid = $("grid");
  const ticks = $("ticks");
  grid.replaceChildren();
  ticks.replaceChildren();
  for (let i = 0; i <= 4; i++) {
    const yy = PLOT.bottom - (i / 4) * (PLOT.bottom - PLOT.top);
    grid.appendChild(svg("line", { class: "grid", x1: PLOT.left, y1: yy, x2: PLOT.right, y2: yy }));
    ticks.appendChild(svg("text", { class: "tick rate-key", x: PLOT.left - 6, y: yy + 4, "text-anchor": "end" },
      label((rateMax * i) / 4)));
    ticks.appendChild(svg("text", { class: "tick latency-key", x: PLOT.right + 6, y: yy + 4, "text-anchor": "start" },
      label((latMsMax * i) / 4)));
  }
  const step = [10, 30, 60, 120, 300, 600].find((s) => span / s <= 6) || 900;
  for (let back = 0; back <= span + 0.001; back += step) {
    const xx = x(t0 + span - back, t0, span);
    grid.appendChild(svg("line", { class: "grid", x1: xx, y1: PLOT.top, x2: xx, y2: PLOT.bottom }));
    const text = back === 0 ? "0" : step < 60 ? "-" + back + " s" : "-" + back / 60 + " min";
    ticks.appendChild(svg("text", { class: "tick", x: xx, y: PLOT.bottom + 16, "text-anchor": "middle" }, text));
  }
}

function renderHistory(h) {
  const s = h.samples || [];
  const ts = s.map((p) => p.t);
  const rate = s.map((p) => p.published_per_sec || 0);
  const latMs = s.map((p) => (p.latency_secs || 0) * 1000);
  const last = s[s.length - 1];
  const tEnd = last ? last.t : 0;
  const span = Math.max(60, s.length ? tEnd - ts[0] : 60);
  const t0 = tEnd - span;
  const rateMax = niceMax(Math.max(1, ...rate));
  const latMsMax = niceMax(Math.max(1, ...latMs));
  drawAxes(t0, span, rateMax, latMsMax);
  $("rate-line").setAttribute("points", points(ts, rate, t0, span, rateMax));
  $("latency-line").setAttribute("points", points(ts, latMs, t0, span, latMsMax));
  const ms = (v) => v.toFixed(0) + " ms";
  $("rate-now").textContent = last
    ? last.published_per_sec.toFixed(1) + " (peak " + Math.max(...rate).toFixed(1) + ")"
    : "–";
  $("latency-now").textContent =
    (last && last.latency_secs !== null ? ms(last.latency_secs * 1000) : "–") +
    (latMs.length ? " (peak " + ms(Math.max(...latMs)) + ")" : "");
}

// [0, 1, 2, 5, 7, 8] -> "0-2,5,7-8", as `txoutbox status` prints them.
function ranges(p) {
  const out = [];
  for (let i = 0; i < p.length; ) {
    let j = i;
    while (j + 1 < p.length && p[j + 1] === p[j] + 1) j++;
    out.push(i === j ? String(p[i]) : p[i] + "-" + p[j]);
    i = j + 1;
  }
  return out.join(",");
}

function renderRelays(s) {
  const relays = s.relays || [];
  const at = s.sampled_at ? Date.parse(s.sampled_at) : Date.now();
  const body = $("relays-table").querySelector("tbody");
  body.replaceChildren();
  for (const r of relays) {
    const tr = document.createElement("tr");
    tr.dataset.relay = r.relay_id;
    cell(tr, r.relay_id, "id");
    cell(tr, r.mode);
    cell(tr, r.alive ? "yes" : "no", r.alive ? "alive" : "error");
    cell(tr, age(Math.max(0, (at - Date.parse(r.heartbeat_at)) / 1000)));
    const parts = r.partitions || [];
    cell(tr, parts.length ? ranges(parts) + " (" + parts.length + ")" : "–", "partitions");
    body.appendChild(tr);
  }
  $("no-relays").hidden = relays.length > 0;
}

// 1536 -> "1.5 KiB", as `txoutbox status` prints them (in parentheses).
function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let v = n;
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return i === 0 ? n + " B" : v.toFixed(1) + " " + units[i];
}

// The WAL source's slot (PostgreSQL), shown only when it exists.
function renderSlot(s) {
  const w = s.wal_slot;
  $("wal").hidden = !w;
  if (!w) return;
  const parts = [
    "slot " + w.slot,
    w.reader_pid !== null ? "read by a relay (server pid " + w.reader_pid + ")" : "no relay reads it",
    "wal_status " + (w.wal_status || "–"),
    "confirmed " + (w.confirmed_flush_lsn || "–"),
    "lag " + (w.lag_bytes !== null ? bytes(w.lag_bytes) : "–"),
    "retained " + (w.retained_bytes != null ? bytes(w.retained_bytes) : "–"),
    "safe_wal_size " + (w.safe_wal_size !== null ? bytes(w.safe_wal_size) : "unlimited"),
  ];
  // PostgreSQL 17+ only: whether the slot survives a failover.
  if (w.failover != null) parts.push("failover " + (w.failover ? "yes" : "no"));
  if (w.synchronized_standby_slots != null) {
    parts.push("standby slots " + (w.synchronized_standby_slots || "none"));
  }
  $("wal-slot").textContent = parts.join(" · ");
}

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

let shownDead = "";

// A payload as a list carries it: its start (JSON text, or base64 of the bytes) and its
// length; the whole is GET /api/v1/dead-letters/{id} away.
function payloadText(e) {
  const more = e.payload_truncated ? "… (" + e.payload_length + " bytes)" : "";
  const start = e.content_type && e.content_type !== "application/json" ? "base64 " : "";
  return start + e.payload_preview + more;
}

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
    const payload = payloadText(e);
    const p = cell(tr, payload.length > 80 ? payload.slice(0, 79) + "…" : payload, "payload");
    p.title = payload;
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
  const r = await fetch(api("/api/v1/dead-letters/" + encodeURIComponent(id) + "/" + action), {
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

// Polls in flight: a poll is not started again before the last one ended (a database that is
// down can hold a query for the admin pool's acquire timeout).
let polling = false;
let checking = false;

async function refresh() {
  if (outboxes === null || outboxes.length) await loadOutboxes();
  checkReadiness();
  if (polling) return;
  polling = true;
  const asked = outbox;
  try {
    const [status, history, dead] = await Promise.allSettled([
      getJson(api("/api/v1/status")),
      getJson(api("/api/v1/history")),
      getJson(api("/api/v1/dead-letters?limit=50")),
    ]);
    if (asked !== outbox) return; // another outbox was picked meanwhile
    // Each part that answered is shown; the others keep what they showed.
    if (status.status === "fulfilled") {
      renderStatus(status.value);
      renderRelays(status.value);
      renderSlot(status.value);
    }
    if (history.status === "fulfilled") renderHistory(history.value);
    if (dead.status === "fulfilled") renderDead(dead.value);
    const failed = [status, history, dead].find((r) => r.status === "rejected");
    pollError = failed ? "refresh failed: " + failed.reason.message : null;
    renderFreshness();
  } finally {
    polling = false;
  }
}

// Readiness on its own: it answers within the probes' timeout even while queries hang.
async function checkReadiness() {
  if (checking) return;
  checking = true;
  const asked = outbox;
  try {
    const r = await getJson(api("/api/v1/readiness"));
    if (asked !== outbox) return;
    readiness = r;
    readinessError = null;
  } catch (err) {
    if (asked !== outbox) return;
    readinessError = err.message;
  } finally {
    checking = false;
  }
  renderBanner();
  renderFreshness();
}

document.addEventListener("DOMContentLoaded", () => {
  $("token").value = token();
  $("token-save").addEventListener("click", () => {
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    say("Token set for this tab.", false);
    refresh();
  });
  $("outbox").addEventListener("change", () => pick($("outbox").value));
  window.addEventListener("hashchange", () => pick(hashOutbox()));
  refresh();
  setInterval(refresh, 2000);
});
