// Workers page: runners with their last sign of life, current rollouts and throughput.
import { h, api, fmt, badge, errorBox, clear, debounce } from "./dom.js";

export function workersPage(root) {
  const body = h("div", {});
  root.append(h("h1", {}, "Workers"), body);
  async function load() {
    try {
      const d = await api("workers");
      clear(body);
      if (!d.workers.length) {
        body.append(h("p", { class: "muted" }, "No worker has claimed a rollout yet."));
        return;
      }
      body.append(h("p", { class: "muted" },
        `Throughput over the last ${fmt.dur(d.window_s)}; heartbeats from attempts and the store's own view.`),
      h("table", { class: "grid workers" },
        h("thead", {}, h("tr", {}, ["State", "Worker", "Last seen", "Running", "Rollouts/min",
          "Finished", "Failed", "Attempts seen"].map((c) => h("th", {}, c)))),
        h("tbody", {}, d.workers.map((w) => h("tr", { "data-worker": w.worker_id },
          h("td", {}, badge(w.state)), h("td", { class: "mono" }, w.worker_id),
          h("td", {}, fmt.ago(w.last_seen, d.now)),
          h("td", {}, w.running.length ? w.running.map((rid, i) => [i ? ", " : "",
            h("a", { class: "mono", href: `#/rollout/${encodeURIComponent(rid)}` }, rid)]) : "—"),
          h("td", { class: "num" }, fmt.num(w.rate, 1)), h("td", { class: "num" }, w.finished_recent),
          h("td", { class: "num" }, w.failed_recent), h("td", { class: "num" }, w.attempts))))));
    } catch (e) {
      clear(body).append(errorBox(e));
    }
  }
  load();
  const reload = debounce(load, 300);
  return { update: () => reload() };
}
