// SeamlessFlow dashboard: polls /api/panels every refresh_s seconds and redraws each panel as inline SVG.
// The server does the querying (one function per panel in infra/dashboard/panels.py); this file only draws.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#3b7dd8", "#e8743b", "#19a979", "#ed4a7b", "#945ecf", "#13a4b4", "#d6a400", "#6c8893"];
const ACTIVITY_COLORS = {rollout: "#3b7dd8", train: "#e8743b", weight_sync: "#945ecf", idle: "#d5dbe1",
                         offline: "#6b7480", reference: "#19a979", critic: "#13a4b4"};
let refreshMs = 3000;
let selectedTrajectory = null;

function h(tag, attrs = {}, ...children) {
  const isSvg = ["svg", "g", "rect", "line", "path", "text", "circle", "title", "polyline"].includes(tag);
  const node = isSvg ? document.createElementNS(SVG_NS, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null) node.setAttribute(k, v);
  for (const c of children.flat()) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function fmt(v, digits = 3) {
  if (v === null || v === undefined) return "–";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v)) return v.toLocaleString("en-US");
  return Number(v.toPrecision(digits)).toString();
}

const clock = ms => new Date(ms).toISOString().slice(11, 19);
const colorOf = (key, keys) => PALETTE[Math.max(keys.indexOf(key), 0) % PALETTE.length];

function versionColor(v, maxVersion) {
  if (v < 0) return "#9aa3ad";
  const t = maxVersion > 0 ? v / maxVersion : 0;  // dark blue (oldest) to yellow (newest)
  return `hsl(${230 - 180 * t}, 70%, ${35 + 25 * t}%)`;
}

function empty(container, text) {
  container.replaceChildren(h("div", {class: "empty"}, text));
}

function legend(items) {
  return h("div", {class: "legend"}, items.map(([label, color]) => h("span", {}, h("i", {style: `background:${color}`}), label)));
}

function ticks(lo, hi, n = 5) {
  if (hi <= lo) return [lo];
  const step0 = (hi - lo) / n, mag = 10 ** Math.floor(Math.log10(step0));
  const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= step0);
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + 1e-9; t += step) out.push(Number(t.toPrecision(12)));
  return out;
}

// A chart frame: scales for [x0, x1] x [y0, y1] and the axes; returns {svg, x, y}.
// xTicks: [[x, label]] instead of evenly spaced numbers (categories).
function frame({x0, x1, y0, y1, width = 540, height = 190, xFormat = fmt, yFormat = fmt, xLabel = "", yLabel = "",
                xTicks = null}) {
  const m = {l: 46, r: 12, t: yLabel ? 16 : 8, b: 30};
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { y0 -= 1; y1 += 1; }
  const yTicks = ticks(y0, y1);
  if (yTicks.length > 1 && yTicks[yTicks.length - 1] < y1) y1 = 2 * yTicks[yTicks.length - 1] - yTicks[yTicks.length - 2];
  const x = v => m.l + (v - x0) / (x1 - x0) * (width - m.l - m.r);
  const y = v => height - m.b - (v - y0) / (y1 - y0) * (height - m.t - m.b);
  const svg = h("svg", {viewBox: `0 0 ${width} ${height}`, height});
  for (const t of ticks(y0, y1)) {
    svg.append(h("line", {x1: m.l, x2: width - m.r, y1: y(t), y2: y(t), stroke: "#e6e9ed"}),
               h("text", {x: m.l - 4, y: y(t) + 3, "text-anchor": "end"}, yFormat(t)));
  }
  for (const [t, label] of xTicks || ticks(x0, x1, 6).map(t => [t, xFormat(t)])) {
    svg.append(h("text", {x: x(t), y: height - m.b + 13, "text-anchor": "middle"}, label));
  }
  svg.append(h("line", {x1: m.l, x2: width - m.r, y1: height - m.b, y2: height - m.b, stroke: "#8a94a0"}));
  if (xLabel) svg.append(h("text", {x: width - m.r, y: height - 3, "text-anchor": "end"}, xLabel));
  if (yLabel) svg.append(h("text", {x: 4, y: 9}, yLabel));
  return {svg, x, y};
}

