// Operator console: plain JS, no build step, no CDN. Every text goes in with
// textContent (never innerHTML): notes and reasons are typed by people.
"use strict";

const STATE_TEXT = {
  active_unacknowledged: "Unacknowledged",
  active_acknowledged: "Acknowledged",
  returned_unacknowledged: "Returned – ack needed",
  shelved: "Shelved",
  suppressed: "Suppressed",
  out_of_service: "Out of service",
  normal: "Normal",
};
const RULE_TEXT = {
  slug: "slug", high: "high", low: "low", stale: "no fresh data", comm_loss: "communication lost",
  meter: "meter check", outbox: "outbox", frozen: "reading frozen (stuck instrument?)",
};
const $ = (sel) => document.querySelector(sel);
let sensors = [];
let alarms = [];
let writesEnabled = false;
let shelveTarget = null;
let shelveKey = null;
let clockSkew = 0; // browser time minus the daemon's clock (replay runs on data time)

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined && v !== false) node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function fmtNum(x) {
  if (x === null || x === undefined) return "—";
  const a = Math.abs(x);
  const digits = a >= 1000 ? 0 : a >= 100 ? 1 : a >= 1 ? 2 : 3;
  // -0.0, or a value that rounds to 0 at the digits shown, read "-0": a reading below zero
  const shown = Math.round(x * 10 ** digits) === 0 ? 0 : x;
  return shown.toLocaleString(undefined, { maximumFractionDigits: digits });
}
function fmtTime(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  const today = new Date(Date.now() - clockSkew).toDateString() === d.toDateString();
  return today ? d.toLocaleTimeString() : d.toLocaleString();
}
function ago(iso) {
  if (!iso) return "";
  const s = Math.max(0, (Date.now() - clockSkew - new Date(iso).getTime()) / 1000);
  if (s < 90) return `${Math.round(s)} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  if (s < 172800) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}
// A timer rule's limit is a time in seconds (frozen_after, stale_after), not a reading:
// "7.2 (limit 21,600)" read as a pH threshold.
const TIMER_LIMIT = { frozen: "unchanged for longer than", stale: "no reading for longer than" };
function lasting(s) {
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${Math.round(s / 360) / 10} h`;
  return `${Math.round(s / 8640) / 10} days`;
}
function limitText(a) {
  const timer = TIMER_LIMIT[a.rule];
  return timer ? `${timer} ${lasting(a.limit)}` : `limit ${fmtNum(a.limit)}`;
}
// What an alarm's value and limit are when they are not a reading and its threshold, as
// monitor/alarms/figures.py says them on a page: a comm loss paged "3 gpm (limit 3)" for
// three failed polls. null: a reading, shown with the sensor's unit.
function counted(n, one, many) { return `${fmtNum(n)} ${n === 1 ? one : many}`; }
function mib(b) { return `${fmtNum(Math.round(b / 1048576))} MiB`; }
// The rules whose value is a reading in the sensor's unit (figures.py's READING_RULES): any
// other rule is worded in figuresText, and one not worded (added later) gets bare numbers.
const READING_RULES = new Set(["slug", "high", "low", "high_level", "overflow", "fail_to_start", "frozen", "stale"]);
function figuresText(a) {
  const v = a.value, lim = a.limit, has = (x) => x !== null && x !== undefined;
  const and = (first, then) => (has(lim) ? `${first} (${then})` : first);
  switch (a.rule) {
    case "comm_loss":
      if (a.message.startsWith("modbus device")) return and(counted(v, "failed poll", "failed polls"), `alarm after ${fmtNum(lim)}`);
      if (a.message.startsWith("MQTT broker")) return and(`no broker for ${lasting(v)}`, `alarm after ${lasting(lim)}`);
      return and(fmtNum(v), `limit ${fmtNum(lim)}`);
    case "long_run": return and(`running for ${lasting(v * 3600)}`, `max_run ${lasting(lim * 3600)}`);
    case "pump_starts": return and(`${counted(v, "start", "starts")} in the last hour`, `at most ${fmtNum(lim)}`);
    case "disk_low": case "disk_full": return and(`${mib(v)} free`, `floor ${mib(lim)}`);
    case "outbox": return and(`${counted(v, "point", "points")} dropped`, `cap ${fmtNum(lim)} bytes`);
    case "clock": return and(`stepped ${v < 0 ? "back" : "forward"} by ${lasting(Math.abs(v))}`, `tolerance ${lasting(lim)}`);
    case "notify": return counted(v, "failed attempt", "failed attempts");
    case "bad_value": return `last bad reading ${fmtNum(v)}`;
    case "state": case "incidents": return "";
    case "meter": return and(`register reading ${fmtNum(v)}`, `at most ${fmtNum(lim)}${unitOf(a.sensor) ? " " + unitOf(a.sensor) : ""} could pass`);
    default: return READING_RULES.has(a.rule) ? null : and(fmtNum(v), `limit ${fmtNum(lim)}`);
  }
}
// An alarm with no value: a stale sensor that never read, an overflow with the level not
// read (the float switch decided), as the page says them; the rest show nothing.
function notRead(a, unit) {
  const has = a.limit !== null && a.limit !== undefined;
  if (a.rule === "stale" && has) return `${TIMER_LIMIT.stale} ${lasting(a.limit)}`;
  if (a.rule === "overflow") return has ? `level not read (overflow at ${fmtNum(a.limit)}${unit ? " " + unit : ""})` : "level not read";
  return "";
}
function unitOf(sensorId) {
  const s = sensors.find((x) => x.id === sensorId);
  return s && s.unit !== "pH" ? s.unit : "";
}
function toast(text) {
  const t = $("#toast");
  t.textContent = text;
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, 6000);
}

