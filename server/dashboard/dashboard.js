// The Isthmus dashboard: islands -> hosts -> devices, the slices over them, the islands'
// queues and the recent runs, refreshed every REFRESH_MS from the server's REST API with
// the credential given (a client sees its own slices and runs, the admin every client's).
// Everything shown is set as text, never as HTML: client and slice names are untrusted.
"use strict";

const REFRESH_MS = 2000;
const KEY = "isthmus.credential";
let credential = null;
let me = null;  // who the credential is (asked once per credential)
let timer = null;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "style") node.style.cssText = v;
    else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child));
  return node;
}

async function api(path) {
  const r = await fetch(path, { headers: { Authorization: `Bearer ${credential}` } });
  if (r.status === 401) throw Object.assign(new Error("the credential was refused (401)"), { unauthorized: true });
  if (!r.ok) throw new Error(`${path}: ${r.status} ${await r.text()}`);
  return r.json();
}

function hue(text) {
  let h = 0;
  for (const c of text) h = (h * 31 + c.charCodeAt(0)) % 360;
  return h;
}

function seconds(s) {
  return s < 1 ? `${(s * 1000).toFixed(1)} ms` : `${s.toFixed(2)} s`;
}

function bytes(n) {
  if (n == null) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let k = 0;
  while (n >= 1024 && k < units.length - 1) { n /= 1024; k++; }
  return `${n.toFixed(k ? 1 : 0)} ${units[k]}`;
}

function renderGrid(islands, devices, slices, admin) {
  const onDevice = new Map();  // device id -> the slices over it
  for (const s of slices) for (const d of s.device_ids) {
    if (!onDevice.has(d)) onDevice.set(d, []);
    onDevice.get(d).push(s);
  }
  const byId = new Map(devices.map((d) => [d.id, d]));
  const grid = document.getElementById("grid");
  grid.replaceChildren(...islands.map((island) => {
    const box = el("div", { class: "island", "data-island": island.name },
      el("h3", {}, `island ${island.name}`),
      el("div", { class: "queue" },
        `queued ${island.queued} · in flight ${island.in_flight} · ${island.devices} devices · ${island.slices} slices`));
    for (const host of island.hosts) {
      const row = el("div", { class: `host ${host.status}`, "data-host": host.name },
        el("span", { class: "name" }, host.name), ` ${host.status}`,
        ` · buffers ${bytes(host.buffer_bytes)} of ${bytes(host.buffer_budget_bytes)}`,
        host.running ? ` · running ${host.running}` : "");
      const cells = el("div", { class: "devices" });
      for (const id of host.devices) {
        const d = byId.get(id) || { id, status: host.status, load: 0, index: "?" };
        const light = Math.max(45, 85 - 10 * d.load);
        const cell = el("div", { class: `device ${d.status}`, "data-device": id, style: `--light: ${light}%`,
          title: `device ${id} (${d.kind || ""}) · ${d.load} slice members` }, el("span", { class: "id" }, `#${id}`));
        for (const s of onDevice.get(id) || []) {
          const who = admin ? `${s.owner_name || s.owner}: ` : "";
          cell.append(el("span", { class: "slice-tag", "data-slice": s.id, "data-owner": s.owner_name || s.owner,
            title: `${who}slice ${s.id}`, style: `background: hsl(${hue(s.id)}, 55%, 42%)` }, `${who}${s.id}`));
        }
        cells.append(cell);
      }
      row.append(cells);
      box.append(row);
    }
    return box;
  }));
}

function renderSlices(slices, admin) {
  const body = document.querySelector("#slices tbody");
  body.replaceChildren(...slices.map((s) => el("tr", { "data-slice": s.id },
    el("td", {}, s.id), el("td", {}, admin ? (s.owner_name || s.owner) : "you"),
    el("td", {}, Object.entries(s.mesh).map(([a, n]) => `${a}=${n}`).join(" × ")),
    el("td", {}, s.island), el("td", {}, s.hosts.join(", ")), el("td", {}, s.device_ids.join(", ")))));
}

async function downloadTrace(run) {
  try {
    const trace = await api(`/v1/runs/${run.id.split("/").map(encodeURIComponent).join("/")}/trace`);
    const blob = new Blob([JSON.stringify(trace)], { type: "application/json" });
    const a = el("a", { href: URL.createObjectURL(blob), download: `trace-${run.id.replace(/[^\w.-]/g, "_")}.json` });
    document.body.append(a);
    a.click();
    a.remove();
  } catch (e) {
    showError(`trace of ${run.id}: ${e.message}`);
  }
}

function renderRuns(runs, admin) {
  const body = document.querySelector("#runs tbody");
  body.replaceChildren(...runs.map((r) => {
    const trace = el("td", {});
    if (r.traced) {
      const b = el("button", { type: "button", class: "trace" }, "trace.json");
      b.addEventListener("click", () => downloadTrace(r));
      trace.append(b);
    }
    return el("tr", { "data-run": r.id },
      el("td", {}, r.id), el("td", {}, r.name), el("td", {}, admin ? r.client_name || r.client_id : "you"),
      el("td", {}, r.island), el("td", { class: r.status }, r.status),
      el("td", { class: "num" }, seconds(r.waited_s)), el("td", { class: "num" }, seconds(r.ran_s)), trace);
  }));
}

function showError(text) {
  const box = document.getElementById("error");
  box.textContent = text;
  box.hidden = !text;
}

async function whoAmI() {
  const r = await fetch("/v1/clients/self", { headers: { Authorization: `Bearer ${credential}` } });
  if (r.status === 401) throw Object.assign(new Error("the credential was refused (401)"), { unauthorized: true });
  if (r.ok) {
    const me = await r.json();
    return { admin: false, name: me.name || me.id };
  }
  return { admin: true, name: "admin" };
}

async function refresh() {
  clearTimeout(timer);
  try {
    me = me || await whoAmI();
    const [islands, devices, slices, runs] = await Promise.all([
      api("/v1/islands"), api("/v1/devices"), api("/v1/slices"), api("/v1/runs?limit=50")]);
    document.getElementById("who").textContent = me.admin ? "admin: every client's work" : `client ${me.name}`;
    renderGrid(islands, devices, slices, me.admin);
    renderSlices(slices, me.admin);
    renderRuns(runs, me.admin);
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.getElementById("view").hidden = false;
    document.body.dataset.ready = "1";
    showError("");
  } catch (e) {
    showError(e.message);
    if (e.unauthorized) { forget(); return; }
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

function forget() {
  clearTimeout(timer);
  sessionStorage.removeItem(KEY);
  credential = null;
  me = null;
  document.getElementById("view").hidden = true;
  document.getElementById("login").hidden = false;
}

function start() {
  // A credential in the address's fragment (#token=...) is taken once and removed from the
  // address: a fragment is never sent to the server, nor kept in its logs.
  const fragment = new URLSearchParams(location.hash.slice(1));
  if (fragment.get("token")) {
    sessionStorage.setItem(KEY, fragment.get("token"));
    history.replaceState(null, "", location.pathname + location.search);
  }
  credential = sessionStorage.getItem(KEY);
  document.getElementById("login").addEventListener("submit", (event) => {
    event.preventDefault();
    credential = document.getElementById("credential").value.trim();
    sessionStorage.setItem(KEY, credential);
    document.getElementById("login").hidden = true;
    refresh();
  });
  document.getElementById("forget").addEventListener("click", forget);
  if (credential) refresh(); else forget();
}

start();
