// The Switchboard console's page. Every string an agent wrote (ids, card fields, bodies,
// questions, reasons, action arguments) is hostile: it reaches the page only as text
// (textContent, createElement), never parsed as markup, never an inline handler or a link
// built from it; `inert` makes control and bidi characters visible. The only link an id
// goes into is a trace link, and only a 32-hex trace id in an http(s) template.
"use strict";

const state = { me: null, view: "map", timer: null, events: null, poll: null, mapFilter: "" };

const BIDI = /[\u200e\u200f\u061c\u202a-\u202e\u2066-\u2069]/g;
const CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/g;

function inert(value) {
  const text = value === undefined || value === null ? "" : String(value);
  return text
    .replace(BIDI, (c) => "\u27e6U+" + c.charCodeAt(0).toString(16).toUpperCase().padStart(4, "0") + "\u27e7")
    .replace(CONTROL, "\ufffd");
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = inert(value);
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else if (key === "type" || key === "placeholder" || key === "rows" || key === "id" || key === "name") node.setAttribute(key, value);
    else throw new Error("attribute not allowed: " + key);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" ? document.createTextNode(inert(child)) : child);
  }
  return node;
}

function agentText(value) {
  return el("span", { class: "agent-text", text: value });
}

function safeTraceLink(traceId) {
  const template = state.me && state.me.trace_url_template;
  if (!template || !/^https?:\/\//.test(template) || !/^[0-9a-f]{32}$/.test(String(traceId || ""))) return null;
  const link = document.createElement("a");
  link.href = template.replace("{trace_id}", traceId);
  link.rel = "noopener noreferrer";
  link.target = "_blank";
  link.textContent = "trace";
  return link;
}

async function api(path, options) {
  const init = { credentials: "same-origin", headers: {} };
  if (options && options.body !== undefined) {
    init.method = options.method || "POST";
    init.headers["Content-Type"] = "application/json";
    if (state.me) init.headers["X-CSRF-Token"] = state.me.csrf;
    init.body = JSON.stringify(options.body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let data = {};
  try {
    data = text ? JSON.parse(text) : {};
  } catch (err) {
    data = { error: { kind: "http_" + response.status, message: text.slice(0, 200) } };
  }
  if (!response.ok) {
    const error = new Error((data.error && data.error.message) || response.statusText);
    error.kind = data.error && data.error.kind;
    error.status = response.status;
    throw error;
  }
  return data;
}

function say(text, bad) {
  const status = document.getElementById("status");
  status.textContent = inert(text);
  status.className = bad ? "error" : "";
}

function ready() {
  document.body.dataset.ready = "1";
}

function mount(...children) {
  document.body.dataset.ready = "0";
  const main = document.getElementById("main");
  main.replaceChildren(...children.filter((child) => child !== null && child !== undefined));
}

// ---- sign-in ----

async function signIn(token) {
  state.me = await api("/api/login", { body: { token } });
}

function signInView(message) {
  const input = el("input", { type: "text", placeholder: "sign-in token", id: "token" });
  const button = el("button", { class: "primary", type: "submit" }, "Sign in");
  const form = el("form", {}, el("h2", { text: "Sign in" }), input, el("div", { class: "row" }, button));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      await signIn(input.value.trim());
      await start();
    } catch (err) {
      say("sign-in refused: " + err.message, true);
    }
  });
  document.getElementById("nav").hidden = true;
  mount(form, message ? el("p", { class: "error", text: message }) : null);
  ready();
}

// ---- map ----

// The map shows at most this many tiles at once (busy first, then idle, then offline); a
// filter finds any agent. Thousands of tiles at once would take seconds to lay out.
const MAP_SHOWN = 240;
const STATUS_ORDER = { busy: 0, idle: 1, offline: 2 };

