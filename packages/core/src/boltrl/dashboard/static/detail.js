// Rollout detail: summary, attempts with their errors, and the trace tree — attempts,
// agent turns, model calls (messages, response, tool calls, transition, tokens), tool
// steps and rewards — on a shared timeline.
import { h, api, fmt, badge, errorBox, clear, debounce } from "./dom.js";

function kv(label, value) {
  return h("div", {}, h("span", {}, label), value);
}

function content(c) {
  if (c === null || c === undefined) return "";
  if (typeof c === "string") return c;
  if (Array.isArray(c)) return c.map((p) => (p && (p.text ?? p.content)) ?? JSON.stringify(p)).join("");
  return JSON.stringify(c, null, 2);
}

function toolCalls(calls) {
  return (calls || []).map((tc) => {
    const fn = tc.function || tc;
    let args = fn.arguments;
    try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (_) { /* keep as is */ }
    return h("div", { class: "toolcall" }, h("div", { class: "role" }, `tool call → ${fn.name}`,
      tc.id ? h("span", { class: "muted" }, ` (${tc.id})`) : null), h("pre", {}, args));
  });
}

function message(m) {
  return h("div", { class: "msg" },
    h("div", { class: "role" }, m.role + (m.name ? ` · ${m.name}` : "") +
      (m.tool_call_id ? ` · ${m.tool_call_id}` : "")),
    content(m.content) !== "" ? h("pre", { class: "content" }, content(m.content)) : null,
    toolCalls(m.tool_calls));
}

function color(lp) {
  const p = Math.exp(Math.max(-20, Math.min(0, lp)));
  return `hsl(${Math.round(120 * p)}, ${p > 0.5 ? 55 : 75}%, 82%)`;
}

async function showTokens(target, rolloutId, callId) {
  clear(target).append(h("span", { class: "muted" }, "loading tokens…"));
  try {
    const t = await api(`rollouts/${encodeURIComponent(rolloutId)}/calls/${encodeURIComponent(callId)}/tokens`);
    const spans = t.ids.map((id, i) => {
      const lp = t.logprobs ? t.logprobs[i] : null;
      const text = t.pieces ? t.pieces[i] : String(id);
      return h("span", { class: t.pieces ? "tok" : "tok id",
        style: lp === null ? {} : { background: color(lp) },
        title: `id ${id}` + (lp === null ? "" : ` · logprob ${lp.toFixed(4)} · p ${Math.exp(lp).toFixed(3)}`) },
      text);
    });
    clear(target).append(
      h("div", { class: "muted" }, `${t.ids.length} response tokens`,
        t.pieces ? ` (decoded by ${t.decoded_by})` : " (ids; no tokenizer to decode them)",
        " · logprob: low ", h("span", { class: "scale" }), " high"),
      h("div", { class: "tokens" }, spans));
  } catch (e) {
    clear(target).append(errorBox(e));
  }
}

function callBody(node, rolloutId) {
  const c = node.call;
  const tr = node.transition;
  const tokens = h("div", {});
  const parts = [
    h("div", { class: "kv" },
      kv("call id", h("span", { class: "mono" }, node.id)), kv("agent", node.agent || "—"),
      kv("model", c.model || "—"), kv("policy version", fmt.num(c.policy_version)),
      kv("tokens in / out", `${c.prompt_tokens} / ${c.response_tokens}`),
      kv("finish reason", c.finish_reason || "—"), kv("duration", fmt.dur(node.end - node.start)),
      kv("credited reward", tr ? fmt.num(tr.reward) : "no transition"),
      kv("advantage (GRPO est.)", node.advantage ? fmt.num(node.advantage.value) : "—"),
      kv("transition", tr ? `step ${tr.step}${tr.done ? " (last)" : ""}` +
        (tr.merged_calls > 1 ? `, merged ${tr.merged_calls} calls` : "") : "—"),
      kv("mean logprob", fmt.num(c.mean_logprob))),
  ];
  if (c.error) parts.push(h("div", { class: "error" }, c.error));
  if (Object.keys(c.params).length) parts.push(h("h3", {}, "Sampling"), h("pre", {}, fmt.json(c.params)));
  if (c.tools.length) parts.push(h("p", { class: "muted" }, "Tools offered: ", c.tools.join(", ")));
  parts.push(h("h3", {}, `Messages (${c.messages.length})`), h("div", { class: "messages" }, c.messages.map(message)));
  parts.push(h("h3", {}, "Response"), h("div", { class: "response" }, message(
    { role: "assistant", ...c.response })));
  if (c.has_tokens) {
    parts.push(h("h3", {}, "Tokens"), h("button", { class: "show-tokens",
      onclick: (e) => { e.target.remove(); showTokens(tokens, rolloutId, node.id); } }, "Show response tokens"), tokens);
  }
  return parts;
}