async function getJSON(url) {
  const r = await fetch(url, { cache: "no-store" });
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.json();
}

// Every write (alarm actions, an incident's notes and closing) goes one way: the name and
// token under Operator, kept in this browser; `by` is the name.
function operator() {
  const name = $("#op-name").value.trim();
  const token = $("#op-token").value;
  if (name && token) return { name, token };
  toast("Enter your name and the console token under Operator first.");
  $("#op-name").focus();
  return null;
}

// the attributes of a write button: disabled, and saying why, where no token is configured
function writeButton() {
  return writesEnabled ? {} : { disabled: true, title: "writes disabled: no console token configured" };
}

// A request id for one write (the Idempotency-Key header), made when its dialog opens or its
// button is pressed and sent again with every retry of that write: the gateway records it
// once and answers a repeat with its first answer. getRandomValues, not randomUUID: that one
// needs a secure context, and the console is plain http on the gateway's address.
function requestId() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

const LOST = "No answer from the gateway, twice: it may or may not be recorded."
  + " Saving again is safe: the gateway records this write once.";
const KEY_REUSED = "Not done: an earlier save of this form may be recorded already, with other words"
  + " (look at the panel). Saving again records this as a new entry.";

// { problem: null when done, else the refusal in plain words; retried: the first answer was
// lost and the retry was answered; reused: the gateway had this request id for another write
// (a draft edited after a lost answer): the form needs a new one }.
async function post(url, body, key) {
  const op = operator();
  if (!op) return { problem: "Not done: enter your name and the console token under Operator first." };
  const send = () => fetch(url, {
    method: "POST",
    headers: {
      "Content-Type": "application/json", Authorization: `Bearer ${op.token}`, "Idempotency-Key": key,
    },
    body: JSON.stringify({ by: op.name, ...body }),
  });
  let r;
  let retried = false;
  try {
    r = await send();
  } catch (e) {
    // the request may have reached the gateway and its answer been lost (Wi-Fi dropped after
    // the commit): the same write once more with the same id, which the gateway does not
    // record twice
    retried = true;
    try {
      r = await send();
    } catch (e2) {
      return { problem: LOST, retried };
    }
  }
  if (r.ok) return { problem: null, retried };
  if (r.status === 422 && await keyReused(r.clone())) return { problem: KEY_REUSED, retried, reused: true };
  return { problem: await refusal(r), retried };
}

async function keyReused(r) {
  try { return String((await r.json()).detail).startsWith("this Idempotency-Key"); } catch (e) { return false; }
}

// what the operator is told when a write's first answer was lost and the retry confirmed it
function confirmedAfterRetry(what) {
  return `${what}: confirmed by the gateway after its first answer was lost (recorded once).`;
}

// What a refused field is called on the forms (FastAPI's 422 names the body's key).
const FIELD_TEXT = {
  by: "your name (under Operator)", text: "the note", reason: "the reason", due: "the time limit",
  kind: "the kind", note: "the note", minutes: "the duration", until: "the end time",
};

