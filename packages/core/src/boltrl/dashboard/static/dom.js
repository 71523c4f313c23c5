// DOM building, formatting, the API client and the live event stream.
// Every value shown comes from agents and models: it only ever reaches the page as a
// text node (textContent) or an attribute value, never as HTML.

const SVG_NS = "http://www.w3.org/2000/svg";

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function setAttrs(el, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "text") el.textContent = String(v);
    else if (k === "style" && typeof v === "object") Object.assign(el.style, v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  return el;
}

/** An HTML element; string children become text nodes. */
export function h(tag, attrs, ...children) {
  return append(setAttrs(document.createElement(tag), attrs), children);
}

/** An SVG element; string children become text nodes. */
export function s(tag, attrs, ...children) {
  return append(setAttrs(document.createElementNS(SVG_NS, tag), attrs), children);
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export const fmt = {
  num(v, digits = 3) {
    if (v === null || v === undefined) return "—";
    if (Number.isInteger(v)) return v.toLocaleString();
    return Number(v).toFixed(digits).replace(/\.?0+$/, "") || "0";
  },
  dur(sec) {
    if (sec === null || sec === undefined) return "—";
    if (sec < 1) return `${Math.round(sec * 1000)} ms`;
    if (sec < 60) return `${sec.toFixed(1)} s`;
    if (sec < 3600) return `${Math.floor(sec / 60)}m` + (Math.round(sec % 60) ? ` ${Math.round(sec % 60)}s` : "");
    return `${Math.floor(sec / 3600)}h ${Math.round((sec % 3600) / 60)}m`;
  },
  ago(t, now = Date.now() / 1000) {
    if (!t) return "never";
    return `${fmt.dur(Math.max(0, now - t))} ago`;
  },
  time(t) {
    if (!t) return "—";
    return new Date(t * 1000).toLocaleString();
  },
  clock(t) {
    return new Date(t * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  },
  json(v) {
    if (typeof v === "string") return v;
    return JSON.stringify(v, null, 2);
  },
};

export function badge(status) {
  return h("span", { class: `badge ${status}` }, status);
}

export class ApiError extends Error {}

/** GET an API path (relative to the page, so the app can be mounted under a prefix). */
export async function api(path, params = {}) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== null && v !== undefined && v !== "") q.set(k, v);
  }
  const url = `api/${path}${q.toString() ? "?" + q : ""}`;
  const resp = await fetch(url, { credentials: "same-origin" });
  if (!resp.ok) {
    let msg = `${resp.status} ${resp.statusText}`;
    try {
      msg = (await resp.json()).error.message;
    } catch (_) { /* not our JSON */ }
    throw new ApiError(msg);
  }
  return resp.json();
}

export function errorBox(err) {
  return h("div", { class: "error" }, String(err && err.message ? err.message : err));
}

/** Calls ``fn`` at most once per ``ms``, the last call winning. */
export function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

// -- live events ---------------------------------------------------------------------

const listeners = new Set();
let source = null;

export function onLive(fn) {
  listeners.add(fn);
  return () => listeners.delete(fn);
}

export function connectLive(indicator) {
  if (source) return;
  source = new EventSource("api/events");
  const set = (on) => {
    indicator.className = `live ${on ? "on" : "off"}`;
    indicator.textContent = on ? "live" : "reconnecting";
  };
  source.onopen = () => set(true);
  source.onerror = () => set(false);
  for (const type of ["hello", "change", "tick"]) {
    source.addEventListener(type, (ev) => {
      set(true);
      const data = JSON.parse(ev.data);
      for (const fn of [...listeners]) fn(type, data);
    });
  }
}
