// The pumping station view: polls /api/wet-well every 2 s and draws it. No framework, no CDN.
"use strict";

const $ = (id) => document.getElementById(id);
const fmt = (x, d = 2) => (x === null || x === undefined ? "–" : Number(x).toFixed(d));

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function drawLevel(level) {
  if (!level) { $("level").textContent = "no wet well"; return; }
  const sp = level.setpoints || {};
  const top = (sp.overflow || 10) * 1.15;
  const pct = (v) => Math.max(0, Math.min(100, (v / top) * 100));
  $("level").textContent = fmt(level.value);
  $("level-unit").textContent = level.unit;
  const fill = $("fill");
  fill.style.height = level.value === null ? "0" : pct(level.value) + "%";
  fill.className = "fill" + (level.value !== null && sp.overflow !== undefined && level.value >= sp.overflow
    ? " over" : level.high ? " high" : "");
  const marks = $("marks");
  marks.replaceChildren();
  for (const [name, v] of Object.entries(sp)) {
    if (v === null) continue;
    const m = el("div", "mark sp-" + name);
    m.style.bottom = pct(v) + "%";
    m.appendChild(el("span", "", `${name.replace("_", " ")} ${fmt(v, 1)}`));
    marks.appendChild(m);
  }
  const state = [];
  if (level.fail_to_start) state.push("FAIL TO START: level above lead on, no pump running");
  if (level.high) state.push("HIGH LEVEL");
  $("level-state").textContent = state.join(" · ") || (level.time ? `read ${level.time}` : "");
}

function drawPumps(pumps, today, totals) {
  $("today").textContent = `today ${today}: ${fmt(totals.today_run_hours)} h, ${totals.today_starts} starts`;
  const box = $("pumps");
  box.replaceChildren();
  for (const p of pumps) {
    const card = el("div", "pump " + p.state);
    card.dataset.sensor = p.sensor;
    card.appendChild(el("div", "name", p.name || p.sensor));
    card.appendChild(el("div", "state", p.state));
    const alarms = p.alarms.length ? ` · ${p.alarms.join(", ").replace("_", " ")}` : "";
    const drive = (p.speed !== null && p.speed !== undefined ? ` · speed ${fmt(p.speed, 0)}` : "") +
      (p.amps !== null && p.amps !== undefined ? ` · ${fmt(p.amps, 1)} A` : "");
    card.appendChild(el("div", "figs",
      `${fmt(p.today_run_hours)} h run · ${p.today_starts} starts today${drive}${alarms}`));
    box.appendChild(card);
  }
}

function drawOverflow(o) {
  const box = $("overflow");
  if (!o) { box.hidden = true; return; }
  box.hidden = false;
  // A volume not measured is unknown, never 0; the note says why, or that it is partial.
  const note = o.volume_note ? ` (${o.volume_note})` : "";
  const volume = (o.volume_gal === null ? "volume unknown" : `${Math.round(o.volume_gal)} gal so far`) + note;
  // The level stale: the end is open because no reading said the well stopped spilling.
  const stale = o.level_not_read_since_local ? ` · level not read since ${o.level_not_read_since_local}` : "";
  // One spill, one event: this record continues one the float ended with the level dead (the
  // time between not measured), or at the crest with the level read just under overflow.
  const gap = o.continues_gap_level === null || o.continues_gap_level === undefined
    ? "the time between not measured"
    : `the overflow switch off, the level read ${fmt(o.continues_gap_level)}, under overflow`;
  const link = o.continues_local ? ` · continues the overflow from ${o.continues_local} (${gap})` : "";
  box.textContent = `OVERFLOW since ${o.start_local}${link} · peak ${fmt(o.peak_level)} · ${volume}${stale} · ` +
    `report due ${o.report_due_local}${o.overdue ? " (OVERDUE)" : ""}`;
}

async function refresh() {
  try {
    const r = await fetch("/api/wet-well", { headers: { Accept: "application/json" } });
    if (!r.ok) throw new Error(r.status);
    const s = await r.json();
    $("title").textContent = `Wet well · ${s.station}`;
    $("clock").textContent = `${s.time_local} (${s.timezone})`;
    drawLevel(s.level);
    drawPumps(s.pumps, s.today_local, s.totals);
    $("inflow").textContent = s.inflow ? fmt(s.inflow.value_gpm, 0) : "–";
    drawOverflow(s.overflow);
    document.body.dataset.ready = "1";
  } catch (e) {
    $("clock").textContent = "offline";
  }
}

refresh();
setInterval(refresh, 2000);