function nodeBody(node, rolloutId) {
  if (node.call) return callBody(node, rolloutId);
  if (node.tool) {
    const t = node.tool;
    return [h("div", { class: "kv" }, kv("tool", t.name), kv("agent", node.agent || "—"),
      kv("duration", fmt.dur(node.end - node.start)),
      kv("tool call id", t.tool_call_id || "—")),
      h("h3", {}, "Arguments"), h("pre", { class: "args" }, fmt.json(t.arguments)),
      t.error ? h("div", { class: "error" }, t.error) : [h("h3", {}, "Result"), h("pre", { class: "result" }, fmt.json(t.result))]];
  }
  if (node.reward) {
    const r = node.reward;
    return [h("div", { class: "kv" }, kv("reward", r.name), kv("value", fmt.num(r.value)),
      kv("final", r.final ? "yes" : "no"), kv("for call", r.call_id || "its position"))];
  }
  return [h("p", { class: "muted" }, node.kind === "span" ? `Framework span ${node.id.split(":").slice(2).join(":")}` : "")];
}

function label(node) {
  if (node.call) {
    const c = node.call;
    const calls = (c.response.tool_calls || []).map((tc) => (tc.function || tc).name);
    const text = content(c.response.content).replace(/\s+/g, " ").slice(0, 140);
    return [node.agent ? [h("span", { class: "agent" }, node.agent), " "] : null,
      calls.length ? `→ ${calls.join(", ")}` : text || c.finish_reason || c.status];
  }
  if (node.tool) return [node.agent ? [h("span", { class: "agent" }, node.agent), " "] : null, node.tool.name,
    node.tool.error ? " (error)" : ""];
  if (node.reward) return [`${node.reward.name} = ${fmt.num(node.reward.value)}`, node.reward.final ? " (final)" : ""];
  if (node.kind === "span") return [h("span", { class: "agent" }, node.agent || "span"), " agent turn"];
  return [`attempt ${node.attempt}`];
}

function metrics(node) {
  if (node.call) {
    const tr = node.transition;
    return `${node.call.prompt_tokens}→${node.call.response_tokens} tok` +
      (tr ? ` · credit ${fmt.num(tr.reward)}` : "") +
      (node.advantage ? ` · adv ${fmt.num(node.advantage.value, 2)}` : "");
  }
  const dur = node.end > node.start ? fmt.dur(node.end - node.start) : "";
  if (node.kind === "attempt" && node.outcome) return `${node.outcome} · ${dur}`;
  return dur;
}

function renderNode(node, ctx) {
  const body = h("div", { class: "body", hidden: !ctx.open.has(node.id) });
  if (ctx.open.has(node.id)) body.append(...nodeBody(node, ctx.id).flat());
  const span = Math.max(1e-6, ctx.t1 - ctx.t0);
  const left = node.start ? ((node.start - ctx.t0) / span) * 100 : 0;
  const width = node.end > node.start ? ((node.end - node.start) / span) * 100 : 0;
  const toggle = h("span", { class: "toggle" }, ctx.open.has(node.id) ? "▾" : "▸");
  const row = h("div", { class: "row", title: `${node.kind} ${node.id}`, onclick: () => {
    const opening = !ctx.open.has(node.id);
    if (opening) ctx.open.add(node.id); else ctx.open.delete(node.id);
    toggle.textContent = opening ? "▾" : "▸";
    body.hidden = !opening;
    clear(body);
    if (opening) body.append(...nodeBody(node, ctx.id).flat());
  } },
  toggle, h("span", { class: `kind ${node.kind}` }, node.kind),
  h("span", { class: "label" }, label(node)),
  h("div", { class: "track" }, h("div", { class: `bar ${node.kind}`,
    style: { left: `${Math.max(0, Math.min(100, left))}%`, width: `${Math.min(100, width)}%` } })),
  h("span", { class: "metrics" }, metrics(node)));
  return h("div", { class: `node ${node.kind}`, "data-id": node.id }, row, body,
    node.children.length ? h("div", { class: "children" }, node.children.map((c) => renderNode(c, ctx))) : null);
}

