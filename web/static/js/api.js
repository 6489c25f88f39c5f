// The service's REST API, as the page uses it. Every error the API sends is JSON
// {"detail": "...", "errors"?: [{loc, msg, type}]}; ApiError carries it unchanged.

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.detail) || `HTTP ${status}`);
    this.status = status;
    this.detail = (body && body.detail) || `HTTP ${status}`;
    this.errors = (body && Array.isArray(body.errors)) ? body.errors : [];
  }
}

async function request(method, url, { json, form, signal } = {}) {
  const init = { method, headers: { Accept: "application/json" }, signal };
  if (json !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(json);
  } else if (form !== undefined) {
    init.body = form;
  }
  let resp;
  try {
    resp = await fetch(url, init);
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, { detail: `the service cannot be reached (${e.message})` });
  }
  return handle(resp);
}

// a prefetched response (index.html starts the open job's requests early), taken once
function prefetched(key, id) {
  const pre = window.__prefetch;
  if (!pre || pre.id !== id || !pre[key]) return null;
  const p = pre[key];
  delete pre[key];
  return p;
}

async function handle(resp) {
  let body = null;
  const text = await resp.text();
  if (text) {
    try { body = JSON.parse(text); } catch { body = { detail: text.slice(0, 300) }; }
  }
  if (!resp.ok) throw new ApiError(resp.status, body);
  return { status: resp.status, body, headers: resp.headers };
}

const get = async (url, opts) => (await request("GET", url, opts)).body;
const post = (url, json, opts = {}) => request("POST", url, { json, ...opts });

export const api = {
  models: () => get("/api/models"),
  devices: () => get("/api/devices"),
  jobs: (limit = 100) => get(`/api/jobs?limit=${limit}`),
  job: async (id) => {
    const pre = prefetched("/api/jobs/ID", id);
    if (pre) { try { return (await handle(await pre)).body; } catch { /* ask again */ } }
    return get(`/api/jobs/${id}`);
  },
  frontier: async (id, devices) => {
    const pre = devices ? null : prefetched("/api/jobs/ID/frontier", id);
    if (pre) { try { return (await handle(await pre)).body; } catch { /* not done when prefetched: ask again */ } }
    return get(`/api/jobs/${id}/frontier${devices ? `?devices=${devices}` : ""}`);
  },
  jobRuns: (id) => get(`/api/jobs/${id}/runs`),
  strategy: (id) => get(`/api/strategies/${id}`),
  run: (id) => get(`/api/runs/${id}`),
  createJob: async (body) => (await post("/api/jobs", body)).body,
  uploadJob: async (file, fields) => {
    const form = new FormData();
    form.append("graph", file, file.name || "graph.json");
    form.append("request", JSON.stringify(fields));
    return (await request("POST", "/api/jobs/upload", { form })).body;
  },
  select: async (jobId, strategyId) => (await post(`/api/jobs/${jobId}/select`, { strategy_id: strategyId })).body,
  launch: async (jobId, strategyId, steps) =>
    (await post(`/api/jobs/${jobId}/launch`, { strategy_id: strategyId, steps })).body,
  // 200: answered; 202: pending (poll `location`)
  resize: async (jobId, body, wait = 20) => {
    const r = await post(`/api/jobs/${jobId}/resize?wait=${wait}`, body);
    return { status: r.status, body: r.body, location: r.headers.get("Location") };
  },
  estimate: async (body) => (await post("/api/estimate", body)).body,
  // 202: the run moves at its next step (409: not running; 422: no plan fits, or a bad count)
  resizeRun: async (runId, body) => (await post(`/api/runs/${runId}/resize`, body)).body,
  resizeAnswer: async (location, wait = 20) => {
    const r = await request("GET", `${location}?wait=${wait}`);
    return { status: r.status, body: r.body, location };
  },
};

// Follow a server-sent event stream until its `end` event. Handlers: onEvent(kind, data), onEnd(data).
// The stream closes itself after a while on the server; EventSource then reconnects with
// Last-Event-ID and the stream continues where it stopped.
export function follow(url, { onEvent, onEnd, onError }) {
  const es = new EventSource(url);
  let ended = false;
  const kinds = ["status", "progress", "info", "error", "warning"];
  for (const k of kinds) {
    es.addEventListener(k, (ev) => {
      let data = null;
      try { data = JSON.parse(ev.data); } catch { data = { message: ev.data }; }
      onEvent && onEvent(k, data);
    });
  }
  es.onmessage = (ev) => {
    let data = null;
    try { data = JSON.parse(ev.data); } catch { data = { message: ev.data }; }
    onEvent && onEvent(data && data.kind || "message", data);
  };
  es.addEventListener("end", (ev) => {
    ended = true;
    es.close();
    let data = null;
    try { data = JSON.parse(ev.data); } catch { data = {}; }
    onEnd && onEnd(data);
  });
  es.onerror = () => {
    // CLOSED: the server refused the stream (404, say); otherwise the browser reconnects itself
    if (!ended && es.readyState === EventSource.CLOSED) onError && onError();
  };
  return { close: () => { ended = true; es.close(); } };
}
