// rdmasched mirror: polls /state (and /task for a task's story) and draws the cluster.
"use strict";
const params = new URLSearchParams(location.search);
let at = params.has("at") ? parseFloat(params.get("at")) : null;
let selected = params.get("task"); // "ORIGIN:ID"
let source = null;
let playing = false;
let nowMs = null; // the moment shown (a trace replay): later story events are greyed

const $ = (id) => document.getElementById(id);
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const k of kids) if (k !== null && k !== undefined) e.append(k);
  return e;
}
function taskLink(key, label) {
  if (!key) return "";
  const a = el("a", {class: "task" + (label && label.startsWith("sync") ? " sync" : "") +
    (key === selected ? " selected" : ""), "data-key": key, href: "#", text: label || key});
  a.addEventListener("click", (ev) => { ev.preventDefault(); showTask(key); });
  return a;
}
function cause(e) {
  if (!e.cause) return "local call";
  return `${e.cause} from node ${e.cause_src}` + (e.cause_seq !== undefined ? ` #${e.cause_seq}` : "");
}

function drawNodes(s) {
  const box = $("nodes");
  box.replaceChildren();
  for (const n of s.nodes) {
    const card = el("div", {class: "node", id: `node-${n.node}`});
    card.append(el("h3", {}, el("span", {class: "name", text: `node ${n.node}`}),
      el("span", {class: "counts", text: `running ${n.running} · queued ${n.queued} · ${n.events} events`})));
    if (n.error) card.append(el("div", {class: "error", text: n.error}));
    if (n.dropped || n.missed) card.append(el("div", {class: "error", text: `ring lost ${n.dropped + n.missed} events`}));
    n.slots.forEach((t, i) => {
      const row = el("div", {class: "slot"}, el("span", {class: "n", text: `slot ${i}`}));
      if (t) row.append(taskLink(t.key, t.label), el("span", {class: "prio", text: `p${t.priority ?? "?"}`}));
      else row.append(el("span", {class: "idle", text: "idle"}));
      card.append(row);
    });
    const q = el("div", {class: "queue"}, el("b", {text: `queue (${n.queue.length}): `}));
    if (!n.queue.length) q.append(el("span", {class: "idle", text: "empty"}));
    n.queue.forEach((t, i) => {
      if (i) q.append(", ");
      q.append(taskLink(t.key, t.label), el("span", {class: "prio", text: ` p${t.priority ?? "?"}`}));
      // why it waits (its queue event's reason code; `rdmasched why` gives the ranked reasons now)
      if (t.reason) q.append(el("span", {class: "reason", title: t.reason_text || "", text: ` ${t.reason}`}));
    });
    card.append(q);
    box.append(card);
  }
  for (const [addr, err] of Object.entries(s.errors || {})) {  // daemons not heard from yet
    box.append(el("div", {class: "node"}, el("h3", {}, el("span", {class: "name", text: addr})),
      el("div", {class: "error", text: err})));
  }
}
function drawGroups(s) {
  const body = $("groups").tBodies[0];
  body.replaceChildren();
  for (const g of s.groups) {
    const per = Object.entries(g.nodes).map(([n, st]) => `n${n}:${st}`).join(" ");
    body.append(el("tr", {}, el("td", {text: g.group}), el("td", {text: g.step}), el("td", {text: per})));
  }
  if (!s.groups.length) body.append(el("tr", {}, el("td", {colspan: 3, class: "hint", text: "no step released yet"})));
}
function eventRow(e, withRole) {
  const later = withRole && source === "trace" && nowMs !== null && e.t_ms > nowMs;
  const tr = el("tr", {class: (withRole ? `role-${e.role}` : "") + (later ? " later" : "")});
  tr.append(el("td", {text: e.t_ms.toFixed(3)}), el("td", {text: e.node}),
    el("td", {class: `d-${e.decision}`, text: e.decision + (withRole && e.role === "beaten" ? " (went ahead of it)" : "")}),
    el("td", {}, taskLink(e.key, e.label)), el("td", {text: e.rule || ""}),
    el("td", {}, e.beaten_key ? taskLink(e.beaten_key, e.beaten_label) : "",
      e.n_beaten > 1 ? ` +${e.n_beaten - 1}` : ""),
    el("td", {text: cause(e)}), el("td", {text: e.reason}));
  return tr;
}
function drawDecisions(s) {
  const body = $("decisions").tBodies[0];
  body.replaceChildren(...s.decisions.map((e) => eventRow(e, false)));
}
async function showTask(key) {
  selected = key;
  const [origin, id] = key.split(":");
  const r = await fetch(`/task?origin=${origin}&id=${id}`);
  const box = $("story");
  const body = await r.json();
  if (!r.ok) { box.replaceChildren(el("p", {class: "error", text: body.error})); return; }
  const t = el("table", {id: "story-table"}, el("thead", {}, el("tr", {},
    ...["ms", "node", "decision", "task", "rule", "ahead of", "cause", "reason"].map((h) => el("th", {text: h})))));
  t.append(el("tbody", {}, ...body.events.map((e) => eventRow(e, true))));
  box.replaceChildren(el("p", {}, el("b", {text: body.label}), ` (origin ${origin}, id ${id}): ${body.events.length} events` +
    (source === "trace" ? " (grey: after the moment shown)" : "")), t);
  document.querySelectorAll(".task").forEach((a) => a.classList.toggle("selected", a.dataset.key === key));
}
async function refresh() {
  const r = await fetch("/state" + (at !== null ? `?at=${at}` : ""));
  const s = await r.json();
  source = s.source;
  nowMs = s.t_ms;
  if (s.source === "trace") {
    $("replay").hidden = false;
    $("source").textContent = `replay of a trace: ${s.nodes.length} nodes, ${s.total} events, ${s.span_ms.toFixed(1)} ms`;
    $("clock").textContent = `${s.t_ms.toFixed(3)} ms · ${s.events} events`;
    if (!$("at").matches(":active")) $("at").value = Math.round(s.at * 1000);
  } else {
    $("source").textContent = `live: ${s.addrs.join(", ")} · ${s.events} events`;
  }
  drawNodes(s); drawGroups(s); drawDecisions(s);
  if (selected && source === "trace" && document.getElementById("story-table")) {
    document.querySelectorAll("#story-table tbody tr").forEach((tr) => {
      tr.classList.toggle("later", parseFloat(tr.cells[0].textContent) > nowMs);
    });
  }
  document.body.dataset.ready = "1";
}
$("at").addEventListener("input", () => { at = $("at").value / 1000; playing = false; $("play").textContent = "play"; refresh(); });
$("play").addEventListener("click", () => {
  playing = !playing; $("play").textContent = playing ? "pause" : "play";
  if (playing && (at === null || at >= 1)) at = 0;
});
async function tick() {
  if (source === "trace" && playing) { at = Math.min(1, (at ?? 0) + 0.005); if (at >= 1) { playing = false; $("play").textContent = "play"; } }
  if (source !== "trace" || playing) await refresh();
}
refresh().then(() => { if (selected) showTask(selected); });
setInterval(tick, 500);