export function detailPage(root, params, id) {
  const state = { credit: params.get("credit") || "final", gamma: params.get("gamma") || "1" };
  const open = new Set();
  const head = h("div", {});
  const trace = h("div", { class: "trace" });
  const credit = h("select", { name: "credit", onchange: (e) => { state.credit = e.target.value; load(); } },
    ["final", "discounted"].map((m) => h("option", { value: m, selected: m === state.credit }, m)));
  const gamma = h("input", { name: "gamma", type: "number", min: 0, max: 1, step: 0.05, value: state.gamma,
    style: { width: "80px" }, onchange: (e) => { state.gamma = e.target.value; load(); } });
  root.append(h("p", {}, h("a", { href: "#/rollouts" }, "‹ all rollouts")), head,
    h("section", { class: "panel" }, h("div", { class: "filters" }, h("h2", { style: { margin: 0, flex: 1 } }, "Trace"),
      h("label", {}, "Credit", credit), h("label", {}, "γ", gamma)), trace));
  let last = null;

  async function load() {
    try {
      const d = await api(`rollouts/${encodeURIComponent(id)}`, { credit: state.credit, gamma: state.gamma });
      last = d;
      renderHead(d);
      const t0 = Math.min(...d.tree.map((n) => n.start).filter((t) => t > 0), d.created_at);
      const t1 = Math.max(...d.tree.map((n) => n.end), d.finished_at || 0, t0 + 1e-3);
      clear(trace);
      if (d.credit.error) trace.append(h("div", { class: "error" }, `No transitions: ${d.credit.error}`));
      if (!d.tree.length) trace.append(h("p", { class: "muted" }, "Not started yet."));
      for (const n of d.tree) trace.append(renderNode(n, { open, t0, t1, id }));
    } catch (e) {
      clear(head).append(errorBox(e));
    }
  }

  function renderHead(d) {
    const dur = d.finished_at && d.attempts.length ? d.finished_at - d.attempts[0].started_at : null;
    const adv = d.advantage_group;
    clear(head).append(
      h("h1", {}, "Rollout ", h("span", { class: "mono" }, d.id), " ", badge(d.status)),
      h("section", { class: "panel" },
        h("div", { class: "kv" },
          kv("task", h("span", { class: "mono" }, d.task.id)),
          kv("run · phase · step", `${d.run ?? "—"} · ${d.phase ?? "—"} · ${d.step ?? "—"}`),
          kv("reward", fmt.num(d.reward)), kv("attempts", `${d.attempts.length} of ${d.max_attempts}`),
          kv("duration", fmt.dur(dur)), kv("created", fmt.time(d.created_at)),
          kv("calls · tool steps · rewards", `${d.counts.calls} · ${d.counts.tool_steps} · ${d.counts.rewards}`),
          kv("unjoined annotations", d.unjoined_calls)),
        adv ? h("p", { class: "muted" }, `Advantage estimate (GRPO): group of ${adv.group_size} finished rollouts ` +
          `of this task in this step, mean ${fmt.num(adv.mean)}, std ${fmt.num(adv.std)}.`) : null,
        d.error ? h("div", { class: "error rollout-error" }, d.error) : null,
        h("h3", {}, "Task input"), h("pre", { class: "task-input" }, fmt.json(d.task.input)),
        h("h3", {}, "Attempts"),
        h("table", { class: "grid attempts" },
          h("thead", {}, h("tr", {}, ["#", "worker", "outcome", "started", "duration", "error"].map((c) => h("th", {}, c)))),
          h("tbody", {}, d.attempts.map((a) => h("tr", {},
            h("td", {}, a.number), h("td", { class: "mono" }, a.worker_id), h("td", {}, badge(a.outcome)),
            h("td", {}, fmt.time(a.started_at)),
            h("td", {}, fmt.dur((a.ended_at || a.last_heartbeat) - a.started_at)),
            h("td", {}, a.error ? h("details", {}, h("summary", {}, a.error_kind || "error"),
              h("pre", { class: "traceback" }, a.error)) : "—")))))));
  }

  load();
  const reload = debounce(load, 250);
  return {
    update: (type, data) => {
      if (!last) return;
      const running = !["succeeded", "failed", "cancelled"].includes(last.status);
      if (running || (type === "change" && data.changed && data.changed.includes(id))) reload();
    },
  };
}