function tileOf(agent) {
  const tile = el(
    "div",
    { class: "tile " + String(agent.status).replace(/[^a-z]/g, ""), "data-agent": agent.id, "data-status": agent.status },
    el("div", { class: "id", text: agent.id }),
    el("div", { class: "meta", text: agent.status + (agent.live_goals ? " · live" : "") + (agent.current_tasks ? " · " + agent.current_tasks + " tasks" : "") }),
    agent.description ? el("div", { class: "meta agent-text", text: agent.description }) : null,
  );
  const open = el("button", { class: "link", type: "button", "data-action": "tasks" }, "tasks");
  open.addEventListener("click", () => { location.hash = "#/tasks/" + encodeURIComponent(agent.id); });
  const talk = el("button", { class: "link", type: "button", "data-action": "talk" }, "talk");
  talk.addEventListener("click", () => { location.hash = "#/talk/" + encodeURIComponent(agent.id); });
  tile.append(el("div", { class: "row" }, open, talk));
  return tile;
}

async function mapView() {
  const data = await api("/api/map");
  const counts = { idle: 0, busy: 0, offline: 0 };
  for (const agent of data.agents) counts[agent.status] = (counts[agent.status] || 0) + 1;
  const agents = data.agents.slice().sort((a, b) => ((STATUS_ORDER[a.status] ?? 3) - (STATUS_ORDER[b.status] ?? 3)) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  const grid = el("div", { class: "grid", id: "agents" });
  const shown = el("p", { class: "counts", id: "shown" });
  const filter = el("input", { type: "text", placeholder: "find an agent by id", id: "map-filter" });
  filter.value = state.mapFilter || "";
  const draw = () => {
    const wanted = filter.value.trim();
    state.mapFilter = wanted;
    const matching = wanted ? agents.filter((agent) => agent.id.includes(wanted)) : agents;
    grid.replaceChildren(...matching.slice(0, MAP_SHOWN).map(tileOf));
    shown.textContent = matching.length > MAP_SHOWN ? `showing ${MAP_SHOWN} of ${matching.length}: busy first, then idle, then offline; type to find others` : "";
  };
  filter.addEventListener("input", draw);
  draw();
  const edges = el("table", { id: "edges" }, el("tr", {}, el("th", { text: "from" }), el("th", { text: "to" }), el("th", { text: "messages, last 5 min" })));
  for (const edge of data.edges) {
    edges.append(el("tr", {}, el("td", {}, agentText(edge.from)), el("td", {}, agentText(edge.to)), el("td", { text: String(edge.count) })));
  }
  mount(
    el("h2", { text: "Agents" }),
    el("div", { class: "counts", id: "counts", text: `${data.agents.length} agent${data.agents.length === 1 ? "" : "s"}: ${counts.idle || 0} idle, ${counts.busy || 0} busy, ${counts.offline || 0} offline` }),
    filter,
    shown,
    grid,
    el("h2", { text: "Who talked to whom" }),
    data.edges.length ? edges : el("p", { text: "nobody in the last 5 minutes" }),
  );
  ready();
}

// ---- conversations ----

// A conversation shows this many records at a time ("Load more" draws the next ones).
const THREAD_SHOWN = 200;

function preview(payload) {
  if (payload && typeof payload === "object") {
    if (typeof payload.body === "string") return payload.body;
    return JSON.stringify(payload);
  }
  return payload === undefined ? "" : String(payload);
}

async function threadView(id) {
  const input = el("input", { type: "text", placeholder: "a call, message, task or question id", id: "thread-id" });
  const form = el("form", {}, input, el("div", { class: "row" }, el("button", { class: "primary", type: "submit" }, "Open")));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    location.hash = "#/thread/" + encodeURIComponent(input.value.trim());
  });
  if (!id) {
    mount(el("h2", { text: "Conversations" }), form);
    ready();
    return;
  }
  input.value = id;
  const data = await api("/api/thread?id=" + encodeURIComponent(id));
  const list = el("div", { id: "timeline" });
  const count = el("p", { class: "counts", id: "thread-count" });
  let shown = 0;
  // Records fetched but not drawn yet: a page is drawn THREAD_SHOWN cards at a time.
  let held = (data.records || []).slice();
  const draw = () => {
    const cards = [];
    for (const entry of held.splice(0, THREAD_SHOWN)) {
      const record = entry.record || entry;
      const trace = safeTraceLink(record.trace_id);
      cards.push(
        el(
          "div",
          { class: "card", "data-kind": String(record.kind) },
          el("div", { class: "head" }, el("span", { class: "kind", text: record.kind }), " ", record.at || "", " · ", agentText(record.from_agent || "—"), " → ", agentText(record.to_agent || "—"), trace ? " · " : null, trace),
          el("div", {}, agentText(preview(record.payload))),
        ),
      );
    }
    list.append(...cards);
    shown += cards.length;
  };
  draw();
  // A long thread comes a page at a time: the next cards on request, fetched when needed.
  const more = el("button", { type: "button", id: "thread-more", "data-action": "more" }, "Load more");
  let cursor = data.next_cursor;
  const fetchable = () => cursor !== undefined && cursor !== null;
  const counted = () => {
    count.textContent = inert(shown + " records" + (held.length || fetchable() ? ", more follow" : ""));
    more.hidden = !held.length && !fetchable();
  };
  more.addEventListener("click", async () => {
    try {
      if (!held.length && fetchable()) {
        const page = await api("/api/thread?id=" + encodeURIComponent(id) + "&by=" + encodeURIComponent(data.by) + "&cursor=" + encodeURIComponent(cursor));
        held = (page.records || []).slice();
        cursor = page.next_cursor;
      }
      draw();
      counted();
    } catch (err) {
      say(err.kind + ": " + err.message, true);
    }
  });
  counted();
  mount(el("h2", { text: "Conversation " + id }), form, count, (data.records || []).length ? list : el("p", { text: "no records for this id" }), more);
  ready();
}

