// The Prorsa console: runs, one run (demand vs forecast, engines per role, switches,
// trajectories by state), one trajectory's history; live updates from the tracker's stream.
"use strict";
(function () {
  const $main = document.getElementById("main"), $live = document.getElementById("live");
  const $crumbs = document.getElementById("crumbs"), $logout = document.getElementById("logout");
  const KEY = "prorsa-console-token", PAGE = 50;
  const {lineChart, compact} = window.ProrsaChart;
  let streamAbort = null, refreshTimer = null, view = null;
  const feedLines = [];  // the live notices of the run shown (kept across re-renders)
  function drawFeed() {
    const feed = document.getElementById("feed");
    if (!feed || !feedLines.length) return;
    feed.classList.remove("muted");
    feed.replaceChildren(...feedLines.map(t => { const d = document.createElement("div"); d.textContent = t; return d; }));
  }

  // --- the token: ?token=... once (then removed from the address), else a form ---------
  const params = new URLSearchParams(location.search);
  if (params.has("token")) {
    sessionStorage.setItem(KEY, params.get("token"));
    params.delete("token");
    const q = params.toString();
    history.replaceState(null, "", location.pathname + (q ? "?" + q : "") + location.hash);
  }
  const token = () => sessionStorage.getItem(KEY);
  $logout.onclick = () => { sessionStorage.removeItem(KEY); route(); };

  class AuthError extends Error {}
  async function api(path) {
    const headers = token() ? {Authorization: "Bearer " + token()} : {};
    const r = await fetch(path, {headers});
    if (r.status === 401) throw new AuthError("the token was refused");
    if (!r.ok) {
      let msg = r.statusText;
      try { msg = (await r.json()).detail || msg; } catch (e) { /* not JSON */ }
      throw new Error(`${r.status}: ${typeof msg === "string" ? msg : JSON.stringify(msg)}`);
    }
    return r.json();
  }

  function showLogin(message) {
    stopStream();
    $main.innerHTML = "";
    $main.appendChild(document.getElementById("login").content.cloneNode(true));
    document.getElementById("login-error").textContent = message || "";
    document.getElementById("login-form").onsubmit = ev => {
      ev.preventDefault();
      sessionStorage.setItem(KEY, document.getElementById("token").value);
      route();
    };
  }

  // --- helpers ----------------------------------------------------------------------------
  const esc = s => String(s ?? "").replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  const enc = encodeURIComponent;
  function fmtTs(ts) {
    if (ts === null || ts === undefined) return "";
    if (ts > 1e9) return new Date(ts * 1000).toISOString().replace("T", " ").replace(/\.(\d{3})Z$/, ".$1");
    return ts.toFixed(3) + " s";
  }
  const num = (v, d = 0) => v === null || v === undefined ? "" : Number(v).toLocaleString("en-US", {maximumFractionDigits: d});
  function table(rows, cols) {
    if (!rows.length) return '<p class="muted">none</p>';
    const head = cols.map(c => `<th class="${c.num ? "num" : ""}">${esc(c.label)}</th>`).join("");
    const body = rows.map(r => "<tr>" + cols.map(c => `<td class="${c.num ? "num" : ""}">${c.html ? c.html(r) : esc(c.get ? c.get(r) : r[c.key])}</td>`).join("") + "</tr>").join("");
    return `<table><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>`;
  }
  function crumbs(parts) {
    $crumbs.innerHTML = parts.map(([label, href]) => href ? `<a href="${href}">${esc(label)}</a>` : esc(label)).join(" / ");
  }
  function setLive(cls, text) { $live.className = "live " + cls; $live.textContent = text; }

  // --- the live stream (fetch, so the token goes in a header) ---------------------------
  function stopStream() {
    if (streamAbort) streamAbort.abort();
    streamAbort = null;
    clearTimeout(refreshTimer);
  }
  async function startStream(run, onBatch) {
    stopStream();
    const ctl = new AbortController();
    streamAbort = ctl;
    let received = 0;
    try {
      const r = await fetch(`/console/api/runs/${enc(run)}/stream`, {headers: {Authorization: "Bearer " + token()}, signal: ctl.signal});
      if (!r.ok) { setLive("off", r.status === 503 ? "not live (API without ingest)" : "not live"); return; }
      setLive("on", "live");
      const reader = r.body.getReader(), dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buf += dec.decode(value, {stream: true});
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, i); buf = buf.slice(i + 2);
          let event = "message", data = "";
          for (const line of block.split("\n")) {
            if (line.startsWith("event: ")) event = line.slice(7);
            else if (line.startsWith("data: ")) data += line.slice(6);
          }
          if (!data) continue;
          const msg = JSON.parse(data);
          if (event === "batch") { received += msg.n; setLive("on", `live: ${num(received)} events`); onBatch(msg); }
          else if (event === "dropped") { setLive("warn", `live: ${msg.dropped} notices dropped (slow reader)`); onBatch(null); }
        }
      }
      setLive("off", "stream closed");
    } catch (e) {
      if (ctl.signal.aborted) return;
      setLive("off", "stream lost");
    }
    if (streamAbort === ctl) setTimeout(() => { if (streamAbort === ctl) startStream(run, onBatch); }, 3000);
  }
  function refreshSoon(fn) { clearTimeout(refreshTimer); refreshTimer = setTimeout(fn, 1000); }

  // --- views ------------------------------------------------------------------------------
  async function runsView() {
    crumbs([["runs"]]);
    const data = await api("/console/api/runs");
    setLive(data.live ? "on" : "off", data.live ? "live" : "not live");
    const rollout = data.runs.filter(r => r.rollout), other = data.runs.filter(r => !r.rollout);
    const cols = [
      {label: "run", html: r => `<a href="#/run/${enc(r.run)}">${esc(r.run)}</a>`},
      {label: "mode", key: "mode"}, {label: "batch", key: "batch_size", num: true},
      {label: "dispatched", key: "dispatched", num: true}, {label: "live", key: "live", num: true},
      {label: "done", key: "done", num: true}, {label: "dropped", key: "dropped", num: true},
      {label: "admitted", key: "admitted", num: true}, {label: "first event", get: r => fmtTs(r.first_ts)},
      {label: "last event", get: r => fmtTs(r.last_ts)}];
    $main.innerHTML = `<section class="card"><h2>Runs</h2>${table(rollout, cols)}</section>` +
      (other.length ? `<section class="card"><h2>Service labels</h2><p class="muted">Engine agents and services publish under these when they follow no rollout run.</p>${table(other, cols)}</section>` : "");
  }

  async function runView(run, state, offset) {
    crumbs([["runs", "#/"], [run]]);
    const [ov, win, eng, sw] = await Promise.all([
      api(`/console/api/runs/${enc(run)}`), api(`/console/api/runs/${enc(run)}/windows`),
      api(`/console/api/runs/${enc(run)}/engines`), api(`/console/api/runs/${enc(run)}/switches`)]);
    const qs = new URLSearchParams({limit: PAGE, offset: offset || 0});
    if (state) qs.set("state", state);
    const trajs = await api(`/v1/runs/${enc(run)}/trajectories?${qs}`);
    const h = ov.run, t0 = h.first_ts ?? 0, rel = x => compact(x - t0) + "s";
    const total = Object.values(ov.states).reduce((a, b) => a + b, 0);
    const stat = (k, v) => `<div><span>${esc(k)}</span><b>${esc(v)}</b></div>`;
    const lastStep = eng.steps.length ? eng.steps[eng.steps.length - 1] : {prefill: 0, decode: 0, mixed: 0, switching: 0};
    $main.innerHTML = `
      <section class="card"><h2 id="run-title">Run ${esc(run)}</h2><div class="stats">
        ${stat("mode", h.mode + (h.batch_size ? ` · batch ${h.batch_size}` : ""))}${stat("dispatched", num(h.dispatched))}
        ${stat("live", num(h.live))}${stat("done", num(h.done))}${stat("dropped", num(h.dropped))}
        ${stat("admitted", num(h.admitted))}${stat("policy version", h.policy_version ?? "")}
        ${stat("engines now", `${lastStep.prefill}P : ${lastStep.decode}D` + (lastStep.switching ? ` (+${lastStep.switching} switching)` : ""))}
        ${stat("last event", fmtTs(h.last_ts))}</div></section>
      <div class="grid">
        <section class="card"><h2>Prefill demand per ${win.horizon} s window (tokens)</h2><div id="c-prefill"></div></section>
        <section class="card"><h2>Decode admissions per window (tokens)</h2><div id="c-admit"></div></section>
        <section class="card"><h2>Decode KV: in decode at window start, forecast demand (tokens)</h2><div id="c-kv"></div></section>
        <section class="card"><h2>Engines per role</h2><div id="c-engines"></div></section>
      </div>
      <section class="card" id="switches"><h2>Role switches (${sw.switches.length})</h2>${table(sw.switches, [
        {label: "commanded", get: r => fmtTs(r.ts)}, {label: "engine", key: "engine"},
        {label: "from → to", get: r => `${r.from_role ?? "?"} → ${r.to_role}`}, {label: "reason", key: "reason"},
        {label: "outcome", key: "outcome"}, {label: "switch s", num: true, get: r => num(r.seconds, 2)},
        {label: "command → done s", num: true, get: r => num(r.elapsed_s, 2)}, {label: "mode", key: "mode"}])}</section>
      <section class="card"><h2>Trajectories by state (${num(total)})</h2><div class="badges" id="states">
        <span class="badge ${state ? "" : "sel"}" data-state="">all<b>${num(total)}</b></span>
        <span class="badge ${state === "live" ? "sel" : ""}" data-state="live">live<b>${num(h.live)}</b></span>
        ${Object.entries(ov.states).map(([s, n]) => `<span class="badge ${state === s ? "sel" : ""}" data-state="${esc(s)}">${esc(s)}<b>${num(n)}</b></span>`).join("")}
      </div><div id="trajs">${table(trajs.items, [
        {label: "trajectory", html: r => `<a href="#/run/${enc(run)}/traj/${enc(r.traj)}">${esc(r.traj)}</a>`},
        {label: "state", key: "state"}, {label: "dispatched", get: r => fmtTs(r.dispatched_ts)},
        {label: "ended", get: r => fmtTs(r.ended_ts)}, {label: "turns", key: "turns", num: true},
        {label: "context tokens", num: true, get: r => num(r.context_tokens)}, {label: "group", key: "group"},
        {label: "reward", num: true, get: r => num(r.reward, 3)}, {label: "drop", key: "drop_reason"}])}
      <div class="pager">${offset ? `<a href="#/run/${enc(run)}?state=${enc(state || "")}&offset=${Math.max(0, offset - PAGE)}">← previous</a>` : ""}
        <span class="muted">${num((offset || 0) + 1)}–${num((offset || 0) + trajs.items.length)}</span>
        ${trajs.next_offset !== null ? `<a href="#/run/${enc(run)}?state=${enc(state || "")}&offset=${trajs.next_offset}">next →</a>` : ""}</div></div></section>
      <section class="card"><h2>Live events</h2><div id="feed" class="muted">waiting for the tracker to commit events of this run…</div></section>`;
    drawFeed();
    for (const b of document.querySelectorAll("#states .badge"))
      b.onclick = () => { location.hash = `#/run/${enc(run)}?state=${enc(b.dataset.state)}`; };
    const W = win.windows, xr = {xmin: W.length ? W[0].t : undefined, xfmt: rel};
    const series = (key, fkey, name) => [
      {name: "actual", color: "var(--prefill)", points: W.map(w => [w.t, w[key]])},
      {name: `forecast (${name})`, color: "var(--forecast)", dashed: true, points: W.filter(w => w.forecast).map(w => [w.t, fkey(w.forecast)])}];
    lineChart(document.getElementById("c-prefill"), {...xr, series: series("prefill_tokens", f => f.prefill_tokens, "Ŵᴾ")});
    lineChart(document.getElementById("c-admit"), {...xr, series: series("decode_admit_tokens", f => f.decode_admit_tokens, "Âᴰ")});
    lineChart(document.getElementById("c-kv"), {...xr, series: series("decode_kv_tokens", f => f.decode_kv_now + f.decode_kv_tokens, "Kᴰ+K̂ᴰ")});
    lineChart(document.getElementById("c-engines"), {xfmt: rel, integer: true, xmax: Math.max(h.last_ts ?? 0, ...eng.steps.map(s => s.ts)), series: [
      {name: "prefill", color: "var(--prefill)", step: true, points: eng.steps.map(s => [s.ts, s.prefill])},
      {name: "decode", color: "var(--decode)", step: true, points: eng.steps.map(s => [s.ts, s.decode])},
      {name: "switching", color: "var(--switching)", step: true, points: eng.steps.map(s => [s.ts, s.switching])},
      {name: "mixed", color: "var(--mixed)", step: true, points: eng.steps.some(s => s.mixed) ? eng.steps.map(s => [s.ts, s.mixed]) : []}]});
  }

  async function trajView(run, traj) {
    crumbs([["runs", "#/"], [run, `#/run/${enc(run)}`], [traj]]);
    const d = await api(`/console/api/runs/${enc(run)}/trajectories/${enc(traj)}`);
    const t = d.trajectory;
    $main.innerHTML = `
      <section class="card"><h2 id="traj-title">Trajectory ${esc(traj)}</h2><div class="stats">
        <div><span>state</span><b>${esc(t.state)}</b></div><div><span>turns</span><b>${num(t.turns)}</b></div>
        <div><span>context tokens</span><b>${num(t.context_tokens)}</b></div><div><span>dispatched</span><b>${esc(fmtTs(t.dispatched_ts))}</b></div>
        <div><span>ended</span><b>${esc(fmtTs(t.ended_ts))}</b></div><div><span>reward</span><b>${esc(num(t.reward, 3))}</b></div></div></section>
      <section class="card"><h2>States</h2>${table(d.timeline, [{label: "time", get: r => fmtTs(r.ts)}, {label: "event", key: "event"},
        {label: "from", key: "from"}, {label: "to", key: "to"}, {label: "context", num: true, get: r => num(r.context_tokens)}, {label: "request", key: "req"}])}</section>
      <section class="card"><h2>Requests</h2>${table(d.requests, [{label: "request", key: "req"}, {label: "turn", key: "turn", num: true},
        {label: "prompt", num: true, get: r => num(r.prompt_tokens)}, {label: "cached", num: true, get: r => num(r.cached_tokens)},
        {label: "output", num: true, get: r => num(r.output_tokens)}, {label: "queue s", num: true, get: r => num(r.queue_s, 3)},
        {label: "ttft s", num: true, get: r => num(r.ttft_s, 3)}, {label: "decode s", num: true, get: r => num(r.decode_s, 3)},
        {label: "finish", key: "finish"}, {label: "prefill engine", key: "engine"}, {label: "decode engine", key: "decode_engine"}])}</section>
      <section class="card"><h2>Events (${d.events.length}, in the order applied)</h2>${table(d.events, [{label: "time", get: r => fmtTs(r.ts)},
        {label: "type", key: "type"}, {label: "id", key: "id"},
        {label: "fields", html: r => `<pre>${esc(JSON.stringify(Object.fromEntries(Object.entries(r).filter(([k]) => !["v", "id", "type", "ts", "run", "traj"].includes(k)))))}</pre>`}])}</section>
      ${d.anomalies.length ? `<section class="card"><h2>Anomalies</h2>${table(d.anomalies, [{label: "time", get: r => fmtTs(r.ts)}, {label: "type", key: "type"}, {label: "reason", key: "reason"}])}</section>` : ""}`;
  }

  // --- routing ----------------------------------------------------------------------------
  async function route() {
    if (!token()) { showLogin(); return; }
    $logout.hidden = false;
    const [path, query] = location.hash.replace(/^#/, "").split("?");
    const q = new URLSearchParams(query || ""), parts = (path || "/").split("/").filter(Boolean).map(decodeURIComponent);
    const key = parts.slice(0, 2).join("/") + (parts[2] === "traj" ? "/" + parts[3] : "");
    const render = async () => {
      if (parts[0] === "run" && parts[2] === "traj") await trajView(parts[1], parts[3]);
      else if (parts[0] === "run") await runView(parts[1], q.get("state") || "", Number(q.get("offset") || 0));
      else await runsView();
    };
    try {
      await render();
      if (parts[0] === "run" && view !== key) {
        view = key;
        feedLines.length = 0;
        startStream(parts[1], msg => {
          if (msg) {
            feedLines.unshift(`${fmtTs(msg.ts)}  ${msg.run}  ${Object.entries(msg.types).map(([t, n]) => `${t}×${n}`).join(" ")}`);
            feedLines.length = Math.min(feedLines.length, 100);
            drawFeed();
          }
          if (parts[2] === "traj" && msg && msg.run === parts[1] && !msg.trajs.includes(parts[3]) && msg.trajs.length < 50) return;
          refreshSoon(() => render().catch(() => {}));
        });
      } else if (parts[0] !== "run") { view = null; stopStream(); }
    } catch (e) {
      if (e instanceof AuthError) { sessionStorage.removeItem(KEY); showLogin(e.message); }
      else $main.innerHTML = `<p class="error">${esc(e.message)}</p>`;
    }
  }
  window.addEventListener("hashchange", route);
  route();
})();
