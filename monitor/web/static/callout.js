// Callout panel: who is on call now, and each alarm's escalation (who was told when, who is
// next). Its own file so the console's app.js stays as it is; uses app.js's el() helper.
// Times are the station's local time, as the daemon formats them.
"use strict";

const CALLOUT_STATUS = {
  running: "escalating", done: "roster exhausted – nobody acknowledged", acknowledged: "acknowledged",
  cleared: "returned to normal", flood: "in a flood summary", shelved: "shelved",
  "out of service": "out of service", suppressed: "suppressed", stopped: "stopped",
  continues: "no page: continues an event already paged",
  "acknowledged after clear": "returned to normal, acknowledged later",
};

function renderCallout(state) {
  const box = document.querySelector("#callout");
  const section = document.querySelector("#callout-section");
  if (!state.enabled) { section.hidden = true; return; }
  section.hidden = false;
  const onCall = state.on_call.length
    ? state.on_call.map((o) => `${o.name} (${o.pipeline})`).join(", ")
    : "nobody: no pipeline is in force now";
  const rows = state.escalations.slice(0, 20).map((e) => {
    const told = e.told.map((t) => `${t.person} by ${t.channel}: ${t.state}${t.sent_local ? " " + t.sent_local : ""}`
      + (t.error ? ` (${t.error})` : ""));
    const next = e.next ? `${e.next.person} at ${e.next.at_local}` : "—";
    const what = e.kind === "flood" ? "alarm flood" : `${e.sensor} ${e.rule}`;
    const status = (CALLOUT_STATUS[e.status] || e.status) + (e.ended_by ? ` by ${e.ended_by}` : "");
    return el("tr", {}, el("td", {}, e.started_local), el("td", {}, what), el("td", {}, status),
      el("td", {}, told.join("; ") || "—"), el("td", {}, next));
  });
  const table = el("table", { class: "journal" },
    el("thead", {}, el("tr", {}, ["Started", "Alarm", "State", "Told", "Next"].map((h) => el("th", {}, h)))),
    el("tbody", {}, rows));
  const beat = state.heartbeat ? `heartbeat ${state.heartbeat.state}, ${state.heartbeat.sent} sent` : "";
  box.replaceChildren(el("p", {}, el("strong", {}, "On call now: "), onCall), beat ? el("p", { class: "muted" }, beat) : "",
    rows.length ? table : el("p", { class: "muted" }, "No callouts yet."));
}

async function refreshCallout() {
  try {
    const r = await fetch("/api/callout", { cache: "no-store" });
    if (r.ok) renderCallout(await r.json());
  } catch (err) { /* the console's own banner shows a lost connection */ }
}

document.addEventListener("DOMContentLoaded", () => {
  refreshCallout();
  setInterval(refreshCallout, 5000);
});