// ---- a person's inbox ----

function itemCard(item, done) {
  const card = el(
    "div",
    { class: "card", "data-item": item.item_id, "data-kind": item.kind },
    el("div", { class: "head" }, el("span", { class: "kind", text: item.kind }), " from ", agentText(item.from_agent), " to ", agentText(item.addressee), " · ", item.created_at || "", " · ", item.state || ""),
    el("div", {}, agentText(item.message)),
  );
  if (item.action) {
    card.append(
      el("div", { class: "head", text: "action" }),
      el("div", {}, agentText(item.action.tool)),
      el("pre", {}, agentText(JSON.stringify(item.action.arguments, null, 2))),
      el("div", { class: "head" }, "hash ", agentText(item.action_hash)),
    );
  }
  if (item.answer) {
    const said = item.answer.message ? [": ", agentText(item.answer.message)] : [];
    card.append(el("div", { class: "head" }, "answered by ", agentText(item.answer.by), item.answer.decision ? " (" + item.answer.decision + ")" : "", ...said));
  }
  if (done) return card;
  const send = async (body) => {
    try {
      const ack = await api("/api/items/" + encodeURIComponent(item.item_id) + "/answer", { body });
      say("done: " + ack.state);
      await route();
    } catch (err) {
      say(err.kind + ": " + err.message, true);
    }
  };
  if (item.kind === "ask") {
    const text = el("textarea", { rows: "2", placeholder: "your answer", name: "answer" });
    const button = el("button", { class: "primary", type: "button", "data-action": "answer" }, "Answer");
    button.addEventListener("click", () => send({ message: text.value }));
    card.append(text, el("div", { class: "row" }, button));
  } else if (item.kind === "approval") {
    const note = el("input", { type: "text", placeholder: "note (optional)", name: "note" });
    const approve = el("button", { class: "primary", type: "button", "data-action": "approve" }, "Approve");
    const deny = el("button", { class: "danger", type: "button", "data-action": "deny" }, "Deny");
    const decide = (decision) => send({ decision, action_hash: item.action_hash, message: note.value || undefined });
    approve.addEventListener("click", () => decide("approved"));
    deny.addEventListener("click", () => decide("denied"));
    card.append(note, el("div", { class: "row" }, approve, deny));
  } else {
    const read = el("button", { type: "button", "data-action": "read" }, "Mark read");
    read.addEventListener("click", () => send({}));
    card.append(el("div", { class: "row" }, read));
  }
  return card;
}