function fieldProblem(d) {
  const key = (d.loc || []).find((x) => x !== "body");
  const what = Object.hasOwn(FIELD_TEXT, key) ? FIELD_TEXT[key] : key === undefined ? "the request" : String(key);
  const ctx = d.ctx || {};
  if (d.type === "string_too_long") return `${what} is too long (at most ${ctx.max_length} characters)`;
  if (d.type === "string_too_short") return `${what} is empty`;
  if (d.type === "missing") return `${what} is missing`;
  if (d.type === "string_unicode") return `${what} holds a broken character`;  // an unpaired surrogate
  return `${what}: ${String(d.msg || "not accepted").replace(/^Value error, /, "")}`;
}

async function refusal(r) {
  let detail = null;
  try { detail = (await r.json()).detail; } catch (e) { /* not JSON: the status says it */ }
  let words;
  if (Array.isArray(detail)) {
    // FastAPI's 422: one item per refused field (a union of types: one per type; say it once)
    words = [...new Set(detail.map(fieldProblem))].join("; ");
  } else {
    words = typeof detail === "string" && detail ? detail : `the gateway answered HTTP ${r.status}`;
  }
  const hint = r.status === 401 ? " Check the console token under Operator." : "";
  return `Not done: ${words.replace(/\.$/, "")}.${hint}`;
}

const ACTION_TEXT = { ack: "Acknowledged", shelve: "Shelved", unshelve: "Unshelved", return: "Returned to service" };

// `key`: the write's request id (a shelve's is made when its dialog opens); one per click else
async function act(alarm, action, body, key = requestId()) {
  if (!operator()) return;
  const url = `/api/alarms/${encodeURIComponent(alarm.sensor)}/${alarm.rule}/${action}`;
  const { problem, retried } = await post(url, body, key);
  if (problem) toast(problem);
  else if (retried) toast(confirmedAfterRetry(`${ACTION_TEXT[action]} ${alarm.sensor} ${RULE_TEXT[alarm.rule] || alarm.rule}`));
  else $("#toast").hidden = true;
  await refreshAlarms();
}

function renderAlarms() {
  const box = $("#alarms");
  box.replaceChildren();
  const waiting = alarms.filter((a) => a.state === "active_unacknowledged" || a.state === "returned_unacknowledged");
  const summary = $("#summary");
  const acked = alarms.filter((a) => a.state === "active_acknowledged").length;
  const hidden = alarms.filter((a) => ["shelved", "suppressed", "out_of_service"].includes(a.state)).length;
  const tail = hidden ? ` · ${hidden} SHELVED/OOS` : "";
  if (waiting.length) {
    summary.className = "summary sum-alarm";
    summary.textContent = `${waiting.length} UNACKNOWLEDGED${tail}`;
  } else if (acked) {
    summary.className = "summary sum-acked";
    summary.textContent = `${acked} ACTIVE, ACKNOWLEDGED${tail}`;
  } else {
    summary.className = "summary sum-ok";
    summary.textContent = `NO ACTIVE ALARMS${tail}`;
  }
  if (!alarms.length) {
    box.append(el("div", { class: "none" }, "No alarms. All sensors within limits."));
    return;
  }
  for (const a of alarms) box.append(alarmCard(a));
}

