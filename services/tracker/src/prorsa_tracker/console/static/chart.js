// A small SVG line / step chart for the Prorsa console (no dependencies).
// lineChart(container, {series: [{name, color, points: [[x, y], ...], step, dashed}], xfmt, yfmt})
"use strict";
(function () {
  const NS = "http://www.w3.org/2000/svg";
  function el(name, attrs, parent) {
    const e = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (parent) parent.appendChild(e);
    return e;
  }
  function niceTicks(lo, hi, n) {
    if (!(hi > lo)) { hi = lo + 1; }
    const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw) || raw;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
    return out;
  }
  function compact(v) {
    const a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(a >= 1e10 ? 0 : 1) + "G";
    if (a >= 1e6) return (v / 1e6).toFixed(a >= 1e7 ? 0 : 1) + "M";
    if (a >= 1e3) return (v / 1e3).toFixed(a >= 1e4 ? 0 : 1) + "k";
    return String(Math.round(v * 100) / 100);
  }
  function lineChart(container, opts) {
    container.innerHTML = "";
    const W = 640, H = 220, L = 52, R = 10, T = 10, B = 26;
    const series = opts.series.filter(s => s.points.length);
    const legend = document.createElement("div");
    legend.className = "legend";
    for (const s of opts.series) {
      const span = document.createElement("span");
      const i = document.createElement("i");
      i.style.background = s.color;
      if (s.dashed) i.style.background = `repeating-linear-gradient(90deg, ${s.color} 0 4px, transparent 4px 7px)`;
      span.append(i, s.name);
      legend.appendChild(span);
    }
    container.appendChild(legend);
    const svg = el("svg", {viewBox: `0 0 ${W} ${H}`, class: "chart", preserveAspectRatio: "none", role: "img"}, container);
    if (!series.length) {
      el("text", {x: W / 2, y: H / 2, "text-anchor": "middle"}, svg).textContent = opts.empty || "no data";
      return svg;
    }
    const xs = series.flatMap(s => s.points.map(p => p[0])), ys = series.flatMap(s => s.points.map(p => p[1]));
    let x0 = opts.xmin ?? Math.min(...xs), x1 = opts.xmax ?? Math.max(...xs);
    if (!(x1 > x0)) x1 = x0 + 1;
    const y0 = 0, yt = niceTicks(0, Math.max(...ys, opts.ymin || 1), opts.integer ? Math.min(5, Math.max(...ys, 1)) : 4);
    const y1 = Math.max(yt[yt.length - 1], Math.max(...ys));
    const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R), sy = y => H - B - (y - y0) / (y1 - y0 || 1) * (H - T - B);
    const xfmt = opts.xfmt || compact, yfmt = opts.yfmt || compact;
    for (const v of yt) {
      el("line", {x1: L, x2: W - R, y1: sy(v), y2: sy(v), class: "grid"}, svg);
      el("text", {x: L - 4, y: sy(v) + 4, "text-anchor": "end"}, svg).textContent = yfmt(v);
    }
    for (const v of niceTicks(x0, x1, 6)) {
      el("line", {x1: sx(v), x2: sx(v), y1: H - B, y2: H - B + 4, class: "axis"}, svg);
      el("text", {x: sx(v), y: H - B + 16, "text-anchor": "middle"}, svg).textContent = xfmt(v);
    }
    el("line", {x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis"}, svg);
    el("line", {x1: L, x2: L, y1: T, y2: H - B, class: "axis"}, svg);
    for (const s of series) {
      let d = "";
      s.points.forEach((p, i) => {
        if (i === 0) d += `M${sx(p[0])},${sy(p[1])}`;
        else if (s.step) d += `H${sx(p[0])}V${sy(p[1])}`;
        else d += `L${sx(p[0])},${sy(p[1])}`;
      });
      if (s.step && s.points.length) d += `H${sx(x1)}`;
      el("path", {d, fill: "none", stroke: s.color, "stroke-width": s.width || 1.8,
                  "stroke-dasharray": s.dashed ? "5 3" : "", "data-series": s.name}, svg);
    }
    return svg;
  }
  window.ProrsaChart = {lineChart, compact};
})();
