// The dashboard's router: #/runs, #/rollouts?…, #/rollout/<id>, #/workers, #/promotions.
import { api, clear, connectLive, onLive, fmt } from "./dom.js";
import { runsPage } from "./runs.js";
import { rolloutsPage } from "./rollouts.js";
import { detailPage } from "./detail.js";
import { workersPage } from "./workers.js";
import { promotionsPage } from "./promotions.js";

let current = null;

function route() {
  const main = document.getElementById("main");
  const [path, query] = (location.hash.slice(1) || "/runs").split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean);
  clear(main);
  const page = parts[0] || "runs";
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", a.dataset.page === page || (page === "rollout" && a.dataset.page === "rollouts"));
  }
  if (page === "rollouts") current = rolloutsPage(main, params);
  else if (page === "rollout") current = detailPage(main, params, decodeURIComponent(parts.slice(1).join("/")));
  else if (page === "workers") current = workersPage(main, params);
  else if (page === "promotions") current = promotionsPage(main, params);
  else current = runsPage(main, params);
  document.title = `boltrl · ${page}`;
}

function showCounts(c) {
  document.getElementById("counts").textContent =
    `${fmt.num(c.running)} running · ${fmt.num(c.queued + c.requeued)} queued · ` +
    `${fmt.num(c.succeeded)} succeeded · ${fmt.num(c.failed)} failed`;
}

async function header() {
  try {
    const d = await api("summary");
    document.getElementById("store").textContent = d.store;
    showCounts(d.counts);
  } catch (e) {
    document.getElementById("counts").textContent = String(e.message || e);
  }
}

// Module scripts run once the document is parsed, so the page can start right away.
window.addEventListener("hashchange", route);
route();
header();
connectLive(document.getElementById("live"));
onLive((type, data) => {
  if (type === "change") showCounts(data.counts);
  if (current && current.update) current.update(type, data);
});