function alarmCard(a) {
  const unit = unitOf(a.sensor);
  // the name an operator knows the sensor by (the config's `name`), its id beside it
  const known = sensors.find((x) => x.id === a.sensor);
  const label = known && known.name ? known.name : a.sensor;
  const other = a.value === null ? notRead(a, unit) : figuresText(a);
  const reading = other !== null ? other :
    `${fmtNum(a.value)}${unit ? " " + unit : ""}` + (a.limit !== null ? ` (${limitText(a)})` : "");
  const meta = [];
  if (a.activated_at) meta.push(`since ${fmtTime(a.activated_at)} (${ago(a.activated_at)})`);
  if (!a.active && a.cleared_at) meta.push(`cleared ${fmtTime(a.cleared_at)}`);
  // what an operator typed (name, note, reason) isolated (<bdi>), as on incident notes: a
  // name ending in U+202E mirrored the rest of the line after it
  if (a.acked_by) meta.push(["acknowledged by ", el("bdi", {}, a.acked_by),
    a.ack_note ? [": “", el("bdi", {}, a.ack_note), "”"] : null]);
  if (a.shelved_until) meta.push(["shelved by ", el("bdi", {}, a.shelved_by),
    ` until ${fmtTime(a.shelved_until)}: `, el("bdi", {}, a.shelve_reason || "")]);
  const buttons = [];
  const can = writeButton();
  if (a.state === "active_unacknowledged" || a.state === "returned_unacknowledged") {
    buttons.push(el("button", { class: "ack", ...can, onclick: () => act(a, "ack", {}) }, "Acknowledge"));
  }
  if (a.state === "shelved") {
    buttons.push(el("button", { ...can, onclick: () => act(a, "unshelve", {}) }, "Unshelve"));
  } else if (a.state === "out_of_service") {
    buttons.push(el("button", { ...can, onclick: () => act(a, "return", {}) }, "Return to service"));
  } else {
    buttons.push(el("button", { ...can, onclick: () => openShelve(a) }, "Shelve"));
  }
  return el("article", { class: `alarm ${a.state}`, "data-key": `${a.sensor}/${a.rule}` },
    el("div", { class: "head" },
      el("span", { class: `badge prio-${a.priority}` }, a.priority),
      el("span", { class: "what", title: a.sensor }, `${label} ${RULE_TEXT[a.rule] || a.rule}`),
      label !== a.sensor ? el("span", { class: "sensor-id" }, a.sensor) : null,
      el("span", { class: "state" }, STATE_TEXT[a.state] || a.state),
      a.chattering ? el("span", { class: "badge chatter" }, "chattering") : null),
    el("div", { class: "citation" }, a.citation),
    reading ? el("div", { class: "reading" }, reading) : null,
    a.message ? el("div", { class: "meta" }, a.message) : null,
    el("div", { class: "meta" }, meta.flatMap((m, i) => (i ? [" · ", m] : [m]))),
    el("div", { class: "actions" }, buttons));
}

function openShelve(a) {
  shelveTarget = a;
  shelveKey = requestId();
  $("#shelve-title").textContent = `Shelve ${a.sensor} ${RULE_TEXT[a.rule] || a.rule}`;
  $("#shelve-reason").value = "";
  $("#shelve-dialog").showModal();
}

function sparkline(points, baseline) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", "0 0 100 30");
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("aria-label", "last 24 h");
  if (!points || points.length < 2) return svg;
  const t0 = new Date(points[0][0]).getTime();
  const t1 = new Date(points[points.length - 1][0]).getTime();
  const vs = points.map((p) => p[1]).concat(baseline === null ? [] : [baseline]);
  let lo = Math.min(...vs), hi = Math.max(...vs);
  if (hi - lo < 1e-9) { lo -= 1; hi += 1; }
  const x = (t) => ((t - t0) / Math.max(1, t1 - t0)) * 100;
  const y = (v) => 28 - ((v - lo) / (hi - lo)) * 26;
  if (baseline !== null) {
    const line = document.createElementNS(svg.namespaceURI, "line");
    line.setAttribute("class", "base");
    line.setAttribute("x1", "0"); line.setAttribute("x2", "100");
    line.setAttribute("y1", y(baseline).toFixed(2)); line.setAttribute("y2", y(baseline).toFixed(2));
    svg.append(line);
  }
  const poly = document.createElementNS(svg.namespaceURI, "polyline");
  poly.setAttribute("points", points.map((p) => `${x(new Date(p[0]).getTime()).toFixed(2)},${y(p[1]).toFixed(2)}`).join(" "));
  svg.append(poly);
  return svg;
}

const series = {};
async function refreshSeries() {
  await Promise.all(sensors.map(async (s) => {
    try { series[s.id] = (await getJSON(`/api/sensors/${encodeURIComponent(s.id)}/series?hours=24&points=144`)).points; }
    catch (e) { /* keep the last sparkline */ }
  }));
  renderSensors();
}

function renderSensors() {
  const box = $("#sensors");
  box.replaceChildren();
  const alarmed = new Set(alarms.filter((a) => a.active).map((a) => a.sensor));
  for (const s of sensors) {
    const unit = s.unit === "pH" ? "pH" : s.unit;
    box.append(el("div", { class: `sensor q-${s.quality}${alarmed.has(s.id) ? " alarmed" : ""}`, "data-sensor": s.id },
      el("div", { class: "name", title: s.id }, s.name || s.id),
      el("div", {}, el("span", { class: "value" }, fmtNum(s.value)), el("span", { class: "unit" }, unit)),
      el("div", { class: "sub" },
        el("span", { class: `q ${s.quality}` }, s.quality.replace("_", " ")),
        el("span", {}, (s.baseline === null ? "no baseline yet" : `24 h avg ${fmtNum(s.baseline)}`)
          + (s.slug === "not_judged" ? " · slug not judged (baseline below floor)" : ""))),
      sparkline(series[s.id], s.baseline),
      el("div", { class: "sub" }, el("span", {}, s.id), el("span", {}, ago(s.time)))));
  }
}

