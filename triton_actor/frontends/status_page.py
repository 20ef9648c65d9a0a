"""The live status page on the HTTP port: ``/status`` (and ``/``) serve one self-contained HTML page whose
script polls ``/status.json`` every second; no build step, nothing fetched from elsewhere.

``/status.json`` is :func:`~..plane.live_status.merge` over ``host.gather("status")``: host-wide with several
workers. The request rate is computed by the page from two answers (the server's clock in each), so the
server keeps no rate state. Views run in the request's greenlet.

The last ``tune --url`` run's report (``plane/tune_report.py``): ``POST /v2/tune/report {"path": DIR}``
tells every worker where it is, the page links it, and ``/tune/report/`` serves that folder read-only.
"""

from __future__ import annotations

import base64
import hashlib
import re

from flask import Flask

from ..errors import TritonError
from ..plane import live_status
from ..plane.dataplane import DataPlane
from ..protocol import payloads
from .http import HttpRequest, Reply, json_reply


def status_routes(app: Flask, plane: DataPlane) -> None:
    @app.get("/status")
    @app.get("/")
    def status_page(req: HttpRequest) -> Reply:
        return "200 OK", _HTML_HEADERS, PAGE

    @app.get("/status.json")
    def status_json(req: HttpRequest) -> Reply:
        return json_reply(live_status.merge(plane.host.gather("status")))

    @app.post("/v2/tune/report")
    def tune_report_register(req: HttpRequest) -> Reply:
        path = payloads.json_object(req.payload()).get("path")
        if not isinstance(path, str):
            raise TritonError.invalid_arg("expected {\"path\": \"<the report folder>\"}")
        return json_reply(plane.host.broadcast("tune.report", {"path": path})[0])

    @app.get("/tune/report/")
    @app.get("/tune/report/<name>")
    def tune_report_file(req: HttpRequest, name: str = "") -> Reply:
        body, content_type = plane.tune_report.file(name)
        headers = [("Content-Type", content_type), ("Cache-Control", "no-store"), *_REPORT_HEADERS]
        return "200 OK", headers, body