// series: [{name, color, points: [[x, y]], dots}] on one y axis.
function lineChart(container, series, opts = {}) {
  const pts = series.flatMap(s => s.points).filter(p => p[1] !== null);
  if (!pts.length) return empty(container, opts.emptyText || "no data yet");
  const xs = pts.map(p => p[0]), ys = pts.map(p => p[1]);
  const f = frame({x0: Math.min(...xs), x1: Math.max(...xs), y0: Math.min(0, ...ys), y1: Math.max(...ys), ...opts});
  for (const s of series) {
    const good = s.points.filter(p => p[1] !== null);
    if (!s.dots) {
      f.svg.append(h("polyline", {fill: "none", stroke: s.color, "stroke-width": 1.8,
                                  points: good.map(p => `${f.x(p[0])},${f.y(p[1])}`).join(" ")}));
    }
    for (const p of good) {
      f.svg.append(h("circle", {cx: f.x(p[0]), cy: f.y(p[1]), r: s.dots ? 3.5 : 2, fill: s.color},
                     h("title", {}, `${s.name}: ${fmt(p[1])} at ${(opts.xFormat || fmt)(p[0])}`)));
    }
  }
  container.replaceChildren(f.svg, legend(series.map(s => [s.name, s.color])));
}

// bars: [{x, y, dark}] with x a number (bin start, or an integer category) and width in x units.
function barChart(container, bars, {barWidth = 1, categorical = false, emptyText = "no data yet", ...opts} = {}) {
  if (!bars.length) return empty(container, emptyText);
  const xTicks = categorical ? bars.map(b => [b.x + barWidth / 2, fmt(b.x)]) : null;
  const f = frame({x0: Math.min(...bars.map(b => b.x)), x1: Math.max(...bars.map(b => b.x)) + barWidth,
                   y0: 0, y1: Math.max(...bars.map(b => b.y)), xTicks, ...opts});
  for (const b of bars) {
    const x = f.x(b.x) + 1, w = Math.max(f.x(b.x + barWidth) - f.x(b.x) - 2, 1);
    f.svg.append(h("rect", {x, y: f.y(b.y), width: w, height: f.y(0) - f.y(b.y), fill: opts.color || PALETTE[0]},
                        h("title", {}, b.title || `${fmt(b.x)}: ${fmt(b.y)}`)));
    if (b.dark) f.svg.append(h("rect", {x, y: f.y(b.dark), width: w, height: f.y(0) - f.y(b.dark), fill: "#1d2733"}));
  }
  container.replaceChildren(f.svg);
}

function table(columns, rows) {
  return h("table", {}, h("tr", {}, columns.map(c => h("th", {}, c[1]))),
           rows.map(r => h("tr", {}, columns.map(c => h("td", {}, fmt(r[c[0]]))))));
}

function drawStats(s) {
  const items = [["trajectories", s.trajectories], ["LLM calls", s.llm_calls], ["tokens generated", s.generated_tokens],
                 ["train steps", s.train_steps], ["last step", s.last_step], ["last reward", s.last_reward],
                 ["newest weights", s.newest_version]];
  const ids = ["trajectories", "calls", "tokens", "steps", "last-step", "last-reward", "version"];
  document.getElementById("stats").replaceChildren(...items.map(([label, v], i) =>
    h("div", {class: "stat"}, h("b", {id: `stat-${ids[i]}`}, fmt(v, 4)), h("span", {}, label))));
}

function drawReward(p) {
  const el = document.getElementById("panel-reward");
  lineChart(el, [
    {name: "reward (train step)", color: PALETTE[0], points: p.steps.map(r => [r.step, r.reward])},
    {name: "loss", color: PALETTE[1], points: p.steps.map(r => [r.step, r.loss])},
    {name: "rollout reward by version", color: PALETTE[2], dots: true,
     points: p.rollout.filter(r => r.policy_version >= 0).map(r => [r.policy_version, r.reward])},
  ], {xLabel: "train step / policy version", emptyText: "no train steps or trajectories yet"});
}

function drawEval(p) {
  const names = Object.keys(p.series);
  const el = document.getElementById("panel-eval");
  if (!names.length) return empty(el, "no eval events");
  lineChart(el, names.map(n => ({name: n, color: colorOf(n, names), points: p.series[n]})), {xFormat: clock});
}

function drawThroughput(p) {
  const resources = [...new Set(p.buckets.map(b => b.resource))].sort();
  const starts = p.buckets.map(b => b.start_ms), step = p.buckets.length ? p.buckets[0].bucket_ms : 1;
  const all = [];  // every bucket of the span: one where no segment ended is 0 tokens/s, not a line across it
  for (let t = Math.min(...starts); t <= Math.max(...starts); t += step) all.push(t);
  lineChart(document.getElementById("panel-throughput"), resources.map(r => {
    const rate = new Map(p.buckets.filter(b => b.resource === r).map(b => [b.start_ms, b.tokens_per_s]));
    return {name: r, color: colorOf(r, resources), points: all.map(t => [t, rate.get(t) || 0])};
  }), {xFormat: clock, yLabel: "tokens/s", emptyText: "no LLM calls yet"});
}

