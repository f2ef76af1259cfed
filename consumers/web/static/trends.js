// The overview's trend charts: per route, a uPlot chart of the window's buckets, fetched from
// /overview/trends every few seconds (as the figures above refresh) and on a change of window.
// window.pkgqTrends holds the charts and the last answer (for a person's console, and tests).
document.addEventListener("DOMContentLoaded", () => {
  const box = document.querySelector("[data-trends]");
  if (!box || typeof uPlot === "undefined") return;
  const grid = box.querySelector("#trend-charts");
  const status = box.querySelector("#trend-status");
  // The hour refreshes with the figures above; the day, in 5-minute buckets, less often.
  const every = () =>
    Number((state.window === "1d" ? box.dataset.everyDay : box.dataset.every) || 3000);
  const HEIGHT = 170;
  // Drawn in this order, the last on top: where all are 0, the baseline is processed's.
  const SERIES = [
    { key: "outbox_lag_s", label: "outbox lag (s)", stroke: "#067647", scale: "s", dash: [5, 4] },
    { key: "parked", label: "parked", stroke: "#7a5af8" },
    { key: "dead_lettered", label: "dead-lettered", stroke: "#b42318" },
    { key: "failed", label: "failed", stroke: "#dc6803" },
    { key: "processed", label: "processed", stroke: "#2457c5" },
  ];
  const SAID = ["processed", "failed", "dead_lettered", "parked", "outbox_lag_s"];
  const state = { window: "1h", charts: {}, cards: {}, last: null };
  window.pkgqTrends = state;
  let timer = null;
  let asking = 0; // only the latest request draws and schedules the next (a click may overtake one)

  const fromZero = (_u, _min, max) => [0, max > 0 ? max * 1.1 : 1];
  const counts = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 1e6];
  const pad = (n) => String(n).padStart(2, "0");
  const hhmm = (t) => {
    const d = new Date(t * 1000); // UTC, as the rest of the console says times
    return `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}`;
  };
  const nonZero = (u, i) => u.data[i].flatMap((v, at) => (v ? [at] : []));
  const options = (width, route) => ({
    width,
    height: HEIGHT,
    legend: { show: false },
    cursor: { drag: { x: false, y: false } },
    scales: { x: { time: true }, y: { range: fromZero }, s: { range: fromZero } },
    series: [
      {},
      ...SERIES.map((s) => ({
        label: s.label,
        stroke: s.stroke,
        width: 1.5,
        scale: s.scale || "y",
        dash: s.dash,
        points: { show: true, size: 5, fill: s.stroke, filter: nonZero },
      })),
    ],
    axes: [
      { space: 64, values: (_u, ticks) => ticks.map(hhmm) },
      { scale: "y", size: 44, incrs: counts },
      {
        scale: "s",
        side: 1,
        size: 52,
        grid: { show: false },
        values: (_u, ticks) => ticks.map((t) => `${t} s`),
      },
    ],
    hooks: { setCursor: [(u) => describe(route, u.cursor.idx)] },
  });

  const widthOf = (card) => Math.max(240, card.clientWidth - 20);
  const sum = (values) => values.reduce((a, b) => a + (b || 0), 0);

  const card = (route) => {
    if (state.cards[route.short]) return state.cards[route.short];
    const found = document.createElement("div");
    found.className = "trend";
    found.dataset.route = route.short;
    const title = document.createElement("h3");
    const name = document.createElement("span");
    name.textContent = route.short;
    const totals = document.createElement("small");
    title.append(name, totals);
    found.append(title);
    grid.append(found);
    state.cards[route.short] = found;
    return found;
  };

  // The card's line: the window's totals, or the values of the bucket under the cursor.
  const describe = (short, at) => {
    const answer = state.last;
    const holder = state.cards[short];
    const route = answer && answer.routes.find((r) => r.short === short);
    if (!route || !holder) return;
    const line = holder.querySelector("h3 small");
    if (at == null) {
      const failed = sum(route.failed);
      line.textContent =
        `${sum(route.processed)} processed, ${failed} failed, ` +
        `${sum(route.dead_lettered)} dead-lettered in the ${answer.window === "1d" ? "day" : "hour"}`;
      line.classList.toggle("bad", failed > 0);
      return;
    }
    const shown = (v) => (v == null ? "–" : String(Math.round(v * 10) / 10));
    line.textContent =
      `${hhmm(answer.buckets[at])} UTC: ` +
      SAID.map((key) => {
        const s = SERIES.find((x) => x.key === key);
        return `${shown(route[key][at])} ${s.label}`;
      }).join(", ");
    line.classList.toggle("bad", route.failed[at] > 0);
  };

  const draw = (answer) => {
    state.last = answer;
    for (const route of answer.routes) {
      const holder = card(route);
      const data = [answer.buckets, ...SERIES.map((s) => route[s.key])];
      const chart = state.charts[route.short];
      if (chart) chart.setData(data);
      else state.charts[route.short] = new uPlot(options(widthOf(holder), route.short), data, holder);
      describe(route.short, chart ? chart.cursor.idx : null);
    }
    status.textContent = `updated ${hhmm(Date.now() / 1000)} UTC`;
  };

  const tick = async () => {
    clearTimeout(timer);
    const mine = ++asking;
    try {
      const reply = await fetch(`${box.dataset.trends}?window=${state.window}`, {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      });
      const answer = reply.ok && !reply.redirected ? await reply.json() : null;
      if (mine !== asking) return;
      if (answer) draw(answer);
    } catch (_) {
      if (mine !== asking) return;
      status.textContent = "not updated: the console did not answer; trying again";
    }
    timer = setTimeout(tick, every());
  };

  box.querySelectorAll("[data-window]").forEach((button) => {
    button.addEventListener("click", () => {
      state.window = button.dataset.window;
      box.querySelectorAll("[data-window]").forEach((b) => {
        b.classList.toggle("on", b === button);
        b.setAttribute("aria-pressed", String(b === button));
      });
      status.textContent = "loading…";
      tick();
    });
  });

  window.addEventListener("resize", () => {
    for (const [short, chart] of Object.entries(state.charts)) {
      chart.setSize({ width: widthOf(state.cards[short]), height: HEIGHT });
    }
  });

  tick();
});