// The gateway panel, problem first: the daemon's `attention` list (faults, then what was
// lost or is not judged), one line per source, then every counter under "All counters".
function sourceLine(src) {
  if (!src.connected) return `NOT CONNECTED${src.error ? ": " + src.error : ""}`;
  const bits = ["connected"];
  if (src.last_poll) bits.push(`polled ${ago(src.last_poll)}`);
  if (src.latency_ms !== undefined && src.latency_ms !== null) bits.push(`${fmtNum(src.latency_ms)} ms`);
  if (src.requests !== undefined) bits.push(`${fmtNum(src.requests)} requests, ${fmtNum(src.errors || 0)} errors`);
  if (src.received !== undefined) bits.push(`${fmtNum(src.received)} messages, ${fmtNum(src.bad_payloads || 0)} bad`);
  return bits.join(" · ");
}

function outboxLine(o) {
  if (!o || !o.configured) return "not configured";
  const mb = (b) => (b / 1048576).toFixed(1);
  const bits = [`${fmtNum(o.pending || 0)} points waiting (${mb(o.pending_bytes || 0)} of ${mb(o.max_bytes || 0)} MB)`];
  if (o.pending && o.oldest_queued) bits.push(`oldest ${ago(new Date(o.oldest_queued * 1000).toISOString())}`);
  bits.push(`${fmtNum(o.written || 0)} written`);
  return bits.join(" · ");
}

function renderHealth(h) {
  h = h || {};
  const notes = Array.isArray(h.attention) ? h.attention : [];
  const head = notes.length
    ? el("ul", { class: "attention" }, ...notes.map((n) => el("li", { class: `att-${n.level}` }, n.text)))
    : el("div", { class: "att-ok" }, "All parts working.");
  const dl = el("dl", { class: "parts" });
  const add = (k, v, cls) => dl.append(el("dt", {}, k), el("dd", cls ? { class: cls } : {}, v));
  for (const src of Array.isArray(h.sources) ? h.sources : []) {
    add(`${src.source || "source"} ${src.name || src.id || ""}`.trim(), sourceLine(src), src.connected ? "" : "bad");
  }
  if (h.outbox) add("InfluxDB outbox", outboxLine(h.outbox));
  const all = el("dl");
  for (const [k, v] of Object.entries(h)) {
    if (k === "attention") continue;
    const text = k === "sources" && Array.isArray(v)
      ? v.map((src) => Object.entries(src).map(([kk, vv]) => `${kk.replace(/_/g, " ")}: ${vv}`).join(" · ")).join(" | ")
      : v !== null && typeof v === "object"
        ? Object.entries(v).map(([kk, vv]) => `${kk.replace(/_/g, " ")}: ${typeof vv === "object" ? JSON.stringify(vv) : vv}`).join(" · ") || "none"
        : String(v);
    all.append(el("dt", {}, k.replace(/_/g, " ")), el("dd", {}, text));
  }
  const details = el("details", { class: "counters" }, el("summary", {}, "All counters"), all);
  const open = $("#health details.counters");
  if (open && open.open) details.open = true;  // a refresh keeps it open while it is read
  $("#health").replaceChildren(head, dl, details);
}

async function refreshJournal() {
  const rows = await getJSON("/api/journal?limit=50");
  const body = $("#journal tbody");
  body.replaceChildren(...rows.map((e) => el("tr", {},
    el("td", {}, fmtTime(e.time)),
    el("td", {}, `${e.sensor}/${e.rule}`),
    el("td", {}, e.event.replace(/_/g, " ")),
    el("td", {}, e.actor || ""),
    el("td", {}, e.note || ""))));
}

// Incidents (issue 16): both panels, on the same triggers (alarm events, the minute timer).
async function refreshIncidents() {
  await Promise.all([refreshOverdue(), refreshIncidentList()]);
}

// What the Superintendent owes is overdue; hidden when nothing is.
async function refreshOverdue() {
  let items;
  try { items = await getJSON("/api/incidents/overdue"); } catch (e) { return; }  // no incident store here
  const list = $("#incidents-overdue");
  // the incident's "evidence incomplete from T: reason" mark: el() puts it in as text (a
  // reason is an error message, which may quote what was in a damaged block)
  list.replaceChildren(...items.map((d) => el("li", { "data-incident": d.incident },
    el("strong", {}, d.what), ` for ${d.incident}: due ${d.due_local}`,
    d.evidence_incomplete ? el("span", { class: "evidence-incomplete" }, d.evidence_incomplete) : null)));
  $("#incidents-section").hidden = items.length === 0;
}

