// Inline SVG charts: a line chart with a spread band per series, and a bar chart.
import { h, s, fmt } from "./dom.js";

const PAD = { l: 46, r: 12, t: 10, b: 26 };

const TIME_STEPS = [60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];

function ticks(lo, hi, n = 5, integer = false, time = false) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / n;
  const mag = 10 ** Math.floor(Math.log10(raw));
  let step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((m) => m >= raw) || raw;
  if (integer) step = Math.max(1, Math.round(step));
  if (time) step = TIME_STEPS.find((m) => m >= raw) || Math.ceil(raw / 86400) * 86400;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toFixed(10));
  return out;
}

function frame(width, height, xs, ys, xFormat, opts = {}) {
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const padY = (y1 - y0) * 0.08;
  y0 -= padY; y1 += padY;
  const W = width - PAD.l - PAD.r, H = height - PAD.t - PAD.b;
  const sx = (x) => PAD.l + (x1 === x0 ? W / 2 : ((x - x0) / (x1 - x0)) * W);
  const sy = (y) => PAD.t + H - ((y - y0) / (y1 - y0)) * H;
  const g = s("g");
  for (const t of ticks(y0, y1, Math.max(2, Math.min(5, Math.round(H / 40))), opts.yInteger)) {
    g.append(s("line", { class: "grid", x1: PAD.l, x2: PAD.l + W, y1: sy(t), y2: sy(t) }));
    g.append(s("text", { x: PAD.l - 6, y: sy(t) + 4, "text-anchor": "end" }, fmt.num(t, 2)));
  }
  const room = Math.min(8, Math.max(1, Math.round(W / 70)));
  let xt = x1 === x0 ? [x0] : ticks(x0, x1, room, opts.xInteger, opts.xTime);
  if (opts.xTicks && opts.xTicks.length <= room) xt = opts.xTicks;  // few bars: label each
  for (const t of xt) {
    g.append(s("text", { x: sx(t), y: PAD.t + H + 17, "text-anchor": "middle" }, xFormat(t)));
  }
  g.append(s("line", { class: "axis", x1: PAD.l, x2: PAD.l + W, y1: PAD.t + H, y2: PAD.t + H }));
  return { g, sx, sy };
}

function canvas(width, height) {
  return s("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", class: "plot",
    preserveAspectRatio: "xMidYMid meet" });
}

/** series: [{name, color, points: [{x, y, lo, hi, label}]}] */
export function lineChart({ width = 620, height = 230, series, xFormat = (x) => fmt.num(x),
  xInteger = false }) {
  const pts = series.flatMap((se) => se.points);
  const root = canvas(width, height);
  if (!pts.length) return root;
  const ys = pts.flatMap((p) => [p.y, p.lo ?? p.y, p.hi ?? p.y]);
  const { g, sx, sy } = frame(width, height, pts.map((p) => p.x), ys, xFormat, { xInteger });
  root.append(g);
  for (const se of series) {
    const P = [...se.points].sort((a, b) => a.x - b.x);
    if (!P.length) continue;
    const band = P.map((p) => `${sx(p.x)},${sy(p.hi ?? p.y)}`)
      .concat([...P].reverse().map((p) => `${sx(p.x)},${sy(p.lo ?? p.y)}`));
    root.append(s("polygon", { points: band.join(" "), fill: se.color, "fill-opacity": 0.14,
      stroke: "none", class: "band" }));
    root.append(s("polyline", { points: P.map((p) => `${sx(p.x)},${sy(p.y)}`).join(" "),
      fill: "none", stroke: se.color, "stroke-width": 2, class: `curve curve-${se.name}` }));
    const r = P.length <= 60 ? 3 : P.length <= 300 ? 1.8 : 1.1;  // dots thin out as points grow
    for (const p of P) {
      root.append(s("circle", { cx: sx(p.x), cy: sy(p.y), r, fill: se.color },
        s("title", {}, p.label)));
    }
  }
  return root;
}

/** bars: [{x, y, label}] */
export function barChart({ width = 420, height = 230, bars, color = "#2563eb",
  xFormat = (x) => fmt.num(x), xInteger = false, xTime = false }) {
  const root = canvas(width, height);
  if (!bars.length) return root;
  const xs = bars.map((b) => b.x);
  const ys = [0, ...bars.map((b) => b.y)];
  const sorted = [...xs].sort((a, b) => a - b);
  let gap = Infinity;
  for (let i = 1; i < sorted.length; i++) gap = Math.min(gap, sorted[i] - sorted[i - 1]);
  if (gap === Infinity || gap <= 0) gap = 1;
  // Half a slot of room on each side keeps the outer bars inside the plot.
  const span = [sorted[0] - gap / 2, sorted[sorted.length - 1] + gap / 2];
  const { g, sx, sy } = frame(width, height, span, ys, xFormat, { xInteger, xTime, yInteger: true,
    xTicks: sorted });
  root.append(g);
  const bw = Math.max(2, Math.min(28, (sx(sorted[0] + gap) - sx(sorted[0])) * 0.8));
  for (const b of bars) {
    const y = sy(b.y), base = sy(0);
    root.append(s("rect", { x: sx(b.x) - bw / 2, y: Math.min(y, base), width: bw,
      height: Math.max(1, Math.abs(base - y)), fill: color, rx: 2, class: "bar" },
      s("title", {}, b.label)));
  }
  return root;
}

export function legend(items) {
  return h("div", { class: "legend" },
    items.map(([name, color]) => h("span", {}, h("i", { style: { background: color } }), name)));
}
