/* The stream page's chart: the readings, forecasts, residuals and detector statistics of
   GET /v1/streams/{id}/readings drawn with uPlot (static/vendor/uplot), the stream's alarms
   (GET /v1/alarms) shaded across every panel. It follows new readings by fetching the page's
   summary (/streams/{id}/facts) every few seconds; a past moment (?at=) or a drag on the chart
   stops following. Times are UTC, as on every page. */
"use strict";

(() => {
  const root = document.getElementById("plots");
  if (!root || typeof uPlot === "undefined") return;
  const status = document.getElementById("chart-status");
  const inView = document.getElementById("alarms-in-view");
  const follow = document.getElementById("follow");
  const facts = document.getElementById("facts");
  const urls = root.dataset;

  const MOST_READINGS = 10000; // drawn one by one up to this many; in buckets beyond
  const BUCKETS = 1000;
  const MOST_A_REQUEST = 900000; // the API recomputes at most 1,000,000 readings a request
  const POLL_MS = 2000;
  const HEIGHT = 170;

  const view = {
    span: 600,
    end: null, // epoch seconds; null until the stream has a reading
    last: urls.last ? Number(urls.last) : null,
    period: urls.period ? Number(urls.period) : null,
  };
  if (urls.at) {
    // The moment in the middle, or nearer the right edge when the stream's readings end soon
    // after it.
    const at = Number(urls.at);
    const latest = view.last === null ? Infinity : Math.max(view.last, at + view.span / 10);
    view.end = Math.min(at + view.span / 2, latest);
  } else if (view.last !== null) {
    view.end = view.last;
  }

  let plots = [];
  let shape = "";
  let spans = [];
  let loading = false;
  let again = null; // a load asked for while one runs: done when it ends
  let shown = null; // the reading and bucket width the chart was last fetched for
  let listedIds = null;

  const colour = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();

  function seconds(iso) {
    // The API's times carry microseconds, more than Date.parse promises to read.
    const parts = /^(.*?)(\.\d+)?(Z|[+-]\d\d:\d\d)$/.exec(iso);
    return Date.parse(parts[1] + parts[3]) / 1e3 + (parts[2] ? Number(parts[2]) : 0);
  }

  function utc(epoch) {
    return new Date(epoch * 1e3).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  }

  async function fetched(url, params, kind) {
    const address = new URL(url, location.href);
    for (const [key, value] of Object.entries(params || {})) {
      if (value !== null) address.searchParams.set(key, value);
    }
    const answer = await fetch(address, { headers: { Accept: kind || "application/json" } });
    if (!answer.ok) {
      let detail = answer.statusText;
      try {
        detail = (await answer.json()).detail || detail;
      } catch (ignored) {
        // not problem JSON: the status says enough
      }
      throw new Error(`${answer.status} ${detail}`);
    }
    return kind ? answer.text() : answer.json();
  }

  function columns(history) {
    const t = history.t;
    const none = t.map(() => null);
    const buckets = history.buckets;
    if (buckets) {
      const part = (name, which) => (buckets[name] ? buckets[name][which] : none);
      return {
        value: [part("value", "max"), part("value", "min")],
        forecast: part("forecast", "mean"),
        residual: [part("residual", "max"), part("residual", "min")],
        statistic: (kind) => part(kind, "max"),
      };
    }
    return {
      value: [history.value],
      forecast: history.forecast,
      residual: [history.residual],
      statistic: (kind) => (history.statistics[kind] ? history.statistics[kind] : none),
    };
  }

  function panels(history) {
    const t = history.t;
    const cut = columns(history);
    const banded = cut.value.length === 2;
    const line = (label, stroke, extra) => Object.assign({ label, stroke, width: 1.5 }, extra);
    const value = banded
      ? [line("reading, greatest", colour("--value")), line("reading, least", colour("--value"))]
      : [line("reading", colour("--value"))];
    const residual = banded
      ? [line("residual, greatest", colour("--text")), line("residual, least", colour("--text"))]
      : [line("residual", colour("--text"))];
    const band = (fill) => (banded ? [{ series: [1, 2], fill }] : []);
    const list = [
      {
        title: banded ? "Reading (least to greatest) and forecast" : "Reading and forecast",
        data: [t, ...cut.value, cut.forecast],
        series: [...value, line("forecast", colour("--forecast"), { dash: [6, 3] })],
        bands: band(colour("--value") + "33"),
      },
      {
        title: "Residual (reading − forecast)",
        data: [t, ...cut.residual],
        series: residual,
        bands: band(colour("--muted") + "33"),
      },
    ];
    for (const [kind, threshold] of Object.entries(history.thresholds)) {
      list.push({
        title: `${kind}: statistic${banded ? " (greatest)" : ""} against its threshold`,
        data: [t, cut.statistic(kind), t.map(() => threshold)],
        series: [
          line(kind, colour("--statistic")),
          line("threshold", colour("--threshold"), { dash: [4, 4], width: 1 }),
        ],
        bands: [],
      });
    }
    return list;
  }

  const shading = {
    hooks: {
      drawClear: [
        (u) => {
          const context = u.ctx;
          const least = 3 * devicePixelRatio; // a one-reading alarm stays visible
          const left = u.bbox.left;
          const right = u.bbox.left + u.bbox.width;
          context.save();
          context.fillStyle = colour("--span");
          for (const span of spans) {
            const from = u.valToPos(span.start, "x", true);
            const to = Math.max(u.valToPos(span.end, "x", true), from + least);
            const x0 = Math.max(left, from);
            const x1 = Math.min(right, to);
            if (x1 > x0) context.fillRect(x0, u.bbox.top, x1 - x0, u.bbox.height);
          }
          context.restore();
        },
      ],
    },
  };

  function zoomed(u) {
    // A drag on any panel: show that stretch (fetched again, at its own resolution).
    if (u.select.width < 2) return;
    const from = u.posToVal(u.select.left, "x");
    const to = u.posToVal(u.select.left + u.select.width, "x");
    u.setSelect({ left: 0, width: 0, top: 0, height: 0 }, false);
    follow.checked = false;
    view.span = Math.max(to - from, 1e-3);
    view.end = to;
    pressed();
    load("asked");
  }

  function ticks(u, splits) {
    // 24-hour UTC times; the date as well when the view is longer than a day.
    const span = u.scales.x.max - u.scales.x.min;
    const [from, to] = span > 86400 ? [5, 16] : span > 600 ? [11, 16] : [11, 19];
    return splits.map((split) => new Date(split * 1e3).toISOString().slice(from, to).replace("T", " "));
  }

  function options(panel, width, since, until) {
    const grid = { stroke: colour("--line"), width: 1 };
    const axis = { stroke: colour("--muted"), grid, ticks: grid };
    return {
      title: panel.title,
      width,
      height: HEIGHT,
      tzDate: (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"),
      scales: { x: { time: true, range: () => [since, until] } },
      axes: [Object.assign({ values: ticks }, axis), Object.assign({ size: 60 }, axis)],
      series: [{ label: "time (UTC)" }, ...panel.series],
      bands: panel.bands,
      cursor: { sync: { key: `twinwatch-${urls.stream}` }, drag: { x: true, y: false, setScale: false } },
      plugins: [shading],
      hooks: { setSelect: [zoomed] },
    };
  }

  function draw(history, since, until) {
    const list = panels(history);
    const signature = list.map((panel) => panel.title).join("|") + colour("--background");
    const width = Math.max(root.clientWidth, 200);
    if (signature !== shape) {
      for (const plot of plots) plot.destroy();
      plots = [];
      root.replaceChildren();
      plots = list.map((panel) => new uPlot(options(panel, width, since, until), panel.data, root));
      shape = signature;
    } else {
      plots.forEach((plot, index) => {
        plot.scales.x.range = () => [since, until];
        plot.setData(list[index].data);
      });
    }
    plots.forEach((plot, index) => {
      plot.root.setAttribute("role", "img");
      plot.root.setAttribute("aria-label", `${list[index].title}, ${utc(since)} to ${utc(until)}`);
    });
  }

  function alarmSpans(items, since, until) {
    const end = view.last === null ? until : Math.max(view.last, until);
    return items
      .map((alarm) => ({
        id: alarm.id,
        detector: alarm.detector,
        start: seconds(alarm.opened_at),
        end: alarm.closed_at ? seconds(alarm.closed_at) : end,
        open: !alarm.closed_at,
        peak: alarm.peak,
        threshold: alarm.threshold,
        version: `${alarm.model} version ${alarm.model_version}`,
      }))
      .filter((span) => span.end >= since && span.start < until);
  }

  function listed() {
    // Built again only when the alarms in view change, so a keyboard user's focus on one of
    // its buttons survives a followed update.
    const ids = spans.map((span) => `${span.id}:${span.open}`).join(",");
    if (ids === listedIds) return;
    listedIds = ids;
    inView.replaceChildren();
    if (!spans.length) {
      inView.append(Object.assign(document.createElement("li"), { textContent: "none" }));
      return;
    }
    for (const span of spans) {
      const item = document.createElement("li");
      item.dataset.alarm = span.id;
      const closed = span.open ? "still open" : `closed ${utc(span.end)}`;
      item.textContent =
        `Alarm ${span.id}: ${span.detector}, opened ${utc(span.start)}, ${closed}; ` +
        `peak ${span.peak.toPrecision(3)} against ${span.threshold.toPrecision(3)} (${span.version}) `;
      const zoom = Object.assign(document.createElement("button"), {
        type: "button",
        textContent: "Zoom to it",
      });
      zoom.setAttribute("aria-label", `Zoom to alarm ${span.id}`);
      zoom.addEventListener("click", () => {
        follow.checked = false;
        const length = Math.max(span.end - span.start, 1);
        view.span = Math.max(length * 4, 60);
        view.end = span.end + (view.span - length) / 2;
        pressed();
        load("asked");
      });
      item.append(zoom);
      inView.append(item);
    }
  }

  function joined(first, second) {
    // Two parts' buckets, end to end (a part without readings has no statistics' columns).
    const column = (part, name, which) =>
      part.buckets[name] ? part.buckets[name][which] : part.t.map(() => null);
    const both = Object.assign({}, second, {
      t: first.t.concat(second.t),
      count: first.count.concat(second.count),
      buckets: {},
    });
    for (const name of new Set([...Object.keys(first.buckets), ...Object.keys(second.buckets)])) {
      both.buckets[name] = {};
      for (const which of ["min", "max", "mean"]) {
        both.buckets[name][which] = column(first, name, which).concat(column(second, name, which));
      }
    }
    return both;
  }

  async function readingsBetween(since, until, step) {
    // A view longer than one request may recompute is asked for in parts, cut on bucket edges.
    const ask = (from, to) =>
      fetched(urls.readings, { since: from.toFixed(3), until: to.toFixed(3), step_s: step });
    const perPart = view.period ? MOST_A_REQUEST * view.period : Infinity;
    if (step === null || until - since <= perPart) return ask(since, until);
    const width = Number(step);
    const partSeconds = Math.max(width, Math.floor(perPart / width) * width);
    let history = null;
    for (let from = Math.floor(since / width) * width; from < until; from += partSeconds) {
      status.textContent = `Loading the chart: ${Math.round((100 * (from - since)) / (until - since))}%…`;
      const part = await ask(Math.max(from, since), Math.min(from + partSeconds, until));
      history = history ? joined(history, part) : part;
    }
    return history;
  }

  async function alarmsBetween(since, until) {
    // The alarms opened in the view (the latest 1,000), and the latest opened before it, which
    // may still be open or close inside it.
    const ask = (params) => fetched(urls.alarms, Object.assign({ stream: urls.stream }, params));
    const [inside, before] = await Promise.all([
      ask({ since: since.toFixed(3), until: until.toFixed(3), limit: "1000" }),
      ask({ until: since.toFixed(3), limit: "50" }),
    ]);
    return { items: inside.items.concat(before.items), more: inside.next_cursor !== null };
  }

  async function load(why) {
    // why: "asked" (a button, a drag, the page opening: said aloud when done) or "followed"
    // (new readings: the chart changes quietly).
    if (view.end === null) return;
    if (loading) {
      again = again === "asked" ? again : why;
      return;
    }
    loading = true;
    const since = view.end - view.span;
    const until = view.end + 1e-3;
    const readings = view.period ? view.span / view.period : Infinity;
    const step =
      readings > MOST_READINGS ? Math.max(view.span / BUCKETS, 0.001).toFixed(3) : null;
    shown = { last: view.last, step: step === null ? 0 : Number(step) };
    status.setAttribute("aria-live", why === "followed" ? "off" : "polite");
    try {
      const [history, alarms] = await Promise.all([
        readingsBetween(since, until, step),
        alarmsBetween(since, until),
      ]);
      spans = alarmSpans(alarms.items, since, until);
      draw(history, since, until);
      listed();
      const count = history.count ? history.count.reduce((a, b) => a + b, 0) : history.t.length;
      const many = alarms.more ? "the latest 1,000 of more " : "";
      status.textContent =
        `${count.toLocaleString("en")} readings from ${utc(since)} to ${utc(until)}` +
        (step ? `, each point the least, greatest or mean of ${step} s` : "") +
        `; ${history.model} version ${history.model_version}; ` +
        `${many}${spans.length} alarm${spans.length === 1 ? "" : "s"} in view.`;
    } catch (error) {
      status.setAttribute("aria-live", "polite");
      status.textContent = `The chart could not be loaded: ${error.message}.`;
    } finally {
      loading = false;
      if (again !== null) {
        const next = again;
        again = null;
        load(next);
      }
    }
  }

  async function poll() {
    // Fetched again after the last answer (never two at once), while the tab is looked at.
    if (!document.hidden) {
      try {
        const html = await fetched(facts.dataset.facts, null, "text/html");
        if (facts.innerHTML.trim() !== html.trim()) facts.innerHTML = html;
        const summary = facts.querySelector("dl");
        if (summary && summary.dataset.last) view.last = Number(summary.dataset.last);
        if (summary && summary.dataset.period) view.period = Number(summary.dataset.period);
      } catch (error) {
        status.textContent = `Following the stream failed: ${error.message}. Trying again.`;
      }
      // Following, the chart is fetched again when a new reading came, or with buckets once a
      // bucket's worth of new readings came (a long view is costly to recompute).
      const due = shown === null || view.last - shown.last > shown.step;
      if (follow.checked && view.last !== null && due) {
        view.end = view.last;
        load("followed");
      }
    }
    setTimeout(poll, POLL_MS);
  }

  function pressed() {
    for (const button of document.querySelectorAll("[data-span]")) {
      button.setAttribute("aria-pressed", String(Number(button.dataset.span) === view.span));
    }
  }

  for (const button of document.querySelectorAll("[data-span]")) {
    button.addEventListener("click", () => {
      view.span = Number(button.dataset.span);
      if (follow.checked && view.last !== null) view.end = view.last;
      pressed();
      load("asked");
    });
  }
  for (const button of document.querySelectorAll("[data-move]")) {
    button.addEventListener("click", () => {
      if (view.end === null) return;
      follow.checked = false;
      view.end += (Number(button.dataset.move) * view.span) / 2;
      load("asked");
    });
  }
  follow.addEventListener("change", () => {
    if (follow.checked && view.last !== null) {
      view.end = view.last;
      load("asked");
    }
  });
  new ResizeObserver(() => {
    const width = Math.max(root.clientWidth, 200);
    for (const plot of plots) plot.setSize({ width, height: HEIGHT });
  }).observe(root);
  matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => {
    shape = ""; // drawn again in the scheme's colours
    load("followed");
  });

  window.twinwatchChart = { view, plots: () => plots, spans: () => spans };
  pressed();
  load("asked");
  setTimeout(poll, POLL_MS);
})();
