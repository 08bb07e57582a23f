// Serving Lab's live dashboard: draws the frames of /dashboard/events (core/dashboard_frames.py).
// Plain JavaScript, no build step; the charts are uPlot's (vendored), the KV pool a canvas of its own.
// `window.dashboard` holds what the page has seen, for the tests and for a curious reader's console.
(function () {
  "use strict";

  const HISTORY = 200;  // steps the timelines show
  const FLASH_MS = 600;
  const POOL_CELLS = 1024;  // cells drawn for a pool too large to send block by block
  const COLORS = {free: "#e5e7eb", cached: "#93c5fd", shared: "#7c3aed", evicted: "#dc2626"};
  const TENANT_COLORS = ["#16a34a", "#ea580c", "#0891b2", "#ca8a04", "#db2777", "#4f46e5", "#65a30d", "#9f1239"];
  const FREE = 0, CACHED_FREE = 1, SHARED = 2, USED_BY = 3;  // core/kv_pool_snapshot.py

  const state = window.dashboard = {
    frames: 0, numSteps: 0, stepsReceived: 0, done: false, queue: null, pool: null,
    maxInUseBlocks: 0, maxNonFreeBlocks: 0, maxBatchTokens: 0, preemptionsSeen: 0,
  };
  const $ = id => document.getElementById(id);
  let fields = null;  // step field name -> index in a step's row
  let steps = [];
  let previousPool = null;
  let tenantColors = new Map();
  let source = null;

  // ---- charts ----

  function width(el) { return Math.max(240, el.parentElement.clientWidth - 20); }
  const resizable = [];  // [chart, its element]: each follows its panel's width
  const bars = uPlot.paths.bars({size: [0.9, 24]});
  const noLine = () => null;

  const batchChart = new uPlot({
    width: width($("batch-chart")), height: 220, scales: {x: {time: false}},
    series: [
      {label: "step"},
      {label: "prefill + decode tokens", stroke: "#f59e0b", fill: "#fcd34d", paths: bars, points: {show: false}},
      {label: "decode tokens", stroke: "#2563eb", fill: "#93c5fd", paths: bars, points: {show: false}},
      {label: "decode rows", stroke: "#1e3a8a", dash: [4, 3], points: {show: false}},
      {label: "token budget", stroke: "#6b7280", width: 2, points: {show: false}},
      {label: "preempted", stroke: COLORS.evicted, paths: noLine, points: {show: true, size: 8, fill: COLORS.evicted}},
    ],
    axes: [{label: "step"}, {label: "tokens"}],
  }, [[], [], [], [], [], []], $("batch-chart"));
  resizable.push([batchChart, $("batch-chart")]);

  const queueChart = new uPlot({
    width: width($("queue-chart")), height: 200, scales: {x: {time: false}},
    series: [
      {label: "step"},
      {label: "running", stroke: "#16a34a", width: 2, points: {show: false}},
      {label: "waiting", stroke: "#ea580c", width: 2, points: {show: false}},
      {label: "swapped", stroke: "#7c3aed", width: 2, points: {show: false}},
      {label: "max_num_seqs", stroke: "#9ca3af", dash: [4, 3], points: {show: false}},
    ],
    axes: [{label: "step"}, {label: "requests"}],
  }, [[], [], [], [], []], $("queue-chart"));
  resizable.push([queueChart, $("queue-chart")]);

  function bucketLabel(le) {
    return le < 1 ? `${+(le * 1000).toFixed(1)}ms` : `${le}s`;
  }

  function histogramChart(el, label, color) {
    let labels = [];
    const chart = new uPlot({
      width: width(el), height: 180, scales: {x: {time: false}},
      series: [{label: "bucket", value: (u, i) => i == null ? "" : labels[i] || ""},
               {label, stroke: color, fill: color + "88", paths: bars, points: {show: false}}],
      axes: [{splits: u => labels.map((_, i) => i),
              values: (u, splits) => splits.map(i => i % Math.ceil(labels.length * 46 / u.width) ? "" : labels[i])},
             {label: "count"}],
    }, [[], []], el);
    resizable.push([chart, el]);
    return histogram => {
      labels = histogram.le.map(le => "≤" + bucketLabel(le)).concat([">" + bucketLabel(histogram.le[histogram.le.length - 1])]);
      chart.setData([labels.map((_, i) => i), histogram.counts]);
    };
  }
  const drawTtft = histogramChart($("ttft-chart"), "requests", "#2563eb");
  const drawItl = histogramChart($("itl-chart"), "gaps", "#16a34a");

  window.addEventListener("resize", () => {
    for (const [chart, el] of resizable) chart.setSize({width: width(el), height: chart.height});
  });

  // ---- one frame ----

  function onFrame(frame) {
    state.frames += 1;
    if (!fields) fields = Object.fromEntries(frame.step_fields.map((name, i) => [name, i]));
    $("title").textContent = frame.title;
    $("source").textContent = frame.source === "server" ? "live server" : "simulated run, replayed";
    $("num-steps").textContent = frame.num_steps;
    $("clock").textContent = frame.time.toFixed(2);
    state.numSteps = frame.num_steps;
    state.stepsReceived += frame.steps.length;
    if (frame.steps.length) addSteps(frame.steps);
    if (frame.kv_pool) drawPool(frame.kv_pool);
    drawMetrics(frame.metrics);
    drawTenants(frame.tenants);
    drawTtft(frame.histograms.ttft);
    drawItl(frame.histograms.itl);
    if (frame.done) {
      state.done = true;
      source.close();
      $("status").textContent = "replay finished";
    }
  }

  function addSteps(rows) {
    const f = fields;
    steps = steps.concat(rows).slice(-HISTORY);
    const last = rows[rows.length - 1];
    state.queue = {running: last[f.num_running], waiting: last[f.num_waiting], swapped: last[f.num_swapped]};
    $("queue-caption").textContent =
      `running ${state.queue.running} · waiting ${state.queue.waiting} (${state.queue.swapped} swapped)`;
    const preempted = rows.reduce((n, r) => n + r[f.num_preempted], 0);
    if (preempted) {
      state.preemptionsSeen += preempted;
      flash($("queue-panel"));
      flash($("batch-panel"));
    }
    const x = steps.map(r => r[f.step_id]);
    const decode = steps.map(r => r[f.num_decode_tokens]);
    const total = steps.map(r => r[f.num_decode_tokens] + r[f.num_prefill_tokens]);
    state.maxBatchTokens = Math.max(state.maxBatchTokens, ...total);
    batchChart.setData([x, total, decode, steps.map(r => r[f.num_decode_rows]), steps.map(r => r[f.token_budget]),
                        steps.map((r, i) => r[f.num_preempted] ? total[i] : null)]);
    queueChart.setData([x, steps.map(r => r[f.num_running]), steps.map(r => r[f.num_waiting]),
                        steps.map(r => r[f.num_swapped]), steps.map(r => r[f.max_num_seqs])]);
    const mean = total.reduce((a, b) => a + b, 0) / total.length;
    const ms = 1000 * steps.reduce((a, r) => a + r[f.duration], 0) / steps.length;
    $("batch-caption").textContent = `last ${steps.length} steps: ${mean.toFixed(1)} tokens a step of a budget of ` +
      `${last[f.token_budget]}, ${ms.toFixed(2)} ms a step`;
  }

  // ---- the KV pool ----

  function tenantColor(tenant) {
    if (!tenantColors.has(tenant)) tenantColors.set(tenant, TENANT_COLORS[tenantColors.size % TENANT_COLORS.length]);
    return tenantColors.get(tenant);
  }

  function poolStates(pool) {
    if (pool.block_states !== null) {
      const raw = atob(pool.block_states);
      return {states: Uint8Array.from(raw, c => c.charCodeAt(0)), perCell: 1};
    }
    // too many blocks to send one by one: cells in proportion to the counts
    const cells = Math.min(POOL_CELLS, pool.num_blocks), perCell = pool.num_blocks / cells;
    const states = new Uint8Array(cells);
    let i = 0;
    for (const [count, code] of [[pool.num_shared, SHARED], [pool.num_used, USED_BY], [pool.num_cached_free, CACHED_FREE]]) {
      const n = Math.round(count / perCell);
      states.fill(code, i, Math.min(cells, i + n));
      i += n;
    }
    return {states, perCell};
  }

  function drawPool(pool) {
    const {states, perCell} = poolStates(pool);
    const tenants = pool.block_states !== null ? pool.tenants : ["in use"];
    const colorOf = code => code === FREE ? COLORS.free : code === CACHED_FREE ? COLORS.cached
      : code === SHARED ? COLORS.shared : tenantColor(tenants[code - USED_BY]);
    const canvas = $("kv-grid");
    const w = width(canvas), n = states.length;
    const cell = Math.max(2, Math.min(24, Math.floor(Math.sqrt(w * 300 / n))));
    const cols = Math.floor(w / cell), rows = Math.ceil(n / cols);
    canvas.width = cols * cell;
    canvas.height = rows * cell;
    const evicted = [];
    const ctx = canvas.getContext("2d");
    for (let b = 0; b < n; b++) {
      ctx.fillStyle = colorOf(states[b]);
      ctx.fillRect((b % cols) * cell, Math.floor(b / cols) * cell, cell - (cell > 3), cell - (cell > 3));
      if (previousPool && previousPool.length === n && previousPool[b] === CACHED_FREE && states[b] >= SHARED) {
        evicted.push(b);  // its cached contents were evicted for a new owner
      }
    }
    if (evicted.length) {
      ctx.strokeStyle = COLORS.evicted;
      ctx.lineWidth = Math.max(1, cell / 4);
      for (const b of evicted) ctx.strokeRect((b % cols) * cell + 0.5, Math.floor(b / cols) * cell + 0.5, cell - 1, cell - 1);
      flash($("kv-panel"));
    }
    if (state.pool && pool.num_evictions > state.pool.evictions) flash($("kv-panel"));
    previousPool = pool.block_states !== null ? states : null;
    const inUse = pool.num_used + pool.num_shared;
    state.pool = {used: pool.num_used, shared: pool.num_shared, cached: pool.num_cached_free, free: pool.num_free,
                  evictions: pool.num_evictions, perCell};
    state.maxInUseBlocks = Math.max(state.maxInUseBlocks, inUse);
    state.maxNonFreeBlocks = Math.max(state.maxNonFreeBlocks, inUse + pool.num_cached_free);
    $("kv-caption").textContent = `${pool.num_blocks} blocks of ${pool.block_size} tokens` +
      (perCell > 1 ? ` (a cell is ${perCell.toFixed(1)} blocks)` : "") + ` · ${pool.num_evictions} evicted so far`;
    const legend = [[COLORS.free, "free", pool.num_free], [COLORS.cached, "cached, free (evictable)", pool.num_cached_free],
                    [COLORS.shared, "shared (refcount > 1)", pool.num_shared]];
    if (pool.block_states !== null) {
      for (const tenant of pool.tenants) legend.push([tenantColor(tenant), `used by ${tenant}`, null]);
      legend.push([COLORS.evicted, "evicted for a new owner (outline)", null]);
    } else {
      legend.push([tenantColor("in use"), "used", pool.num_used]);
    }
    $("kv-legend").replaceChildren(...legend.map(([color, label, count]) => {
      const li = document.createElement("li");
      li.innerHTML = `<i style="background:${color}"></i>`;
      li.append(count === null ? label : `${label}: ${count}`);
      return li;
    }));
  }

  // ---- numbers ----

  function setMetric(name, value, text, detail) {
    const el = document.querySelector(`[data-metric="${name}"]`);
    el.dataset.value = value === null ? "" : String(value);
    el.querySelector(".value").textContent = value === null ? "-" : text;
    el.querySelector(".detail").textContent = detail;
  }

  function drawMetrics(m) {
    for (const name of ["time_to_first_token", "inter_token_latency", "time_to_decode_per_output_token"]) {
      const x = m[name];
      setMetric(name, x.mean_ms, x.mean_ms === null ? "" : `${x.mean_ms.toFixed(x.mean_ms < 10 ? 2 : 1)} ms`,
                `mean of ${x.count} · ${x.series}`);
      document.querySelector(`[data-metric="${name}"]`).dataset.count = x.count;
    }
    const rate = m.output_tokens_per_second;
    setMetric("output_tokens_per_second", rate.value, rate.value === null ? "" : rate.value.toFixed(1),
              `${rate.total} tokens so far · ${rate.series}`);
    document.querySelector('[data-metric="output_tokens_per_second"]').dataset.total = rate.total;
    const pre = m.preempted_sequences;
    setMetric("preempted_sequences", pre.value, String(pre.value), `${pre.sequences} sequences · ${pre.series}`);
    const kv = m.kv_cache_utilization;
    setMetric("kv_cache_utilization", kv.value, `${(100 * kv.value).toFixed(1)} %`, kv.series);
  }

  function drawTenants(tenants) {
    const total = tenants.reduce((a, t) => a + t.tokens, 0) || 1;
    const weighted = tenants.length && tenants[0].weight !== null;
    const weights = tenants.reduce((a, t) => a + (t.weight || 0), 0) || 1;
    $("tenants").tBodies[0].replaceChildren(...tenants.map(t => {
      const tr = document.createElement("tr");
      const share = t.tokens / total, weightShare = weighted ? t.weight / weights : null;
      const name = document.createElement("td");
      name.textContent = t.tenant;
      const bar = (cls, x) => `<td class="${cls}"><div style="width:${(100 * x).toFixed(1)}%"></div>${(100 * x).toFixed(1)} %</td>`;
      tr.append(name);
      tr.insertAdjacentHTML("beforeend", bar("bar", share) +
        (weighted ? bar("bar weight", weightShare) : "<td>- (the scheduling policy weighs no one)</td>") + `<td>${t.tokens}</td>`);
      return tr;
    }));
  }

  function flash(el) {
    el.classList.add("flash");
    clearTimeout(el.flashTimer);
    el.flashTimer = setTimeout(() => el.classList.remove("flash"), FLASH_MS);
  }

  // ---- the stream ----

  function connect() {
    if (window.dashboardFeed) {  // a page with no server (the course site's): its feed calls onFrame itself
      source = window.dashboardFeed(onFrame);
      return;
    }
    source = new EventSource("dashboard/events");
    source.onopen = () => { $("status").textContent = "connected"; };
    source.onmessage = event => onFrame(JSON.parse(event.data));
    source.onerror = () => {
      if (state.done) return;
      $("status").textContent = "disconnected, retrying";
      if (source.readyState === EventSource.CLOSED) setTimeout(connect, 2000);  // refused: the browser gave up
    };
  }
  connect();
})();