// The Incidents panel: every incident open or ended but not closed, newest first, each with
// what is owed next and its "evidence incomplete" mark. Hidden where the gateway keeps no
// incident store (no /api/incidents); "No open incidents." where it does and none is.
const INCIDENTS_SHOWN = 20;
let openIncidents = null;  // null until the store answered

async function refreshIncidentList() {
  let found;
  try {
    // open first, then ended: one that ends in between is in both, kept once (the ended one)
    const open = await getJSON("/api/incidents?status=open");
    const ended = await getJSON("/api/incidents?status=ended");
    found = new Map([...open, ...ended].map((i) => [i.id, i]));
  } catch (e) { return; }  // no incident store here, or not now: keep what is shown
  openIncidents = [...found.values()].sort((a, b) =>
    Date.parse(b.start) - Date.parse(a.start) || (a.id < b.id ? 1 : -1));
  renderIncidentList();
}

function renderIncidentList() {
  if (openIncidents === null) return;
  const shown = openIncidents.slice(0, INCIDENTS_SHOWN);
  const rest = openIncidents.length - shown.length;
  $("#incidents-open").replaceChildren(...shown.map(incidentItem));
  $("#incidents-none").hidden = openIncidents.length > 0;
  const more = $("#incidents-more");
  more.textContent = `${rest} more: monitor incidents list`;
  more.hidden = rest <= 0;
  $("#open-incidents-section").hidden = false;
}

function incidentItem(i) {
  const known = sensors.find((x) => x.id === i.sensor);
  const label = known && known.name ? known.name : i.sensor;
  const unit = i.unit && i.unit !== "pH" ? ` ${i.unit}` : "";
  const when = i.status === "open" ? `since ${i.start_local}` : `${i.start_local} to ${i.end_local}`;
  const figures = [when];
  if (i.peak_value !== null && i.peak_value !== undefined) figures.push(`peak ${fmtNum(i.peak_value)}${unit}`);
  // a slug is judged against the 24 h average (§139-11), a limit against its threshold
  if (i.rule === "slug") {
    if (i.peak_multiple !== null && i.peak_multiple !== undefined) figures.push(`${fmtNum(i.peak_multiple)} × baseline`);
  } else if (i.threshold !== null && i.threshold !== undefined) {
    figures.push(`limit ${fmtNum(i.threshold)}${unit}`);
  }
  const next = nextOwed(i);
  const mark = i.evidence && i.evidence.incomplete;
  // every text (the mark's reason quotes an error message) goes in as text through el()
  return el("li", { class: `incident ${i.status}`, "data-incident": i.id },
    el("div", { class: "head" },
      el("span", { class: "what", title: i.sensor }, `${label} ${RULE_TEXT[i.rule] || i.rule}`),
      label !== i.sensor ? el("span", { class: "sensor-id" }, i.sensor) : null,
      el("span", { class: "status" }, i.status === "open" ? "open" : "ended, not closed")),
    mark ? el("div", { class: "evidence-incomplete" }, mark) : null,
    el("div", { class: "citation" }, i.citation),
    el("div", { class: "meta" }, figures.join(" · ")),
    owedLine(next, "div"),
    (i.notes || []).length ? el("div", { class: "notes" }, ...i.notes.map(noteLine)) : null,
    el("div", { class: "actions" },
      el("button", { ...writeButton(), onclick: () => openNote(i) }, "Add note"),
      el("button", { ...writeButton(), onclick: () => openClose(i) }, "Close")));
}

function owedLine(next, tag) {
  return next
    ? el(tag, { class: next.overdue ? "owed overdue" : "owed" },
      `Next: ${next.what}, due ${next.due_local}${next.overdue ? ": OVERDUE" : ""}`)
    : el(tag, { class: "owed" }, "Nothing owed: the case waits to be closed");
}

function nextOwed(i) {
  return (i.due || []).slice().sort((a, b) => Date.parse(a.due) - Date.parse(b.due))[0];
}

const NOTE_KIND_TEXT = { statement: "written statement received", notice: "notice of violation served" };