async function inboxView(which) {
  const done = which === "done";
  const data = await api("/api/inbox?state=" + (done ? "done" : "open"));
  const tabs = el("div", { class: "tabs" });
  for (const [name, label] of [["open", "Waiting for me"], ["done", "Answered before"]]) {
    const button = el("button", { type: "button", class: (done ? "done" : "open") === name ? "primary" : "" }, label);
    button.addEventListener("click", () => { location.hash = "#/inbox/" + name; });
    tabs.append(button);
  }
  const list = el("div", { id: "items" });
  for (const item of data.items) list.append(itemCard(item, done));
  const flood = (data.senders || []).filter((s) => s.at_cap);
  mount(
    el("h2", { text: "Inbox of " + state.me.person }),
    tabs,
    flood.length ? el("p", { class: "flood", text: "at their full share: " + flood.map((s) => s.agent + " (" + s.open + ")").join(", ") }) : null,
    data.items.length ? list : el("p", { text: done ? "nothing answered yet" : "nothing waiting" }),
    data.next ? el("p", { text: "more: older items follow" }) : null,
  );
  ready();
}

// ---- tasks ----

function taskRow(task, depth, canCancel) {
  const pad = el("span", { class: "indent", text: "\u2003".repeat(Math.max(0, depth)) + (depth ? "\u21b3 " : "") });
  const tree = el("button", { class: "link", type: "button", "data-action": "tree" }, String(task.task_id).slice(0, 8));
  tree.addEventListener("click", () => { location.hash = "#/task/" + encodeURIComponent(task.task_id); });
  const cells = [
    el("td", {}, pad, tree),
    el("td", {}, el("span", { class: "kind state-" + String(task.state).replace(/[^a-z_]/g, ""), text: task.state })),
    el("td", {}, agentText(task.requester), " \u2192 ", agentText(task.assignee)),
    el("td", { text: task.deadline || "\u2014" }),
    el("td", {}, agentText(task.message), task.reason ? el("div", { class: "meta" }, "reason: ", agentText(task.reason)) : null),
  ];
  const actions = el("td", {});
  if (canCancel && !["completed", "failed", "rejected", "canceled"].includes(task.state)) {
    const cancel = el("button", { class: "danger", type: "button", "data-action": "cancel" }, depth ? "Cancel" : "Cancel tree");
    cancel.addEventListener("click", async () => {
      const reason = document.getElementById("cancel-reason");
      try {
        const done = await api("/api/tasks/" + encodeURIComponent(task.task_id) + "/cancel", { body: { reason: reason && reason.value ? reason.value : undefined } });
        say("canceled " + done.task.task_id + ((done.descendants || []).length ? " and " + done.descendants.length + " below it" : ""));
        await route();
      } catch (err) {
        say(err.kind + ": " + err.message, true);
      }
    });
    actions.append(cancel);
  }
  return el("tr", { "data-task": String(task.task_id), "data-state": String(task.state) }, ...cells, actions);
}

function taskTable(id) {
  return el("table", { id }, el("tr", {}, el("th", { text: "task" }), el("th", { text: "state" }), el("th", { text: "requester \u2192 assignee" }), el("th", { text: "deadline" }), el("th", { text: "what" }), el("th", {})));
}

async function tasksView(agent) {
  const input = el("input", { type: "text", placeholder: "an agent id", id: "tasks-agent" });
  const form = el("form", {}, input, el("div", { class: "row" }, el("button", { class: "primary", type: "submit" }, "Show tasks")));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    location.hash = "#/tasks/" + encodeURIComponent(input.value.trim());
  });
  if (!agent) {
    mount(el("h2", { text: "Tasks" }), el("p", { text: "Pick an agent on the map, or name one." }), form);
    ready();
    return;
  }
  input.value = agent;
  const data = await api("/api/tasks?agent=" + encodeURIComponent(agent));
  const table = taskTable("tasks");
  for (const task of data.tasks) table.append(taskRow(task, 0, false));
  mount(
    el("h2", { text: "Tasks of " + agent }),
    form,
    el("p", { class: "counts", text: (data.total === undefined ? data.tasks.length : data.total) + " tasks, newest first; open one to see its tree" }),
    data.tasks.length ? table : el("p", { text: "no tasks" }),
  );
  ready();
}