function drawLength(p) {
  const el = document.getElementById("panel-length");
  const width = p.bins.length ? p.bins[0].width : 1;
  barChart(el, p.bins.map(b => ({x: b.lo, y: b.calls, dark: b.cut,
                                 title: `${b.lo}–${b.lo + b.width - 1} tokens: ${b.calls} calls, ${b.cut} cut`})),
           {barWidth: width, xLabel: "output tokens", yLabel: "calls", emptyText: "no LLM calls yet"});
  if (p.by_version.length) el.append(table([["policy_version", "policy version"], ["calls", "calls"],
                                            ["mean_tokens", "mean output tokens"]], p.by_version));
}

function drawGantt(p) {
  const el = document.getElementById("panel-gantt");
  if (!p.spans.length) return empty(el, "no activity transitions yet");
  const resources = [...new Set(p.spans.map(s => s.resource))].sort();
  const t0 = Math.min(...p.spans.map(s => s.start_ms)), t1 = Math.max(...p.spans.map(s => s.end_ms));
  const row = 22, width = 1100, m = {l: 46, r: 12};
  const height = resources.length * row + 26;
  const x = v => m.l + (v - t0) / Math.max(t1 - t0, 1) * (width - m.l - m.r);
  const svg = h("svg", {viewBox: `0 0 ${width} ${height}`, height, id: "gantt-svg"});
  resources.forEach((r, i) => svg.append(h("text", {x: m.l - 4, y: i * row + 15, "text-anchor": "end"}, r)));
  for (const s of p.spans) {
    const i = resources.indexOf(s.resource);
    svg.append(h("rect", {x: x(s.start_ms), y: i * row + 3, width: Math.max(x(s.end_ms) - x(s.start_ms), 0.5),
                          height: row - 6, fill: ACTIVITY_COLORS[s.activity] || "#c9a227", "data-activity": s.activity},
                  h("title", {}, `${s.resource} ${s.activity} ${clock(s.start_ms)}–${clock(s.end_ms)} ` +
                                 `(${fmt((s.end_ms - s.start_ms) / 1000)} s)`)));
  }
  for (const t of ticks(t0, t1, 8)) svg.append(h("text", {x: x(t), y: height - 6, "text-anchor": "middle"}, clock(t)));
  const seen = [...new Set(p.spans.map(s => s.activity))];
  el.replaceChildren(svg, legend(seen.map(a => [a, ACTIVITY_COLORS[a] || "#c9a227"])));
}

function drawStaleness(p) {
  const el = document.getElementById("panel-staleness");
  let last = p.tokens.length - 1;
  while (last > 0 && p.tokens[last].tokens === 0) last--;
  const tokens = h("div"), trajs = h("div");
  barChart(tokens, p.tokens.slice(0, last + 1).map(r => ({x: r.staleness, y: r.tokens})),
           {xLabel: "staleness (versions)", yLabel: "tokens", height: 130, categorical: true, emptyText: "no train steps yet"});
  barChart(trajs, p.trajectories.map(r => ({x: r.staleness, y: r.trajectories})),
           {xLabel: "staleness (versions)", yLabel: "trajectories", height: 130, color: PALETTE[2], categorical: true,
            emptyText: "no trajectory trained yet"});
  el.replaceChildren(tokens, trajs);
}

function drawDrift(p) {
  const el = document.getElementById("panel-drift");
  if (!p.agents.length) return empty(el, "no LLM calls yet");
  el.replaceChildren(table([["agent", "agent"], ["calls", "calls"], ["drift_calls", "drift calls"],
                            ["drift_rate", "drift rate"], ["sessions", "sessions"],
                            ["sessions_with_drift", "sessions with drift"]], p.agents));
}

function drawPicker(p) {
  const select = document.getElementById("trajectory-select");
  const current = selectedTrajectory || (p.items[0] && p.items[0].trajectory_id);
  const ids = p.items.map(t => t.trajectory_id).join(" ");
  if (select.dataset.ids !== ids) {  // rebuilt only when the list changed: an open list stays usable
    select.dataset.ids = ids;
    select.replaceChildren(...p.items.map(t => h("option", {value: t.trajectory_id},
      `${t.trajectory_id.slice(0, 14)}  ${t.agent_id}  reward ${fmt(t.reward)}  ${t.num_calls} calls  ` +
      `v${t.min_version}–v${t.max_version}  ${t.status}`)));
  }
  if (current) select.value = current;
  if (current && current !== selectedTrajectory) showSession(current);
}