// who and when, then what they wrote: the name and the text are a person's, so they go in as
// text, each isolated (<bdi>): a name ending in U+202E mirrored the rest of the line after it
function noteLine(n) {
  // a notice says the time limit recorded from the date typed, also once nothing is owed on it
  const limit = n.due ? `time limit ${n.due_local || fmtTime(n.due)}` : null;
  const about = [NOTE_KIND_TEXT[n.kind], limit].filter(Boolean).join(", ");
  return el("p", { class: `note kind-${n.kind}` },
    el("span", { class: "note-head" }, `${n.time_local || fmtTime(n.time)}, `, el("bdi", {}, n.by),
      `${about ? ` (${about})` : ""}: `),
    el("bdi", { class: "note-text" }, n.text));
}

// The incident dialogs. A refused write keeps the dialog open with the server's words and
// keeps what was typed for that incident until it is saved (fix the token, open it again).
let noteTarget = null;
let closeTarget = null;
// each draft's request id: kept with the draft (a save again after a lost answer is the same
// write), new with a new draft
let noteKey = null;
let closeKey = null;

function incidentLabel(i) {
  const known = sensors.find((x) => x.id === i.sensor);
  return `${known && known.name ? known.name : i.sensor} ${RULE_TEXT[i.rule] || i.rule}`;
}

function showError(box, words) {
  box.textContent = words || "";
  box.hidden = !words;
}

function openNote(i) {
  const op = operator();
  if (!op) return;
  if (noteTarget !== i.id || !noteKey) {
    $("#note-form").reset();
    showNoteDue();
    noteKey = requestId();
  }
  noteTarget = i.id;
  $("#note-title").textContent = `Note on ${incidentLabel(i)}`;
  $("#note-for").textContent = `${i.start_local} · ${i.id} · by ${op.name}`;
  showError($("#note-error"), null);
  $("#note-dialog").showModal();
  $("#note-text").focus();
}

function showNoteDue() {
  const notice = $("#note-kind").value === "notice";
  $("#note-due-label").hidden = !notice;
  $("#note-due").required = notice;
}

function openClose(i) {
  const op = operator();
  if (!op) return;
  if (closeTarget !== i.id || !closeKey) {
    $("#close-form").reset();
    closeKey = requestId();
  }
  closeTarget = i.id;
  $("#close-title").textContent = `Close the case: ${incidentLabel(i)}`;
  $("#close-for").textContent = `${i.start_local} · ${i.id} · by ${op.name}`;
  const next = nextOwed(i);
  // closing does not wait for what is owed; the dialog says what still is, so nobody closes unawares
  const owed = next ? owedLine(next, "p") : el("p", { hidden: true });
  owed.id = "close-owed";
  $("#close-owed").replaceWith(owed);
  showError($("#close-error"), null);
  $("#close-dialog").showModal();
  $("#close-reason").focus();
}

// The answer goes to the dialog it was sent from only while that still shows its incident
// (`still`): Esc closes a dialog while a slow gateway answers, and it may be opened for another
// incident before the answer comes. Else a refusal is a toast naming its case; a success
// leaves the other incident's dialog and draft alone (it closed that dialog and said "Case
// closed." over it). `key`: the draft's request id; `renew` gives the draft a new one. Returns
// post's answer.
async function submitIncident(dialog, url, body, key, errorBox, target, still, done, renew) {
  const ok = dialog.querySelector("button.primary");
  ok.disabled = true;  // one click, one record
  let answer;
  try {
    answer = await post(url, body, key);
    const problem = answer.problem;
    if (answer.reused && still()) renew();
    if (still() && dialog.open) showError(errorBox, problem);
    else if (problem) toast(`${caseLabel(target)}: ${problem}`);
    if (!problem && still()) { done(); dialog.close(); }
  } finally {
    ok.disabled = false;
  }
  await refreshIncidents();
  return answer;
}

// an incident's label by its id, from the panel as it was when its dialog was opened
function caseLabel(id) {
  const i = (openIncidents || []).find((x) => x.id === id);
  return i ? incidentLabel(i) : id;
}

async function refreshAlarms() {
  try {
    alarms = await getJSON("/api/alarms");
    renderAlarms();
    renderSensors();
    await refreshJournal();
    await refreshIncidents();
  } catch (e) { toast(String(e)); }
}