async function treeView(taskId) {
  const data = await api("/api/tasks/" + encodeURIComponent(taskId) + "/tree");
  const depthOf = new Map();
  const table = taskTable("tree");
  const operator = (state.me.access || []).includes("operator");
  for (const task of data.tasks) {
    const depth = task.parent && depthOf.has(task.parent) ? depthOf.get(task.parent) + 1 : 0;
    depthOf.set(task.task_id, depth);
    table.append(taskRow(task, depth, operator));
  }
  const open = data.tasks.filter((t) => !["completed", "failed", "rejected", "canceled"].includes(t.state)).length;
  mount(
    el("h2", { text: "Task tree " + data.root }),
    el("p", { class: "counts", text: data.tasks.length + " tasks, " + open + " open" + (data.truncated ? " (more below: only the first " + data.tasks.length + " shown)" : "") }),
    operator && open ? el("input", { type: "text", placeholder: "why cancel (shown to the agents)", id: "cancel-reason" }) : null,
    table,
  );
  ready();
}

// ---- talk to an agent ----

function talkEntry(entry) {
  if (entry.outgoing) {
    const reply = entry.reply || {};
    const id = reply.correlation_id || (reply.task && reply.task.task_id) || reply.message_id || "";
    let open = null;
    if (/^[0-9a-f-]{36}$/.test(String(id))) {
      open = el("button", { class: "link", type: "button", "data-action": "thread" }, "conversation");
      open.addEventListener("click", () => { location.hash = "#/thread/" + encodeURIComponent(id); });
    }
    return el(
      "div",
      { class: "card mine", "data-mode": String(entry.mode) },
      el("div", { class: "head" }, "you \u2192 ", agentText(entry.to), " · ", entry.mode, " · ", entry.at || "", open ? " · " : null, open),
      el("div", {}, agentText(entry.body)),
    );
  }
  const message = entry.message || {};
  return el(
    "div",
    { class: "card", "data-kind": String(message.kind || "message") },
    el("div", { class: "head" }, agentText(message.from_agent_id || "—"), " · ", el("span", { class: "kind", text: message.kind || "message" }), " · ", message.sent_at || ""),
    el("div", {}, agentText(message.body)),
  );
}

async function talkView(to) {
  const target = el("input", { type: "text", placeholder: "agent id (or skill:<name>)", id: "talk-to" });
  target.value = to || "";
  const text = el("textarea", { rows: "3", placeholder: "what to say", id: "talk-message" });
  const buttons = el("div", { class: "row" });
  for (const [mode, label] of [["send", "Send"], ["call", "Call (wait for the answer)"], ["task", "Give a task"]]) {
    const button = el("button", { class: mode === "call" ? "primary" : "", type: "button", "data-action": mode }, label);
    button.addEventListener("click", async () => {
      try {
        await api("/api/talk", { body: { to: target.value.trim(), mode, message: text.value } });
        text.value = "";
        say(mode + " to " + target.value.trim() + " went out");
        await drawTalk();
      } catch (err) {
        say(err.kind + ": " + err.message, true);
      }
    });
    buttons.append(button);
  }
  const list = el("div", { id: "talk" });
  mount(el("h2", { text: "Talk to an agent" }), target, text, buttons, el("h2", { text: "Conversation" }), list);
  await drawTalk();
  ready();
  state.poll = setInterval(() => drawTalk().catch(() => {}), 2000);
}

async function drawTalk() {
  const list = document.getElementById("talk");
  if (!list) return;
  const data = await api("/api/talk");
  const entries = (data.messages || []).slice().reverse().map(talkEntry);
  list.replaceChildren(el("p", { class: "counts", text: "you speak as " + (data.as || "") + "; newest first" }), ...entries);
}

// ---- dead letters ----

