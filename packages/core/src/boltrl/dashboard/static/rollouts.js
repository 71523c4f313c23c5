// Rollouts page: a filterable, paginated table, newest first. Filters and the page
// live in the URL (#/rollouts?status=failed&run=x&offset=50) so views can be shared.
import { h, api, fmt, badge, errorBox, clear, debounce } from "./dom.js";

const COLUMNS = [
  ["Status"], ["Rollout"], ["Task"], ["Run · step"], ["Reward", "num"], ["Attempts", "num"],
  ["Duration", "num"], ["Agents"], ["Policy v.", "num"], ["Calls", "num"], ["Created"],
];

function option(value, label, selected) {
  return h("option", { value, selected: value === selected }, label);
}

function tableRow(r, fresh) {
  const runStep = r.run === null ? "—" : `${r.run}${r.phase ? " · " + r.phase : ""}` +
    `${r.step === null ? "" : " · " + r.step}`;
  const versions = r.policy_versions.length ? r.policy_versions.join(", ") : "—";
  return h("tr", { class: fresh ? "fresh" : null, "data-id": r.id },
    h("td", {}, badge(r.status)),
    h("td", { class: "mono" }, h("a", { href: `#/rollout/${encodeURIComponent(r.id)}` }, r.id)),
    h("td", { class: "mono" }, r.task_id),
    h("td", {}, runStep),
    h("td", { class: "num" }, fmt.num(r.reward)),
    h("td", { class: "num" }, r.attempts),
    h("td", { class: "num" }, fmt.dur(r.duration)),
    h("td", {}, r.agents.join(", ") || "—"),
    h("td", { class: "num" }, versions),
    h("td", { class: "num" }, r.calls),
    h("td", {}, fmt.time(r.created_at)));
}

export function rolloutsPage(root, params) {
  const state = {
    status: params.get("status") || "", run: params.get("run") || "",
    agent: params.get("agent") || "", task: params.get("task") || "",
    limit: Number(params.get("limit") || 50), offset: Number(params.get("offset") || 0),
  };
  const go = (changes) => {
    const next = { ...state, ...changes };
    const q = new URLSearchParams();
    for (const k of ["status", "run", "agent", "task"]) if (next[k]) q.set(k, next[k]);
    if (next.limit !== 50) q.set("limit", next.limit);
    if (next.offset) q.set("offset", next.offset);
    location.hash = `#/rollouts${q.toString() ? "?" + q : ""}`;
  };
  const statusSel = h("select", { name: "status", onchange: (e) => go({ status: e.target.value, offset: 0 }) },
    option("", "any", state.status));
  const runSel = h("select", { name: "run", onchange: (e) => go({ run: e.target.value, offset: 0 }) },
    option("", "any", state.run));
  const agentSel = h("select", { name: "agent", onchange: (e) => go({ agent: e.target.value, offset: 0 }) },
    option("", "any", state.agent));
  const taskIn = h("input", { name: "task", placeholder: "exact task id", value: state.task,
    onchange: (e) => go({ task: e.target.value.trim(), offset: 0 }) });
  const limitSel = h("select", { name: "limit", onchange: (e) => go({ limit: Number(e.target.value), offset: 0 }) },
    [25, 50, 100, 200].map((n) => option(String(n), String(n), String(state.limit))));
  const info = h("span", { class: "muted page-info" });
  const prev = h("button", { class: "prev", onclick: () => go({ offset: Math.max(0, state.offset - state.limit) }) }, "‹ Newer");
  const next = h("button", { class: "next", onclick: () => go({ offset: state.offset + state.limit }) }, "Older ›");
  const tbody = h("tbody", {});
  const msg = h("div", {});
  root.append(
    h("h1", {}, "Rollouts"),
    h("div", { class: "filters panel" },
      h("label", {}, "Status", statusSel), h("label", {}, "Run", runSel),
      h("label", {}, "Agent", agentSel), h("label", {}, "Task", taskIn),
      h("label", {}, "Per page", limitSel)),
    msg,
    h("table", { class: "grid rollouts" },
      h("thead", {}, h("tr", {}, COLUMNS.map(([name, cls]) => h("th", { class: cls || null }, name)))),
      tbody),
    h("div", { class: "pager" }, prev, info, next));

  api("facets").then((f) => {
    for (const st of f.statuses) statusSel.append(option(st, st, state.status));
    for (const r of f.runs) runSel.append(option(r, r, state.run));
    for (const a of f.agents) agentSel.append(option(a, a, state.agent));
    // A filter value the facets do not know yet still shows as selected.
    for (const [sel, v] of [[runSel, state.run], [agentSel, state.agent]]) {
      if (v && ![...sel.options].some((o) => o.value === v)) sel.append(option(v, v, v));
    }
  }).catch((e) => msg.append(errorBox(e)));

  let shown = new Set();
  async function load() {
    try {
      const data = await api("rollouts", { status: state.status, run: state.run, agent: state.agent,
        task: state.task, limit: state.limit, offset: state.offset });
      const first = shown.size === 0;
      clear(tbody);
      for (const r of data.rows) tbody.append(tableRow(r, !first && !shown.has(r.id)));
      shown = new Set(data.rows.map((r) => r.id));
      if (!data.rows.length) tbody.append(h("tr", {}, h("td", { colspan: COLUMNS.length, class: "muted" },
        "No rollouts match.")));
      const end = state.offset + data.rows.length;
      info.textContent = data.total ? `${(state.offset + 1).toLocaleString()}–${end.toLocaleString()} of ` +
        `${data.total.toLocaleString()}` : "0 of 0";
      prev.disabled = state.offset === 0;
      next.disabled = end >= data.total;
      clear(msg);
    } catch (e) {
      clear(msg).append(errorBox(e));
    }
  }
  load();
  const reload = debounce(load, 300);
  return { update: (type) => { if (type === "change") reload(); } };
}
