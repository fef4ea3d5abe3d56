// Loom admin: draws a job's metric charts with uPlot from the JSON the page carries, redraws
// them every few seconds from /admin/jobs/<id>/charts.json, and asks before destructive forms.
// htmx does the rest of the live updates declaratively (hx-get + hx-trigger in the templates).
(function () {
  "use strict";

  const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2",
                  "#4b5563", "#db2777"];
  const HEIGHT = 220;
  const REFRESH_MS = 10000;
  const plots = new Map();  // chart slug -> {plot, names}

  function options(spec, width) {
    return {
      width: width,
      height: HEIGHT,
      scales: { x: { time: false } },  // x is the training step, not a timestamp
      axes: [{ label: spec.axis || "step" }, {}],  // each phase counts its own steps
      series: [{ label: "step" }].concat(spec.names.map(function (name, i) {
        return { label: name, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true };
      })),
    };
  }

  function countPoints(data) {
    let count = 0;
    for (let i = 1; i < data.length; i++) {
      for (const value of data[i]) { if (value !== null) count++; }
    }
    return count;
  }

  function draw(figure, spec) {
    const slug = figure.dataset.chart;
    const box = figure.querySelector(".plot");
    const known = plots.get(slug);
    if (!spec || spec.points === 0) {
      figure.classList.add("empty");
      figure.dataset.renderedPoints = "0";
      return;
    }
    figure.classList.remove("empty");
    const sameSeries = known && known.names.join("\n") === spec.names.join("\n");
    if (sameSeries) {
      known.plot.setData(spec.data);
    } else {
      if (known) known.plot.destroy();
      const plot = new uPlot(options(spec, box.clientWidth || 400), spec.data, box);
      plots.set(slug, { plot: plot, names: spec.names.slice() });
    }
    figure.dataset.points = String(spec.points);
    // What the chart actually holds, for tests and for anyone checking the page by hand.
    figure.dataset.renderedPoints = String(countPoints(plots.get(slug).plot.data));
  }

  function drawAll(payload) {
    document.querySelectorAll("figure[data-chart]").forEach(function (figure) {
      draw(figure, payload[figure.dataset.chart]);
    });
  }

  function refresh(url) {
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (payload) { if (payload) drawAll(payload); })
      .catch(function () { /* a missed refresh is retried on the next tick */ });
  }

  function resize() {
    plots.forEach(function (entry, slug) {
      const box = document.getElementById(slug).querySelector(".plot");
      entry.plot.setSize({ width: box.clientWidth, height: HEIGHT });
    });
  }

  function start() {
    // A refusal rendered after a form post sits above the versions: bring it into view.
    const problem = document.getElementById("problem");
    if (problem) problem.scrollIntoView({ block: "center" });
    const holder = document.getElementById("chart-data");
    if (holder) {
      drawAll(JSON.parse(holder.textContent));
      setInterval(function () { refresh(holder.dataset.src); }, REFRESH_MS);
      window.addEventListener("resize", resize);
    }
  }

  // Forms marked data-confirm ask first (inline handlers are ruled out by the page's CSP).
  document.addEventListener("submit", function (event) {
    const question = event.target.dataset && event.target.dataset.confirm;
    if (question && !window.confirm(question)) event.preventDefault();
  });

  document.addEventListener("DOMContentLoaded", start);
})();