PAGE = b"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>triton_actor status</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px system-ui,sans-serif;margin:1.2em;color:#1d232a;background:#f6f7f9}
h1{font-size:20px;margin:0 0 .3em}
#summary{margin-bottom:1em;color:#444}
.pill{display:inline-block;padding:1px 8px;border-radius:9px;font-weight:600;font-size:12px}
.READY{background:#d3f4dc;color:#11652b}.UNAVAILABLE{background:#fbd9d9;color:#8c1d1d}
.LOADING,.UNLOADING,.UNKNOWN{background:#fdf0c9;color:#7a5900}
table{border-collapse:collapse;background:#fff;box-shadow:0 1px 2px #0002;width:100%}
th,td{padding:6px 9px;border-bottom:1px solid #e4e7eb;text-align:right;vertical-align:top}
th{background:#eef1f4;font-size:12px;text-transform:uppercase;letter-spacing:.03em}
td.l,th.l{text-align:left}
.reason{color:#8c1d1d;font-size:12px;max-width:30em;text-align:left}
.hist{display:flex;align-items:flex-end;gap:2px;height:34px}
.hist div{background:#4a7fd6;width:12px;min-height:1px;position:relative}
.hist span{position:absolute;bottom:-14px;left:0;font-size:9px;color:#555}
small{color:#666}
</style></head>
<body data-updates="0">
<h1>triton_actor <small id="server"></small></h1>
<div id="summary">waiting for the first update&hellip;</div>
<table><thead><tr><th class="l">model</th><th>version</th><th class="l">state</th><th>instances</th>
<th>queued</th><th>in flight</th><th>req/s</th><th>success</th><th>fail</th><th>p50 ms</th><th>p90 ms</th>
<th>p99 ms</th><th class="l">batch sizes</th></tr></thead><tbody id="rows"></tbody></table>
<div id="budget"></div>
<p id="tune"></p>
<p><small>Polls <a href="status.json">status.json</a> every second; latency is end to end in the server,
percentiles are bucket upper bounds (buckets at most 25% wide).</small></p>
<script>
"use strict";
let history = [];
const fmt = (x, d) => (x === undefined || x === null) ? "" : Number(x).toFixed(d);
function esc(s) { return String(s).replace(/[&<>"]/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;"})[c]); }
function hist(b) {
  const sizes = Object.keys(b || {}); if (!sizes.length) return "";
  const max = Math.max(...sizes.map(s => b[s]));
  return '<div class="hist">' + sizes.map(s =>
    `<div title="batch ${s}: ${b[s]} executions" style="height:${Math.max(1, 32 * b[s] / max)}px"><span>${s}</span></div>`
  ).join("") + "</div>";
}
function render(st) {
  // request rate: success counts against the newest earlier answer at least half a second older by the
  // server's clock (or the oldest one kept), so it is right however often the page happens to poll
  const now = st.time_ns;
  const counts = Object.fromEntries(st.versions.map(v => [v.name + "/" + v.version, v.success]));
  history = history.filter(h => now - h.time < 3e10);
  const older = history.filter(h => now - h.time >= 5e8);
  const base = older.length ? older[older.length - 1] : history[0];
  const rates = {};
  if (base && now > base.time)
    for (const k in counts) if (k in base.counts) rates[k] = (counts[k] - base.counts[k]) * 1e9 / (now - base.time);
  history.push({time: now, counts: counts});
  document.getElementById("server").textContent = (st.ready ? "ready" : st.live ? "live, not ready" : "down") +
    ` \\u00b7 ${st.workers} worker(s)`;
  document.getElementById("summary").textContent =
    `${st.versions.length} model version(s) \\u00b7 ${st.success} requests served, ${st.fail} failed \\u00b7 updated ` +
    new Date(now / 1e6).toLocaleTimeString();
  document.getElementById("rows").innerHTML = st.versions.map(v => {
    const key = v.name + "/" + v.version, l = v.latency_ms || {};
    const live = v.workers > 0;
    return `<tr data-model="${esc(v.name)}" data-version="${v.version}">` +
      `<td class="l">${esc(v.name)}</td><td>${v.version < 0 ? "" : v.version}</td>` +
      `<td class="l"><span class="pill ${esc(v.state)}">${esc(v.state)}</span>` +
      (v.reason ? `<div class="reason" title="${esc(v.reason)}">${esc(v.reason.split("\\n")[0])}</div>` : "") + "</td>" +
      `<td title="${esc((v.instances || []).join(", "))}">${live ? v.busy_instances + "/" + v.instances.length + " busy" : ""}` +
      `${live && (v.down_instances || []).length ? `<div class="reason" title="${esc(v.down_instances.join(", "))}">` +
        `${v.down_instances.length} down</div>` : ""}</td>` +
      `<td class="queued">${live ? v.queued : ""}</td><td class="inflight">${live ? v.queued + v.running : ""}</td>` +
      `<td class="rate">${!live ? "" : rates[key] === undefined ? "\\u2013" : fmt(rates[key], 1)}</td>` +
      `<td class="success">${live ? v.success : ""}</td><td>${live ? v.fail : ""}</td>` +
      `<td class="p50">${live && v.success ? fmt(l.p50, 3) : ""}</td><td>${live && v.success ? fmt(l.p90, 3) : ""}</td>` +
      `<td class="p99">${live && v.success ? fmt(l.p99, 3) : ""}</td><td class="l">${hist(v.batches)}</td></tr>`;
  }).join("");
  document.getElementById("budget").innerHTML = budget(st.memory_budget);
  const t = st.tune_report;  // the last `triton-actor tune --url` run (plane/tune_report.py)
  document.getElementById("tune").innerHTML = t ? `last tuning run (${esc(t.model)}): ` +
    `<a id="tune-report" href="${esc(t.url)}">report</a> <small>${esc(t.verdict)}</small>` : "";
  document.body.dataset.updates = String(Number(document.body.dataset.updates) + 1);
}
function budget(b) {  // --model-memory-budget: resident models, least recently used first, and the last evictions
  if (!b) return "";
  const mib = n => fmt(n / 1048576, 1) + " MiB";
  const draining = b.draining_bytes ? ` (${mib(b.draining_bytes)} of reloads draining)` : "";
  return `<h2 style="font-size:16px">memory budget: ${mib(b.used)} of ${mib(b.limit)}${draining} \\u00b7 ${b.loads} loads, ` +
    `${b.evictions} evictions, ${b.refusals} refused</h2><table><thead><tr><th class="l">resident (LRU first)</th>` +
    `<th>bytes</th><th>idle s</th><th>load s</th></tr></thead><tbody id="lru">` +
    b.lru.map(m => `<tr><td class="l">${esc(m.model)}</td><td>${mib(m.bytes)}</td><td>${fmt(m.idle_secs, 1)}</td>` +
      `<td>${fmt(m.load_secs, 2)}</td></tr>`).join("") + "</tbody></table><p><small>pinned: " +
    esc(b.pinned.join(", ") || "none") + " \\u00b7 last evictions: " +
    esc(b.recent_evictions.map(e => `${e.model} (${mib(e.bytes)}) for ${e.for}`).join(", ") || "none") + "</small></p>";
}
async function poll() {
  try {
    const r = await fetch("status.json", {cache: "no-store"});
    if (r.ok) render(await r.json());
    else document.getElementById("summary").textContent = "status.json answered " + r.status;
  } catch (e) {
    document.getElementById("summary").textContent = "server unreachable: " + e;
  }
  setTimeout(poll, 1000);
}
poll();
</script></body></html>
"""


def _csp(page: bytes) -> str:
    """The page's Content-Security-Policy: nothing loads but its own inline script (by its hash) and
    fetches of this origin (``/status.json``), so text a client controls that reaches the page (model
    names, load errors; escaped already) could not run a script even if escaping failed. Styles stay
    inline, style attributes included: the batch histogram sets bar heights in them."""
    script = re.search(rb"<script>(.*?)</script>", page, re.S).group(1)
    digest = base64.b64encode(hashlib.sha256(script).digest()).decode()
    return (f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; connect-src 'self'; "
            "img-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


# a report page has no script and shows its own PNG plots; the rest as the status page
_REPORT_HEADERS = [("Content-Security-Policy", "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; "
                    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
                   ("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", "no-referrer")]
_HTML_HEADERS = [("Content-Type", "text/html; charset=utf-8"), ("Cache-Control", "no-store"),
                 ("Content-Security-Policy", _csp(PAGE)), ("X-Content-Type-Options", "nosniff"),
                 ("Referrer-Policy", "no-referrer")]
