// sexpgpu ui: the pages of the dashboard, drawn from the server's JSON API.
// Every value from the store goes into the page as text (textContent, setAttribute), never
// as markup, so a run name, a knob value or an event cannot inject HTML.
"use strict";

(function () {
  const main = document.getElementById("main");
  // 30 colours, each at least 27 apart (CIE76) from every other and dark enough to read on
  // white: the first ten are the usual ones, the rest chosen farthest from those before.
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#0000ff",
    "#ff22ff", "#115533", "#6600aa", "#ff0077", "#aaaa77", "#996600", "#0066ff", "#880044", "#ff8888", "#00bb88",
    "#dd00aa", "#556600", "#dd77ff", "#00cc00", "#664466", "#aaaadd", "#0044aa", "#771177", "#882211", "#aa00ff"];
  // What the page shows now; the browser tests read it (window.sexpgpu). `colors`: one meaning
  // per page, the colour of each thing it names (a pass on a run's page, a point on a sweep's).
  const view = { page: null, charts: {}, updates: 0, ready: false, logY: false, palette: PALETTE, colors: {} };
  window.sexpgpu = view;

  function colorOf(key) {
    if (!(key in view.colors)) view.colors[key] = PALETTE[Object.keys(view.colors).length % PALETTE.length];
    return view.colors[key];
  }

  // The page has drawn what it has (charts included): `data-ready` on <body>, after the
  // browser painted, for a headless screenshot to wait for.
  function drawn() {
    view.ready = true;
    requestAnimationFrame(() => requestAnimationFrame(() => { document.body.dataset.ready = "true"; }));
  }

  // -- small helpers ------------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "text") node.textContent = String(value);
      else if (key === "onclick" || key === "onchange" || key === "oninput") node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function num(value) {
    if (value === null || value === undefined) return "nan";
    if (typeof value !== "number") return String(value);
    if (!isFinite(value)) return String(value);
    if (Number.isInteger(value) && Math.abs(value) < 1e15) return String(value);
    if (value !== 0 && (Math.abs(value) >= 1e5 || Math.abs(value) < 1e-4)) return value.toExponential(3).replace(/\.?0+e/, "e");
    return String(Number(value.toPrecision(4)));
  }

  // A value as a reader reads it, never as JSON: a list as (a b c), as the file writes it; a
  // mapping as its keys and values.
  function shown(value) {
    if (value === null || value === undefined) return "-";
    if (typeof value === "string") return value;
    if (typeof value === "number") return num(value);
    if (typeof value === "boolean") return value ? "true" : "false";
    if (Array.isArray(value)) return "(" + value.map(shown).join(" ") + ")";
    return Object.entries(value).map(([k, v]) => `${k} ${shown(v)}`).join(", ");
  }

  // A value for a key-value table: a mapping as a nested table, a list of mappings as one
  // nested table each, the rest as text.
  function cell(value) {
    const mapping = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
    if (mapping(value)) {
      const entries = Object.entries(value).filter(([, v]) => v !== null && v !== undefined);
      return entries.length ? kvTable(entries, "kv nested") : "-";
    }
    if (Array.isArray(value) && value.length && value.every(mapping)) return el("div", {}, value.map((v) => cell(v)));
    return shown(value);
  }

  const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];
  // Bytes in the unit a chart of them uses: MiB, or GiB from 2 GiB.
  function byteUnit(largest) {
    return largest >= 2 * 1024 ** 3 ? 3 : 2;
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined || !isFinite(seconds)) return "-";
    if (seconds < 60) return seconds.toFixed(1) + "s";
    const total = Math.round(seconds), m = Math.floor(total / 60), s = total % 60;
    if (m < 60) return m + "m" + String(s).padStart(2, "0") + "s";
    return Math.floor(m / 60) + "h" + String(m % 60).padStart(2, "0") + "m";
  }

  function when(stamp) {
    if (!stamp) return "-";
    const date = new Date(stamp);
    if (isNaN(date.getTime())) return stamp;
    const pad = (n) => String(n).padStart(2, "0");
    return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
  }

  function steps(record) {
    if (record.step === null || record.step === undefined) return "-";
    return record.steps === null || record.steps === undefined ? String(record.step) : `${record.step}/${record.steps}`;
  }

  function selection(record) {
    const parts = [record.variant || "base"];
    if (record.sweep !== null && record.sweep !== undefined) parts.push(`${record.sweep}-${record.point}`);
    return parts.join(" ");
  }

  // run.json's selection as `sexpgpu run` takes it: the variant (base), --set, the sweep's point
  function selected(chosen) {
    if (!chosen) return "-";
    const parts = [chosen.variant || "base"];
    for (const [k, v] of Object.entries(chosen.set || {})) parts.push(`--set ${k}=${v}`);
    if (chosen.sweep !== null && chosen.sweep !== undefined) parts.push(`${chosen.sweep}-${chosen.point}`);
    return parts.join(" ");
  }

  function stateBadge(state) {
    const name = state || "-";
    return el("span", { class: "state state-" + name.replace(/[^a-z-]/g, ""), "data-state": name, text: name });
  }

  function runLink(slug) {
    return el("a", { href: "/run/" + encodeURIComponent(slug), text: slug });
  }

  function sweepHref(name, file) {
    return "/sweep/" + encodeURIComponent(name) + (file ? "?file=" + encodeURIComponent(file) : "");
  }

  async function getJSON(url) {
    const response = await fetch(url, { cache: "no-store" });
    let doc;
    try { doc = await response.json(); } catch (e) { throw new Error(`${url}: ${response.status} ${response.statusText}`); }
    if (!response.ok) throw new Error(doc && doc.error ? doc.error : `${url}: ${response.status}`);
    return doc;
  }

  function problem(text) {
    const box = document.getElementById("problem");
    box.hidden = !text;
    box.textContent = text || "";
  }

  function showStore(url) {
    document.getElementById("where").textContent = "store " + url;
  }

  function stamped() {
    document.getElementById("updated").textContent = "updated " + when(new Date().toISOString());
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }

  function kvTable(rows, kind) {
    return el("table", { class: kind || "kv" }, rows.map(([key, value]) => el("tr", {}, el("th", { text: key }), el("td", {}, cell(value)))));
  }

  // -- charts -------------------------------------------------------------------------------

  // One chart of series [{label, steps, values}] against step, drawn by uPlot. Steps are
  // joined into one x array; a series has null where it has no point (eval points are
  // sparse), drawn across the gap.
  function aligned(series) {
    const xs = Array.from(new Set(series.flatMap((s) => s.steps))).sort((a, b) => a - b);
    const index = new Map(xs.map((x, i) => [x, i]));
    const ys = series.map((s) => {
      const column = new Array(xs.length).fill(null);
      s.steps.forEach((step, i) => { column[index.get(step)] = s.values[i]; });
      return column;
    });
    return [xs, ...ys];
  }

  function chartWidth(holder) {
    return Math.max(300, Math.floor((holder.clientWidth || 560) - 14));
  }

  function positive(data) {
    return data.slice(1).every((column) => column.every((v) => v === null || v > 0));
  }

  // An axis as wide as its longest tick label (uPlot's default width clips long ones).
  function axisSize(u, values, axisIdx, cycleNum) {
    const axis = u.axes[axisIdx];
    if (cycleNum > 1) return axis._size;
    // the widest label as drawn, not the one with the most characters ("0.00011" is narrower
    // than "9.5e-4" in most fonts)
    u.ctx.font = axis.font[0];
    const widest = Math.max(0, ...(values || []).map((v) => u.ctx.measureText(String(v)).width / devicePixelRatio));
    return Math.ceil(axis.ticks.size + axis.gap + widest) + 4;
  }

  // a step axis ticks whole steps: 1, 2, 5, 10, 20, 50, ...
  const STEP_INCRS = Array.from({ length: 30 }, (_, i) => [1, 2, 5][i % 3] * 10 ** Math.floor(i / 3));

  // Draw (or update) the chart KEY inside HOLDER; SERIES as [{name, label, color, steps,
  // values, points}]. BYTES: the values are bytes, drawn in MiB or GiB.
  function drawChart(holder, key, title, series, bytes) {
    let data = aligned(series);
    let unit = null;
    if (bytes) {
      const power = byteUnit(Math.max(0, ...data.slice(1).flat().filter((v) => v !== null)));
      unit = UNITS[power];
      data = [data[0], ...data.slice(1).map((column) => column.map((v) => (v === null ? null : v / 1024 ** power)))];
    }
    const names = series.map((s) => s.name + "\u0001" + s.color).join("\u0000") + "\u0000" + unit;
    const logY = view.logY && positive(data);
    const existing = view.charts[key];
    if (existing && existing.names === names && existing.logY === logY && holder.contains(existing.box)) {
      existing.uplot.setData(data);
      existing.series = series;
      return existing;
    }
    if (existing) existing.uplot.destroy();
    let box = holder.querySelector(`[data-chart="${CSS.escape(key)}"]`);
    if (!box) {
      box = el("div", { class: "chart", "data-chart": key }, el("div", { class: "title", text: title }));
      holder.append(box);
    } else {
      box.querySelectorAll(".uplot").forEach((node) => node.remove());
    }
    const options = {
      width: chartWidth(box),
      height: 230,
      scales: { x: { time: false }, y: logY ? { distr: 3 } : {} },
      axes: [{ label: "step", incrs: STEP_INCRS, size: 36 }, { label: unit || undefined, size: axisSize, values: (u, splits) => splits.map((v) => num(v)) }],
      legend: { live: true },
      // hovering a line (or its legend entry) dims the others
      focus: { alpha: 0.2 },
      cursor: { focus: { prox: 24 } },
      series: [{ label: "step" }].concat(series.map((s) => ({
        label: s.label,
        stroke: s.color,
        width: 1.5,
        spanGaps: true,
        points: { show: s.points ? true : undefined, size: 5 },
        value: (u, v) => (v === null || v === undefined ? "-" : num(v) + (unit ? " " + unit : "")),
      }))),
    };
    const uplot = new uPlot(options, data, box);
    const chart = { uplot, names, logY, box, series, unit };
    view.charts[key] = chart;
    return chart;
  }

  function dropCharts(keep) {
    for (const key of Object.keys(view.charts)) {
      if (!keep.has(key)) {
        view.charts[key].uplot.destroy();
        view.charts[key].box.remove();
        delete view.charts[key];
      }
    }
  }

  window.addEventListener("resize", () => {
    for (const chart of Object.values(view.charts)) chart.uplot.setSize({ width: chartWidth(chart.box), height: 230 });
  });

  function logToggle(redraw) {
    return el("label", {}, el("input", { type: "checkbox", id: "log-y", checked: view.logY, onchange: (e) => { view.logY = e.target.checked; redraw(); } }), " log y");
  }

  // -- the runs table -----------------------------------------------------------------------

  const RUN_COLUMNS = [
    ["slug", (r) => r.slug, (r) => runLink(r.slug)],
    ["file", (r) => r.file, (r) => el("span", { title: r.file, text: r.file ? r.file.split("/").pop() : "-" })],
    ["selection", (r) => selection(r), (r) => (r.sweep === null || r.sweep === undefined ? selection(r)
      : el("span", {}, (r.variant || "base") + " ", el("a", { href: sweepHref(r.sweep, r.file), text: `${r.sweep}-${r.point}` })))],
    ["state", (r) => r.state, (r) => stateBadge(r.state)],
    ["steps", (r) => r.step, (r) => steps(r), true],
  ];
  const TAIL_COLUMNS = [
    ["started", (r) => r.started, (r) => when(r.started)],
    ["duration", (r) => r.duration_s, (r) => duration(r.duration_s), true],
    ["device", (r) => r.device],
  ];

  function compare(a, b) {
    const missingA = a === null || a === undefined, missingB = b === null || b === undefined;
    if (missingA || missingB) return missingA === missingB ? 0 : missingA ? 1 : -1;
    if (typeof a === "number" && typeof b === "number") return a - b;
    return String(a).localeCompare(String(b), undefined, { numeric: true });
  }

  function runsPage() {
    view.page = "runs";
    const sort = { key: "started", desc: false };
    let runs = [];
    let store = "";
    const search = el("input", { type: "search", placeholder: "filter: text in any cell", id: "filter" });
    const holder = el("div", { class: "wide" });
    const count = el("span", { class: "note" });
    clear(main);
    main.append(el("h1", { text: "Runs" }), el("div", { class: "toolbar" }, search, count), holder);
    search.addEventListener("input", () => render());

    function columns() {
      const train = [...new Set(runs.flatMap((r) => Object.keys(r.metrics || {})))];
      const evals = [...new Set(runs.flatMap((r) => Object.keys(r.eval || {})))];
      const metric = (source, name) => [name, (r) => (r[source] || {})[name], (r) => (name in (r[source] || {}) ? num(r[source][name]) : "-"), true];
      return RUN_COLUMNS.concat(train.map((n) => metric("metrics", n)), evals.map((n) => metric("eval", n)), TAIL_COLUMNS);
    }

    function render() {
      const cols = columns();
      const needle = search.value.trim().toLowerCase();
      const column = cols.find((c) => c[0] === sort.key) || cols[0];
      let rows = runs.filter((r) => !needle || cols.some((c) => String(c[1](r) ?? "").toLowerCase().includes(needle)));
      rows = rows.slice().sort((a, b) => {
        const order = compare(column[1](a), column[1](b));
        const missing = column[1](a) === null || column[1](a) === undefined || column[1](b) === null || column[1](b) === undefined;
        return sort.desc && !missing ? -order : order;
      });
      const head = el("tr", {}, cols.map(([name, , , numeric]) => el("th", {
        class: ["sortable", numeric ? "num" : "", sort.key === name ? (sort.desc ? "sorted-desc" : "sorted-asc") : ""].join(" ").trim(),
        "data-key": name, text: name,
        onclick: () => { if (sort.key === name) sort.desc = !sort.desc; else { sort.key = name; sort.desc = false; } render(); },
      })));
      const body = rows.map((r) => el("tr", { "data-slug": r.slug }, cols.map(([name, value, cell, numeric]) =>
        el("td", { class: numeric ? "num" : null, "data-key": name }, cell ? cell(r) : shown(value(r))))));
      clear(holder);
      holder.append(el("table", { id: "runs", "data-sort": sort.key, "data-desc": String(sort.desc) }, el("thead", {}, head), el("tbody", {}, body)));
      count.textContent = `${rows.length} of ${runs.length} run(s) in ${store}`;
      drawn();
    }

    async function refresh() {
      try {
        const doc = await getJSON("/api/runs");
        runs = doc.runs;
        store = doc.store;
        showStore(doc.store);
        problem(null);
        render();
        stamped();
        view.updates += 1;
      } catch (error) {
        problem(String(error.message || error));
      }
    }
    refresh();
    setInterval(refresh, 5000);
  }

  // -- one run ------------------------------------------------------------------------------

  const SECTIONS = [
    ["train", "Training and evaluation"],
    ["optimizer", "Optimizer"],
    ["speed", "Speed and memory"],
    ["diagnostic", "Diagnostics"],
  ];

  // The chart a series belongs to: a training metric and the same metric of every eval pass
  // share one (loss: train, val, ...); every other series has its own.
  function chartOf(series) {
    // the colour says which pass: train (and everything the training steps log), or an eval's
    if (series.group === "eval") {
      const cut = series.name.indexOf("/");
      const pass = series.name.slice(0, cut);
      return { key: "metric:" + series.name.slice(cut + 1), title: series.name.slice(cut + 1), label: pass, color: colorOf(pass), section: "train", points: true };
    }
    if (series.group === "train") return { key: "metric:" + series.name, title: series.name, label: "train", color: colorOf("train"), section: "train", points: false };
    const title = series.group === "diagnostic" ? series.name.slice("diag:".length) : series.name;
    return { key: series.group + ":" + series.name, title: series.name === "memory" ? "memory (peak resident)" : title, label: title,
      color: colorOf("train"), section: series.group, points: false, bytes: series.name === "memory" };
  }

  function runPage(slug) {
    view.page = "run";
    view.slug = slug;
    const curves = new Map(); // name -> {name, group, steps, values}
    let eventCount = -1;
    clear(main);
    const title = el("h1", { text: slug });
    const summary = el("div");
    const toolbar = el("div", { class: "toolbar" }, logToggle(() => drawAll()), el("span", { class: "note", id: "live" }));
    const skippedBox = el("div", { class: "warning", id: "skipped", hidden: true });
    const sampledBox = el("div", { class: "note", id: "downsampled", hidden: true });
    const chartSections = new Map(SECTIONS.map(([group, name]) => [group, el("section", { "data-section": group, hidden: true }, el("h2", { text: name }), el("div", { class: "charts" }))]));
    const diagnostics = el("section", { hidden: true }, el("h2", { text: "Latest diagnostics" }), el("div", { class: "wide", id: "diagnostics" }));
    const details = el("div", { class: "columns" });
    const eventsBox = el("section", {}, el("h2", { text: "Events" }), el("div", { id: "events" }));
    const sourcesBox = el("section", {}, el("h2", { text: "Source" }), el("div", { id: "sources" }));
    main.append(title, summary, toolbar, skippedBox, sampledBox, ...chartSections.values(), diagnostics, details, eventsBox, sourcesBox);

    // lines of the events that are not events: said, with where they are
    function skipped(warnings) {
      skippedBox.hidden = warnings.length === 0;
      skippedBox.textContent = warnings.length ? `${warnings.length} line(s) of the events skipped: ` + warnings.slice(0, 5).join("; ") + (warnings.length > 5 ? "; ..." : "") : "";
    }
    document.title = slug + " - sexpgpu";

    function drawAll() {
      const groups = new Map();
      for (const series of curves.values()) {
        const chart = chartOf(series);
        if (!groups.has(chart.key)) groups.set(chart.key, { ...chart, series: [] });
        groups.get(chart.key).series.push({ name: series.name, label: chart.label, color: chart.color, steps: series.steps, values: series.values, points: chart.points || series.steps.length === 1 });
      }
      for (const [group, section] of chartSections) {
        section.hidden = ![...groups.values()].some((g) => g.section === group);
      }
      for (const [key, group] of groups) drawChart(chartSections.get(group.section).querySelector(".charts"), key, group.title, group.series, group.bytes);
      dropCharts(new Set(groups.keys()));
      drawDiagnostics();
      drawSampled();
    }

    // a long series is drawn from a few points a pixel; all of them are a link away
    function drawSampled() {
      const sampled = [...curves.values()].filter((s) => s.points);
      sampledBox.hidden = sampled.length === 0;
      clear(sampledBox);
      if (!sampled.length) return;
      sampledBox.append("downsampled (the first, last, lowest and highest point of each pixel's steps): ");
      sampled.forEach((s, i) => {
        const href = `/api/run/${encodeURIComponent(slug)}/curves?points=all&series=${encodeURIComponent(s.name)}`;
        sampledBox.append(i ? "; " : "", `${s.name} ${s.steps.length.toLocaleString("en-US")} of ${s.points.toLocaleString("en-US")} points (`,
          el("a", { href, "data-full": s.name, text: "every point" }), ")");
      });
    }

    function drawDiagnostics() {
      const rows = [...curves.values()].filter((s) => s.group === "diagnostic" && s.steps.length);
      diagnostics.hidden = rows.length === 0;
      const box = diagnostics.querySelector("#diagnostics");
      clear(box);
      if (!rows.length) return;
      box.append(el("table", {}, el("tr", {}, el("th", { text: "diagnostic" }), el("th", { class: "num", text: "step" }), el("th", { class: "num", text: "value" })),
        rows.map((s) => el("tr", {}, el("td", { text: s.name.slice("diag:".length) }), el("td", { class: "num", text: s.steps[s.steps.length - 1] }), el("td", { class: "num", text: num(s.values[s.values.length - 1]) })))));
    }

    function drawRecord(record) {
      clear(summary);
      const evals = Object.entries(record.eval || {}).map(([k, v]) => `${k} ${num(v)}`).join("  ");
      const metrics = Object.entries(record.metrics || {}).map(([k, v]) => `${k} ${num(v)}`).join("  ");
      summary.append(kvTable([
        ["state", record.state], ["step", steps(record)], ["train", metrics || "-"],
        ["eval", evals ? evals + (record.eval_step !== null && record.eval_step !== undefined ? `  (step ${record.eval_step})` : "") : "-"],
        ["folder", record.folder], ["file", record.file], ["selection", selection(record)], ["started", when(record.started)], ["duration", duration(record.duration_s)],
        ["device", record.device], ["host", record.host], ["attempt", record.attempt], ["reason", record.reason],
      ].concat(record.problem ? [["problem", record.problem]] : [])));
      const badge = summary.querySelector("tr td");
      if (badge) { clear(badge); badge.append(stateBadge(record.state)); }
      if (record.sweep !== null && record.sweep !== undefined) {
        summary.append(el("p", {}, "a point of the sweep ", el("a", { href: sweepHref(record.sweep, record.file), text: record.sweep })));
      }
    }

    function drawDetails(doc) {
      clear(details);
      const info = doc.info || {};
      const knobs = Object.entries(info.knobs || {});
      details.append(el("section", {}, el("h2", { text: "Knobs" }),
        knobs.length ? kvTable(knobs) : el("p", { class: "note", text: "no knobs" })));
      details.append(el("section", {}, el("h2", { text: "Run" }), kvTable([
        ["IR hash", info.ir_hash], ["source hash", info.source_hash], ["selection", selected(info.selection)],
        ["max steps", info.max_steps], ["threads", info.threads], ["devices", info.devices], ["versions", info.versions],
        ["host", info.host], ["created", info.created], ["meta", info.meta],
      ])));
      const status = doc.status;
      if (status && status.summary) {
        const s = status.summary;
        details.append(el("section", {}, el("h2", { text: "Summary" }), kvTable([
          ["reason", s.reason], ["exit code", s.exit_code], ["target reached at step", s.target_reached_at_step],
          ["wall time", duration(s.wall_time_s)], ["examples seen", s.examples_seen], ["tokens seen", s.tokens_seen],
          ["last eval", s.last_eval], ["best eval", s.best_eval],
        ])));
      }
    }

    const MAIN_KEYS = new Set(["v", "t", "kind", "step"]);
    let eventKind = "not step";
    async function drawEvents() {
      let events, stepEvents;
      try {
        const doc = await getJSON(`/api/run/${encodeURIComponent(slug)}/events`);
        events = doc.events;
        stepEvents = doc.step_events || 0;
      } catch (error) { problem(String(error.message || error)); return; }
      const stepsHere = events.filter((e) => e.kind === "step").length;
      const box = eventsBox.querySelector("#events");
      const kinds = [...new Set(events.map((e) => String(e.kind)))];
      const select = el("select", { id: "event-kind", onchange: (e) => { eventKind = e.target.value; drawEvents(); } },
        ["not step", "all", ...kinds].map((k) => el("option", { value: k, selected: k === eventKind, text: k })));
      const chosen = events.filter((e) => eventKind === "all" || (eventKind === "not step" ? e.kind !== "step" : e.kind === eventKind));
      const LIMIT = 1000;
      const rows = chosen.slice(-LIMIT);
      clear(box);
      box.append(el("div", { class: "toolbar" }, select, el("span", { class: "note", text: `${chosen.length} of ${events.length} event(s)` + (chosen.length > LIMIT ? `, the last ${LIMIT} shown` : "") +
          (stepEvents > stepsHere ? `; of the ${stepEvents.toLocaleString("en-US")} step events, the latest ${stepsHere.toLocaleString("en-US")}` : "") })),
        el("table", { class: "events" }, el("tr", {}, el("th", { text: "time" }), el("th", { class: "num", text: "step" }), el("th", { text: "kind" }), el("th", { text: "fields" })),
          rows.map((e) => el("tr", { "data-kind": e.kind }, el("td", { text: when(e.t) }), el("td", { class: "num", text: e.step ?? "-" }), el("td", { text: e.kind }),
            el("td", { class: "details", text: Object.entries(e).filter(([k]) => !MAIN_KEYS.has(k)).map(([k, v]) => `${k}=${shown(v)}`).join("  ") })))));
    }

    function drawSources(names) {
      const box = sourcesBox.querySelector("#sources");
      clear(box);
      if (!names.length) { box.append(el("p", { class: "note", text: "no source/ in this run folder" })); return; }
      const code = el("pre", { class: "source", hidden: true });
      const list = el("div", { class: "toolbar" }, names.map((name) => el("a", { href: "#", "data-source": name, text: name, onclick: async (e) => {
        e.preventDefault();
        try {
          const doc = await getJSON(`/api/run/${encodeURIComponent(slug)}/source/${name.split("/").map(encodeURIComponent).join("/")}`);
          code.textContent = doc.text;
          code.hidden = false;
        } catch (error) { problem(String(error.message || error)); }
      } })));
      box.append(list, code);
    }

    function merge(update) {
      if (update.reset) curves.clear();
      for (const series of update.series) {
        const have = curves.get(series.name);
        if (!have) curves.set(series.name, { name: series.name, group: series.group, steps: series.steps.slice(), values: series.values.slice(), points: series.points || null });
        else {
          for (let i = 0; i < series.steps.length; i++) { have.steps.push(series.steps[i]); have.values.push(series.values[i]); }
          if (have.points) have.points += series.steps.length;
        }
      }
    }

    async function start() {
      try {
        const doc = await getJSON(`/api/run/${encodeURIComponent(slug)}`);
        showStore(doc.store);
        drawRecord(doc.record);
        drawDetails(doc);
        drawSources(doc.sources || []);
      } catch (error) {
        problem(String(error.message || error));
        return;
      }
      const live = new EventSource(`/api/run/${encodeURIComponent(slug)}/live`);
      live.addEventListener("update", (message) => {
        const update = JSON.parse(message.data);
        merge(update);
        drawRecord(update.record);
        drawAll();
        problem(null);
        stamped();
        view.updates += 1;
        skipped(update.warnings || []);
        drawn();
        document.getElementById("live").textContent = `live: ${update.events} event(s) read`;
        if (update.events !== eventCount) { eventCount = update.events; drawEvents(); }
      });
      live.addEventListener("problem", (message) => problem(JSON.parse(message.data)));
      live.addEventListener("error", () => { document.getElementById("live").textContent = "live: reconnecting..."; });
    }
    start();
  }

  // -- one sweep ----------------------------------------------------------------------------

  function varying(points) {
    const names = [...new Set(points.flatMap((p) => Object.keys(p.knobs || {})))];
    return names.filter((name) => new Set(points.map((p) => JSON.stringify((p.knobs || {})[name]))).size > 1);
  }

  function pointLabel(point, knobs) {
    const values = knobs.map((k) => `${k}=${shown((point.knobs || {})[k])}`).join(" ");
    return `${point.sweep}-${point.point}` + (values ? " " + values : "");
  }

  // A knob drawn on a log axis: all its values positive and spanning a factor of 10 or more
  // (a log-uniform draw, or a log-spaced grid such as 0.001 0.01 0.1).
  function logScaled(values) {
    return values.length > 1 && values.every((v) => typeof v === "number" && v > 0) && Math.max(...values) >= 10 * Math.min(...values);
  }

  // Parallel coordinates: one vertical axis per knob that varies and one for the metric; one
  // line per point, in the point's colour (the colour of its curve above: one meaning per
  // page). Hovering a line picks out the point's curve.
  function parallel(points, knobs, metric, onHover) {
    const NS = "http://www.w3.org/2000/svg";
    const svgEl = (tag, attrs, text) => {
      const node = document.createElementNS(NS, tag);
      for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
      if (text !== undefined) node.textContent = text;
      return node;
    };
    const axes = knobs.map((k) => ({ name: k, knob: true, value: (p) => (p.knobs || {})[k] })).concat([{ name: metric, knob: false, value: (p) => metricValue(p, metric) }]);
    const width = Math.max(520, 170 * axes.length), height = 300, top = 24, bottom = 40;
    const svg = svgEl("svg", { class: "parallel", width, height, viewBox: `0 0 ${width} ${height}`, "data-metric": metric });
    const x = (i) => 60 + (i * (width - 120)) / Math.max(1, axes.length - 1);
    const scales = axes.map((axis) => {
      const values = points.map(axis.value).filter((v) => v !== null && v !== undefined);
      if (values.length && values.every((v) => typeof v === "number")) {
        const log = axis.knob && logScaled(values);
        const f = log ? Math.log10 : (v) => v;
        const lo = f(Math.min(...values)), hi = f(Math.max(...values));
        const y = (v) => (v === null || v === undefined ? null : hi === lo ? (top + height - bottom) / 2 : top + ((hi - f(v)) * (height - top - bottom)) / (hi - lo));
        const ticks = log ? decades(Math.min(...values), Math.max(...values)) : [Math.min(...values), Math.max(...values)];
        return { ticks, y, log };
      }
      const words = [...new Set(values.map((v) => shown(v)))].sort();
      return { ticks: words, y: (v) => (v === null || v === undefined ? null : top + ((words.indexOf(shown(v)) + 0.5) * (height - top - bottom)) / Math.max(1, words.length)) };
    });
    points.forEach((p, index) => {
      const ys = axes.map((axis, i) => scales[i].y(axis.value(p)));
      if (ys.some((y) => y === null)) return;
      const v = metricValue(p, metric);
      const line = svgEl("polyline", { class: "pc-line", "data-slug": p.slug, stroke: colorOf(p.slug), points: ys.map((y, i) => `${x(i)},${y}`).join(" ") });
      line.append(svgEl("title", {}, `${pointLabel(p, knobs)}: ${metric} ${num(v)}`));
      line.addEventListener("mouseenter", () => onHover(index));
      line.addEventListener("mouseleave", () => onHover(null));
      svg.append(line);
    });
    // the axes and their labels over the lines, so that no line hides a label
    axes.forEach((axis, i) => {
      svg.append(svgEl("line", { class: "axis", x1: x(i), x2: x(i), y1: top, y2: height - bottom }));
      svg.append(svgEl("text", { x: x(i), y: height - bottom + 18, "text-anchor": "middle", "data-scale": scales[i].log ? "log" : "linear" }, axis.name + (scales[i].log ? " (log)" : "")));
      for (const tick of scales[i].ticks) {
        const y = scales[i].y(tick);
        if (y !== null) svg.append(svgEl("text", { x: x(i) - 6, y: y + 4, "text-anchor": "end" }, shown(tick)));
      }
    });
    return svg;
  }

  // Ticks of a log axis from LO to HI: its ends and the powers of ten between.
  function decades(lo, hi) {
    const ticks = [lo];
    for (let e = Math.ceil(Math.log10(lo)); 10 ** e < hi; e++) if (10 ** e > lo * 1.2 && 10 ** e < hi / 1.2) ticks.push(10 ** e);
    return ticks.concat([hi]);
  }

  function metricValue(point, metric) {
    if (point.eval && metric in point.eval) return point.eval[metric];
    if (point.metrics && metric in point.metrics) return point.metrics[metric];
    return null;
  }

  function sweepPage(name, file) {
    view.page = "sweep";
    view.sweep = name;
    clear(main);
    document.title = "sweep " + name + " - sexpgpu";
    let doc = null;
    let metric = null;
    let final = null;
    let page = 1;
    const metricSelect = el("select", { id: "metric", onchange: (e) => { metric = e.target.value; draw(); } });
    const finalSelect = el("select", { id: "final-metric", onchange: (e) => { final = e.target.value; draw(); } });
    const overlay = el("div", { class: "charts single", id: "overlay" });
    const parallelBox = el("div", { class: "wide", id: "parallel" });
    const pointsBox = el("div", { class: "wide", id: "points" });
    const pager = el("div", { class: "toolbar", id: "pager" });
    main.append(el("h1", { text: "Sweep " + name + (file ? " of " + file : "") }),
      el("div", { class: "toolbar" }, el("label", {}, "curve ", metricSelect), logToggle(() => draw())), overlay,
      el("h2", { text: "Knobs against the final metric" }), el("div", { class: "toolbar" }, el("label", {}, "metric ", finalSelect)), parallelBox,
      el("h2", { text: "Points" }), pager, pointsBox);

    // the curves and the table show one page of points; the knobs chart shows them all
    function drawPager() {
      clear(pager);
      if (doc.pages <= 1) return;
      const go = (to) => { page = to; refresh(); };
      pager.append(el("button", { id: "page-prev", disabled: doc.page <= 1, onclick: () => go(doc.page - 1), text: "previous" }),
        el("span", { class: "note", id: "page-of", text: ` page ${doc.page} of ${doc.pages} (points ${(doc.page - 1) * doc.per_page + 1}-${Math.min(doc.page * doc.per_page, doc.points.length)} of ${doc.points.length}) ` }),
        el("button", { id: "page-next", disabled: doc.page >= doc.pages, onclick: () => go(doc.page + 1), text: "next" }));
    }

    function fill(select, names, current) {
      clear(select);
      for (const n of names) select.append(el("option", { value: n, selected: n === current, text: n }));
    }

    function draw() {
      const all = doc.points;
      const shownSlugs = new Set(doc.shown);
      const points = all.filter((p) => shownSlugs.has(p.slug));
      const knobs = varying(all);
      drawPager();
      const names = [...new Set(points.flatMap((p) => (doc.curves[p.slug] || { series: [] }).series.map((s) => s.name)))];
      if (!metric || !names.includes(metric)) metric = names.includes("loss") ? "loss" : names[0];
      fill(metricSelect, names, metric);
      const finals = [...new Set(points.flatMap((p) => Object.keys(p.eval || {})))].concat([...new Set(points.flatMap((p) => Object.keys(p.metrics || {})))]);
      if (!final || !finals.includes(final)) final = finals[0];
      fill(finalSelect, finals, final);
      const series = points.map((p) => {
        const s = (doc.curves[p.slug] || { series: [] }).series.find((c) => c.name === metric);
        return { name: p.slug, label: pointLabel(p, knobs), color: colorOf(p.slug), steps: s ? s.steps : [], values: s ? s.values : [], points: s && s.group === "eval" };
      });
      const chart = metric ? drawChart(overlay, "sweep", metric, series, metric === "memory") : null;
      clear(parallelBox);
      const pick = (index) => { if (chart) chart.uplot.setSeries(index === null ? null : index + 1, { focus: index !== null }); };
      const onPage = new Map(points.map((p, i) => [p.slug, i]));
      if (final) parallelBox.append(parallel(all, knobs, final, (index) => pick(index === null ? null : (onPage.has(all[index].slug) ? onPage.get(all[index].slug) : null))));
      clear(pointsBox);
      const train = [...new Set(points.flatMap((p) => Object.keys(p.metrics || {})))];
      const evals = [...new Set(points.flatMap((p) => Object.keys(p.eval || {})))];
      pointsBox.append(el("table", { id: "sweep-points" },
        el("tr", {}, ["point", "slug", ...knobs, "state", "steps", ...train, ...evals, "reason"].map((h) => el("th", { text: h }))),
        points.map((p) => el("tr", { "data-slug": p.slug }, el("td", { class: "num" }, el("span", { class: "swatch", style: `background: ${colorOf(p.slug)}` }), String(p.point)), el("td", {}, runLink(p.slug)),
          knobs.map((k) => el("td", { text: shown((p.knobs || {})[k]) })), el("td", {}, stateBadge(p.state)), el("td", { class: "num", text: steps(p) }),
          train.map((k) => el("td", { class: "num", text: k in (p.metrics || {}) ? num(p.metrics[k]) : "-" })),
          evals.map((k) => el("td", { class: "num", text: k in (p.eval || {}) ? num(p.eval[k]) : "-" })),
          el("td", { text: p.reason || "-" })))));
      drawn();
    }

    async function refresh() {
      try {
        doc = await getJSON("/api/sweep/" + encodeURIComponent(name) + "?page=" + page + (file ? "&file=" + encodeURIComponent(file) : ""));
        showStore(doc.store);
        problem(null);
        draw();
        stamped();
        view.updates += 1;
      } catch (error) {
        problem(String(error.message || error));
      }
    }
    refresh();
    setInterval(refresh, 5000);
  }

  // -- routing ------------------------------------------------------------------------------

  const path = location.pathname;
  let match;
  if (path === "/") runsPage();
  else if ((match = path.match(/^\/run\/([^/]+)$/))) runPage(decodeURIComponent(match[1]));
  else if ((match = path.match(/^\/sweep\/([^/]+)$/))) sweepPage(decodeURIComponent(match[1]), new URLSearchParams(location.search).get("file"));
  else problem("no such page: " + path);
})();
