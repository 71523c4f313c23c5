// Runs page: reward curves (mean ± std per step, one line per phase), throughput and
// failures, for every run the store's rollouts are tagged with. Updates live.
import { h, api, fmt, errorBox, clear, debounce } from "./dom.js";
import { lineChart, barChart, legend } from "./charts.js";

const COLORS = { train: "#2563eb", val: "#ea580c" };
const OTHER = ["#0d9488", "#7c3aed", "#be185d", "#4b5563"];

function phaseColor(phase, i) {
  return COLORS[phase] || OTHER[i % OTHER.length];
}

function rewardChart(run) {
  const phases = [...new Set(run.steps.filter((st) => st.step !== null && st.mean !== undefined)
    .map((st) => st.phase ?? "untagged"))];
  const series = phases.map((phase, i) => ({
    name: phase,
    color: phaseColor(phase, i),
    points: run.steps
      .filter((st) => (st.phase ?? "untagged") === phase && st.step !== null && st.mean !== undefined)
      .map((st) => ({
        x: st.step, y: st.mean, lo: st.mean - st.std, hi: st.mean + st.std,
        label: `${phase} step ${st.step}: mean ${fmt.num(st.mean)} ± ${fmt.num(st.std)} ` +
          `(n=${st.n}, min ${fmt.num(st.min)}, max ${fmt.num(st.max)})`,
      })),
  }));
  if (!series.length) return h("p", { class: "muted" }, "No finished rollouts tagged with a step yet.");
  return h("div", { class: "reward-chart" },
    lineChart({ series, xFormat: (x) => fmt.num(x, 0), xInteger: true, height: 250 }),
    legend(series.map((se) => [`${se.name} reward (mean ± std)`, se.color])));
}

function throughputChart(run) {
  const bars = run.throughput.map(([t, n]) => ({ x: t, y: n, label: `${fmt.clock(t)}: ${n} finished` }));
  if (!bars.length) return h("p", { class: "muted" }, "Nothing finished yet.");
  return barChart({ bars, color: "#0d9488", height: 140, xFormat: (t) => fmt.clock(t), xTime: true });
}

function failureChart(run) {
  const bars = run.steps
    .filter((st) => st.step !== null && (st.failed || st.cancelled))
    .map((st) => ({ x: st.step, y: (st.failed || 0) + (st.cancelled || 0),
      label: `${st.phase ?? ""} step ${st.step}: ${st.failed || 0} failed, ${st.cancelled || 0} cancelled` }));
  if (!bars.length) return h("p", { class: "muted" }, "No failures.");
  return barChart({ bars, color: "#dc2626", height: 140, xFormat: (x) => fmt.num(x, 0), xInteger: true });
}

function runCard(run) {
  const c = run.counts;
  const total = Object.values(c).reduce((a, b) => a + b, 0);
  const name = run.name ?? "(untagged)";
  const link = `#/rollouts?${new URLSearchParams(run.name === null ? {} : { run: run.name })}`;
  const failures = Object.entries(run.failures);
  return h("section", { class: "panel run", "data-run": name },
    h("h2", {}, h("a", { href: link }, name)),
    h("div", { class: "chips" },
      h("span", { class: "chip" }, "rollouts", h("b", {}, fmt.num(total))),
      h("span", { class: "chip" }, "succeeded", h("b", {}, fmt.num(c.succeeded))),
      h("span", { class: "chip" }, "failed", h("b", { class: "failed-count" }, fmt.num(c.failed))),
      h("span", { class: "chip" }, "cancelled", h("b", {}, fmt.num(c.cancelled))),
      h("span", { class: "chip" }, "running", h("b", {}, fmt.num(c.running))),
      h("span", { class: "chip" }, "queued", h("b", {}, fmt.num(c.queued + c.requeued))),
      h("span", { class: "chip" }, "rollouts/min (5 min)", h("b", {}, fmt.num(run.rate_recent, 1))),
      run.rate_overall !== null &&
        h("span", { class: "chip" }, "rollouts/min (overall)", h("b", {}, fmt.num(run.rate_overall, 1)))),
    h("div", { class: "charts" },
      h("div", { class: "chart" }, h("div", { class: "title" }, "Reward per step"), rewardChart(run)),
      h("div", { class: "side" },
        h("div", { class: "chart" }, h("div", { class: "title" }, "Rollouts finished per minute"),
          throughputChart(run)),
        h("div", { class: "chart failures" }, h("div", { class: "title" }, "Failed or cancelled per step"),
          failureChart(run)))),
    failures.length > 0 && h("p", { class: "muted" }, "Failures by kind: ",
      failures.map(([k, n], i) => [i ? ", " : "", h("span", { class: "mono" }, k), ` × ${n}`])));
}

export function runsPage(root) {
  const body = h("div", {});
  root.append(h("h1", {}, "Runs"), body);
  async function load() {
    try {
      const data = await api("runs");
      clear(body);
      if (!data.runs.length) body.append(h("p", { class: "muted" }, "No rollouts in this store yet."));
      for (const run of data.runs) body.append(runCard(run));
    } catch (e) {
      clear(body).append(errorBox(e));
    }
  }
  load();
  const reload = debounce(load, 300);
  return { update: (type) => { if (type === "change") reload(); } };
}
