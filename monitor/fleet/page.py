"""The fleet page: one self-contained HTML document (no external scripts, fonts or CDNs).

Every value from the broker is put into the page with `textContent`, never as HTML:
a station's alarm message is text a publisher chose.
"""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Stations</title>
<style>
body{font:15px/1.4 system-ui,sans-serif;margin:0;background:#f4f5f7;color:#111}
header{background:#1d3557;color:#fff;padding:.6em 1em;display:flex;gap:1em;align-items:baseline}
header h1{font-size:1.2em;margin:0} #link{font-size:.85em}
main{padding:.8em;display:grid;gap:.8em;grid-template-columns:repeat(auto-fill,minmax(320px,1fr))}
.st{background:#fff;border-radius:6px;padding:.7em;border-left:6px solid #2a9d8f}
.st.offline{border-left-color:#6c757d;background:#eceff1}
.st h2{font-size:1.05em;margin:0 0 .3em;display:flex;justify-content:space-between}
.badge{font-size:.8em;padding:.1em .5em;border-radius:3px;background:#2a9d8f;color:#fff}
.offline .badge{background:#6c757d} .meta{color:#555;font-size:.85em}
.al{border-top:1px solid #ddd;padding:.35em 0;font-size:.9em}
.al.stale{opacity:.6} .p-critical{color:#b00020;font-weight:700} .p-high{color:#d35400;font-weight:600}
button{font:inherit;padding:.2em .7em;margin-top:.2em}
dialog input{display:block;margin:.3em 0;width:95%;font:inherit}
</style></head><body>
<header><h1>Pumping stations</h1><span id="link"></span></header>
<main id="fleet"></main>
<dialog id="ackd"><form method="dialog" id="ackf">
<p id="ackwhat"></p>
<input name="user" placeholder="your broker user name" autocomplete="username" required>
<input name="password" type="password" placeholder="password" autocomplete="current-password" required>
<input name="note" placeholder="note (optional)">
<button value="ok">Acknowledge</button> <button value="cancel" formnovalidate>Cancel</button>
<p id="ackres"></p></form></dialog>
<script>
"use strict";
const el=(tag,cls,text)=>{const e=document.createElement(tag);if(cls)e.className=cls;
  if(text!==undefined&&text!==null)e.textContent=String(text);return e;};
let target=null;
function render(doc){
  document.getElementById("link").textContent=doc.broker_connected?"broker connected":"BROKER NOT CONNECTED";
  const main=document.getElementById("fleet");main.replaceChildren();
  for(const s of doc.stations){
    const card=el("section","st"+(s.online?"":" offline"));
    const h=el("h2");h.append(el("span",null,s.id),el("span","badge",s.online?"online":"offline"));
    card.append(h);
    card.append(el("div","meta",(s.online?"online":"offline")+(s.since?" since "+s.since:"")+
      (s.last_seen?" \\u00b7 last seen "+s.last_seen:"")));
    if(s.console){const a=el("a",null,"open station console");a.href=s.console;a.rel="noopener";
      card.append(a);}
    for(const a of s.alarms){
      const row=el("div","al"+(a.stale?" stale":""));
      row.append(el("span","p-"+a.priority,(a.priority||"")+" "),
        el("span",null,a.sensor+" "+a.rule+": "+a.state+(a.stale?" (stale)":"")));
      if(a.message)row.append(el("div","meta",a.message));
      if(s.online&&(a.state==="active_unacknowledged"||a.state==="returned_unacknowledged")){
        const b=el("button",null,"Acknowledge");
        b.onclick=()=>{target={station:s.id,sensor:a.sensor,rule:a.rule};
          document.getElementById("ackwhat").textContent=s.id+" "+a.sensor+" "+a.rule;
          document.getElementById("ackres").textContent="";document.getElementById("ackd").showModal();};
        row.append(el("br"),b);}
      card.append(row);}
    if(!s.alarms.length)card.append(el("div","meta","no alarms"));
    main.append(card);}
}
async function refresh(){try{const r=await fetch("api/stations");render(await r.json());}catch(e){
  document.getElementById("link").textContent="fleet view not reachable";}}
document.getElementById("ackf").addEventListener("submit",async ev=>{
  if(ev.submitter&&ev.submitter.value!=="ok")return;ev.preventDefault();
  const f=new FormData(ev.target);
  const r=await fetch("api/ack",{method:"POST",headers:{"Content-Type":"application/json"},
    body:JSON.stringify({...target,user:f.get("user"),password:f.get("password"),note:f.get("note")||null})});
  const res=await r.json();
  document.getElementById("ackres").textContent=res.ok?"acknowledged":res.detail||res.error;
  if(res.ok){document.getElementById("ackd").close();refresh();}});
refresh();setInterval(refresh,2000);
</script></body></html>
"""