function connect() {
  const live = $("#live");
  const es = new EventSource("/api/events");
  es.addEventListener("open", () => { live.className = "live on"; live.textContent = "live"; refreshAlarms(); });
  es.addEventListener("error", () => { live.className = "live off"; live.textContent = "reconnecting"; });
  es.addEventListener("alarm", (ev) => {
    // the daemon's clock may run ahead of the last snapshot (replay): never show "0 s ago" for old news
    const t = new Date(JSON.parse(ev.data).alarm.updated_at).getTime();
    if (Number.isFinite(t) && Date.now() - clockSkew < t) clockSkew = Date.now() - t;
    refreshAlarms();
  });
  es.addEventListener("sensors", (ev) => {
    const snap = JSON.parse(ev.data);
    const first = !sensors.length;
    sensors = snap.sensors;
    clockSkew = Date.now() - new Date(snap.time).getTime();
    $("#clock").textContent = fmtTime(snap.time);
    renderSensors();
    renderHealth(snap.health);
    if (first) { renderAlarms(); renderIncidentList(); refreshSeries(); }  // the cards can now show sensor names
  });
  // after the first snapshot the daemon sends only what changed
  es.addEventListener("changes", (ev) => {
    const delta = JSON.parse(ev.data);
    for (const s of delta.sensors) {
      const i = sensors.findIndex((x) => x.id === s.id);
      if (i >= 0) sensors[i] = s; else sensors.push(s);
    }
    clockSkew = Date.now() - new Date(delta.time).getTime();
    $("#clock").textContent = fmtTime(delta.time);
    if (delta.sensors.length) renderSensors();
    if (delta.health) renderHealth(delta.health);
  });
}

async function start() {
  const name = localStorage.getItem("console.name");
  const token = localStorage.getItem("console.token");
  if (name) $("#op-name").value = name;
  if (token) $("#op-token").value = token;
  $("#op-name").addEventListener("change", (e) => localStorage.setItem("console.name", e.target.value.trim()));
  $("#op-token").addEventListener("change", (e) => localStorage.setItem("console.token", e.target.value));
  $("#operator").addEventListener("submit", (e) => e.preventDefault());
  $("#shelve-cancel").addEventListener("click", () => $("#shelve-dialog").close());
  $("#shelve-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const reason = $("#shelve-reason").value.trim();
    if (!reason || !shelveTarget) return;
    const minutes = $("#shelve-minutes").value;
    $("#shelve-dialog").close();
    act(shelveTarget, "shelve", minutes ? { reason, minutes: Number(minutes) } : { reason }, shelveKey);
  });
  $("#note-kind").addEventListener("change", showNoteDue);
  $("#note-cancel").addEventListener("click", () => $("#note-dialog").close());
  $("#note-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const body = { kind: $("#note-kind").value, text: $("#note-text").value.trim() };
    if (body.kind === "notice") body.due = $("#note-due").value;  // YYYY-MM-DD: the station's day
    const target = noteTarget;
    const url = `/api/incidents/${encodeURIComponent(target)}/notes`;
    const label = caseLabel(target);
    submitIncident($("#note-dialog"), url, body, noteKey, $("#note-error"), target, () => noteTarget === target,
      () => { noteTarget = null; noteKey = null; }, () => { noteKey = requestId(); })
      .then((a) => { if (!a.problem && a.retried) toast(confirmedAfterRetry(`Note recorded on ${label}`)); });
  });
  $("#close-cancel").addEventListener("click", () => $("#close-dialog").close());
  $("#close-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const target = closeTarget;
    const url = `/api/incidents/${encodeURIComponent(target)}/close`;
    const label = caseLabel(target);
    submitIncident($("#close-dialog"), url, { reason: $("#close-reason").value.trim() }, closeKey,
      $("#close-error"), target, () => closeTarget === target, () => { closeTarget = null; closeKey = null; },
      () => { closeKey = requestId(); })
      .then((a) => {
        if (a.problem) return;
        const closed = `Case closed: ${label}`;  // naming it: another may be open
        toast(a.retried ? confirmedAfterRetry(closed) : `${closed}.`);
      });
  });
  try {
    const st = await getJSON("/api/station");
    writesEnabled = st.writes_enabled;
    clockSkew = Date.now() - new Date(st.time).getTime();
    $("#station-name").textContent = st.name ? `${st.name} (${st.id})` : st.id;
    document.title = `${st.id} console`;
    $("#station-link").hidden = !st.wet_well;
    $("#op-status").textContent = writesEnabled ? "" : "Writes are disabled on this gateway (no console token configured).";
  } catch (e) { toast(String(e)); }
  connect();
  setInterval(refreshSeries, 60000);
  setInterval(renderAlarms, 30000);  // keep "x min ago" honest
  setInterval(refreshIncidents, 60000);
}

document.addEventListener("DOMContentLoaded", start);