async function dlqView() {
  const data = await api("/api/dlq");
  const table = el("table", { id: "letters" }, el("tr", {}, el("th", { text: "#" }), el("th", { text: "why" }), el("th", { text: "where" }), el("th", { text: "message" }), el("th", {})));
  for (const letter of data.letters) {
    const redrive = el("button", { type: "button", "data-action": "redrive" }, "Redrive");
    redrive.addEventListener("click", async () => {
      try {
        await api("/api/dlq/" + encodeURIComponent(letter.seq) + "/redrive", { body: {} });
        say("redriven #" + letter.seq);
        await route();
      } catch (err) {
        say(err.kind + ": " + err.message, true);
      }
    });
    const discard = el("button", { class: "danger", type: "button", "data-action": "discard" }, "Discard");
    discard.addEventListener("click", async () => {
      try {
        await api("/api/dlq/" + encodeURIComponent(letter.seq) + "/discard", { body: {} });
        say("discarded #" + letter.seq);
        await route();
      } catch (err) {
        say(err.kind + ": " + err.message, true);
      }
    });
    table.append(el("tr", { "data-seq": String(letter.seq) }, el("td", { text: String(letter.seq) }), el("td", {}, agentText(letter.reason)), el("td", {}, agentText(letter.subject)), el("td", {}, agentText(preview(letter.payload))), el("td", {}, el("div", { class: "row" }, redrive, discard))));
  }
  mount(el("h2", { text: "Dead letters" }), data.letters.length ? table : el("p", { text: "no dead letters" }));
  ready();
}

// ---- routing and live updates ----

async function route() {
  if (!state.me) return signInView();
  const parts = location.hash.replace(/^#\/?/, "").split("/");
  state.view = parts[0] || "map";
  clearInterval(state.poll);
  state.poll = null;
  for (const link of document.querySelectorAll("#nav a")) {
    link.className = link.dataset.view === state.view ? "here" : "";
  }
  try {
    if (state.view === "inbox") await inboxView(parts[1]);
    else if (state.view === "thread") await threadView(decodeURIComponent(parts[1] || ""));
    else if (state.view === "dlq") await dlqView();
    else if (state.view === "tasks") await tasksView(decodeURIComponent(parts[1] || ""));
    else if (state.view === "task") await treeView(decodeURIComponent(parts[1] || ""));
    else if (state.view === "talk") await talkView(decodeURIComponent(parts[1] || ""));
    else await mapView();
  } catch (err) {
    if (err.status === 401) return signInView("signed out");
    say(err.message, true);
    ready();
  }
}

function soon() {
  clearTimeout(state.timer);
  state.timer = setTimeout(route, 250);
}

function live() {
  if (state.events) state.events.close();
  const events = new EventSource("/api/events");
  state.events = events;
  events.addEventListener("message", (event) => {
    const hint = JSON.parse(event.data);
    if (hint.type === "agent" && state.view === "map") soon();
    else if (hint.type === "inbox" && state.view === "inbox") soon();
    else if (hint.type === "resync") soon();
  });
}

async function start() {
  document.getElementById("nav").hidden = false;
  document.getElementById("who").textContent = inert(state.me.name + " (" + state.me.person + ")");
  const signout = document.getElementById("signout");
  signout.hidden = false;
  signout.onclick = async () => {
    if (state.events) state.events.close();
    state.events = null;
    await api("/api/logout", { body: {} }).catch(() => {});
    state.me = null;
    say("");
    location.hash = "";
    signInView();
  };
  live();
  await route();
}

// Registered once: a view follows the address bar.
window.addEventListener("hashchange", () => {
  say("");
  route();
});

async function boot() {
  const match = location.hash.match(/login=([0-9A-Za-z_-]+)/);
  if (match) {
    // The one-time token travels in the fragment (never sent to a server or a log) and is
    // gone from the address bar at once.
    history.replaceState(null, "", location.pathname + "#/map");
    try {
      await signIn(match[1]);
    } catch (err) {
      return signInView("this sign-in link was used or is not valid");
    }
    return start();
  }
  try {
    state.me = await api("/api/me");
  } catch (err) {
    return signInView(err.message);
  }
  if (!state.me.person) {
    state.me = null;
    return signInView();
  }
  return start();
}

boot();