async function showSession(id) {
  selectedTrajectory = id;
  const el = document.getElementById("session");
  const res = await fetch(`api/session/${encodeURIComponent(id)}`);
  if (!res.ok) return empty(el, (await res.json()).detail);
  drawSession(el, await res.json());
}

function drawSession(el, s) {
  const maxVersion = Math.max(0, ...s.calls.flatMap(c => c.versions.map(v => v[2])));
  const longest = Math.max(1, ...s.calls.map(c => c.new_prompt_tokens + c.output_tokens));
  const row = 34, indent = 18, width = 1100, barArea = width - 40 - indent * 4;
  const perToken = Math.min(6, barArea / longest);
  const svg = h("svg", {viewBox: `0 0 ${width} ${s.calls.length * row + 4}`, height: s.calls.length * row + 4});
  s.calls.forEach((c, i) => {
    const g = h("g", {class: "call", "data-call-id": c.call_id, "data-output-tokens": c.output_tokens,
                      "data-versions": c.versions.map(v => `${v[2]}x${v[1]}`).join(" ")});
    const x0 = 8 + c.depth * indent, y0 = i * row;
    if (c.depth) g.append(h("path", {d: `M${x0 - indent + 4},${y0 - 8} V${y0 + 20} H${x0 - 2}`, fill: "none", stroke: "#aab3bd"}));
    const runs = c.versions.map(v => `v${v[2]}×${v[1]}`).join(" ");
    g.append(h("text", {x: x0, y: y0 + 11, class: "call-label"},
      `turn ${c.turn} · ${c.call_id.slice(0, 10)} · +${c.new_prompt_tokens} prompt · ${c.output_tokens} out (${runs})` +
      ` · ${c.finish_reason}${c.drift ? " · DRIFT" : ""} · ${c.resource_id} · ${c.latency_ms} ms`));
    const pw = c.new_prompt_tokens * perToken;
    g.append(h("rect", {x: x0, y: y0 + 15, width: Math.max(pw, 0), height: 12, fill: "#d5dbe1"},
               h("title", {}, `${c.new_prompt_tokens} prompt tokens this call adds`)));
    for (const [start, n, v] of c.versions) {
      g.append(h("rect", {x: x0 + pw + start * perToken, y: y0 + 15, width: n * perToken, height: 12,
                          fill: versionColor(v, maxVersion), class: "version-run", "data-version": v},
                 h("title", {}, `output tokens ${start}–${start + n - 1}: policy version ${v}`)));
      if (perToken >= 3) {  // token boundaries, when tokens are wide enough to tell apart
        for (let k = 1; k < n; k++) {
          const tx = x0 + pw + (start + k) * perToken;
          g.append(h("line", {x1: tx, x2: tx, y1: y0 + 15, y2: y0 + 27, stroke: "#fff", "stroke-opacity": 0.5}));
        }
      }
    }
    svg.append(g);
  });
  const versions = [...new Set(s.calls.flatMap(c => c.versions.map(v => v[2])))].sort((a, b) => a - b);
  el.replaceChildren(
    h("p", {class: "note", id: "session-head"},
      `session ${s.session_id} · agent ${s.agent_id} · task ${s.task_id} · reward ${fmt(s.reward)} · ${s.status} · ` +
      `${s.num_calls} calls · ${s.tokens_in_tree} tokens in the tree (${s.tokens_in_calls} in the calls) · ` +
      `drift calls ${s.drift_calls}`),
    svg, legend([["prompt tokens added", "#d5dbe1"], ...versions.map(v => [`version ${v}`, versionColor(v, maxVersion)])]));
}

function setStatus(text, error = false) {
  const el = document.getElementById("status");
  el.textContent = text;
  el.className = error ? "error" : "";
}

async function refresh() {
  try {
    const res = await fetch("api/panels");
    const data = await res.json();
    if (!res.ok) throw new Error(data.detail || res.statusText);
    refreshMs = data.refresh_s * 1000;
    drawStats(data.summary);
    drawReward(data.reward);
    drawEval(data.eval);
    drawThroughput(data.throughput);
    drawLength(data.response_length);
    drawGantt(data.gantt);
    drawStaleness(data.staleness);
    drawDrift(data.drift);
    drawPicker(data.trajectories);
    document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
    setStatus(`updated ${clock(data.now_ms)} UTC · store read in ${fmt(data.read_ms)} ms · every ${data.refresh_s} s`);
  } catch (e) {
    setStatus(`not updated: ${e.message}`, true);
  }
  setTimeout(refresh, refreshMs);
}

document.getElementById("trajectory-select").addEventListener("change", e => showSession(e.target.value));
refresh();
