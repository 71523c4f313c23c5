// Promotions page: every gate decision of `boltrl serve` (promote, rollback, the initial
// score) with the figures that decided it, and the served version's gate score over
// rounds. Reads api/promotions (the decision log given with --promotions).
import { h, api, fmt, errorBox, clear, debounce } from "./dom.js";
import { lineChart, legend } from "./charts.js";

const SERVED = "#2563eb", CANDIDATE = "#ea580c";

function servedScore(d) {
  return d.decision === "promote" ? d.candidate_score : d.served_score;
}

function chart(decisions) {
  const served = decisions.map((d) => ({ x: d.round, y: servedScore(d),
    label: `round ${d.round}: serving v${d.version_after}, gate ${fmt.num(servedScore(d))}` }));
  const cands = decisions.filter((d) => d.decision !== "initial" && d.gate_tasks > 0)
    .map((d) => ({ x: d.round, y: d.candidate_score,
      label: `round ${d.round}: candidate v${d.candidate_version} ${fmt.num(d.candidate_score)} (${d.decision})` }));
  const series = [{ name: "served", color: SERVED, points: served },
    { name: "candidate", color: CANDIDATE, points: cands }];
  return h("div", { class: "reward-chart" },
    lineChart({ series, xFormat: (x) => fmt.num(x, 0), xInteger: true, height: 230 }),
    legend([["served version's gate score", SERVED], ["candidate's gate score", CANDIDATE]]));
}

function row(d) {
  return h("tr", { "data-round": d.round, "data-decision": d.decision },
    h("td", { class: "num" }, d.round),
    h("td", {}, fmt.time(d.time)),
    h("td", {}, h("span", { class: `badge ${d.decision}` }, d.decision)),
    h("td", { class: "mono" }, d.decision === "initial" ? `v${d.version_after}`
      : `v${d.served_version} → v${d.version_after}`),
    h("td", { class: "num" }, d.decision === "initial" ? "—" : fmt.num(d.candidate_score)),
    h("td", { class: "num" }, fmt.num(d.served_score)),
    h("td", { class: "num" }, fmt.num(d.tolerance)),
    h("td", { class: "num" }, `${d.sessions} / ${d.trained_sessions}`),
    h("td", { class: "num" }, d.dropped_stale),
    h("td", { class: "num" }, d.expired),
    h("td", { class: "num" }, fmt.num(d.session_reward_mean)),
    h("td", { class: "reason" }, d.reason));
}

export function promotionsPage(root) {
  const body = h("div", {});
  root.append(h("h1", {}, "Promotions"), body);
  async function load() {
    try {
      const d = await api("promotions");
      clear(body);
      if (!d.path) {
        body.append(h("p", { class: "muted" },
          "No decision log: start the dashboard with --promotions OUT_DIR/promotions.jsonl " +
          "(boltrl serve writes it)."));
        return;
      }
      if (!d.decisions.length) {
        body.append(h("p", { class: "muted" }, `No decision in ${d.path} yet.`));
        return;
      }
      const promoted = d.decisions.filter((x) => x.decision === "promote").length;
      const rolled = d.decisions.filter((x) => x.decision === "rollback").length;
      const last = d.decisions[d.decisions.length - 1];
      body.append(
        h("p", { class: "muted summary" },
          `${d.path}: serving v${last.version_after} · ${promoted} promoted · ${rolled} rolled back`),
        chart(d.decisions),
        h("table", { class: "grid promotions" },
          h("thead", {}, h("tr", {}, ["Round", "Time", "Decision", "Version", "Candidate",
            "Served", "Tolerance", "Sessions / trained", "Stale dropped", "Expired",
            "Session reward", "Why"].map((c) => h("th", {}, c)))),
          h("tbody", {}, [...d.decisions].reverse().map(row))));
    } catch (e) {
      clear(body).append(errorBox(e));
    }
  }
  load();
  const reload = debounce(load, 300);
  return { update: () => reload() };
}
