// matrix-proxy report: draws every <figure class="chart"> as inline SVG from the JSON
// block inside it. No library and no network: what is drawn is exactly the block.
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var W = 720, H = 400, M = { l: 64, r: 16, t: 12, b: 44 };
  var COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
    "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];

  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) { e.setAttribute(k, attrs[k]); }
    if (parent) { parent.appendChild(e); }
    return e;
  }

  // About five round numbers covering [lo, hi].
  function ticks(lo, hi) {
    if (!(hi > lo)) { return [lo]; }
    var step = Math.pow(10, Math.floor(Math.log10((hi - lo) / 5)));
    var err = (hi - lo) / 5 / step;
    if (err >= 5) { step *= 5; } else if (err >= 2) { step *= 2; }
    var out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
      out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
    }
    return out;
  }

  function fmt(v) {
    var a = Math.abs(v);
    if (a === 0) { return "0"; }
    if (a >= 1000) { return v.toFixed(0); }
    if (a >= 10) { return (+v.toFixed(1)).toString(); }
    if (a >= 1) { return (+v.toFixed(2)).toString(); }
    return (+v.toPrecision(2)).toString();
  }

  // The plot area: scales, axes, grid and labels.
  function frame(svg, x, y, spec, xticks) {
    var sx = function (v) { return M.l + (v - x[0]) / ((x[1] - x[0]) || 1) * (W - M.l - M.r); };
    var sy = function (v) { return H - M.b - (v - y[0]) / ((y[1] - y[0]) || 1) * (H - M.t - M.b); };
    var g = el("g", { "class": "axes" }, svg);
    (xticks || ticks(x[0], x[1])).forEach(function (t) {
      el("line", { x1: sx(t), x2: sx(t), y1: M.t, y2: H - M.b, "class": "grid" }, g);
      el("text", { x: sx(t), y: H - M.b + 16, "text-anchor": "middle" }, g).textContent = fmt(t);
    });
    ticks(y[0], y[1]).forEach(function (t) {
      el("line", { x1: M.l, x2: W - M.r, y1: sy(t), y2: sy(t), "class": "grid" }, g);
      el("text", { x: M.l - 6, y: sy(t) + 4, "text-anchor": "end" }, g).textContent = fmt(t);
    });
    el("rect", { x: M.l, y: M.t, width: W - M.l - M.r, height: H - M.t - M.b, "class": "box" }, g);
    el("text", { x: (M.l + W - M.r) / 2, y: H - 6, "text-anchor": "middle", "class": "label" }, g)
      .textContent = spec.x_label;
    el("text", { x: 14, y: (M.t + H - M.b) / 2, "text-anchor": "middle", "class": "label",
      transform: "rotate(-90 14 " + (M.t + H - M.b) / 2 + ")" }, g).textContent = spec.y_label;
    return { sx: sx, sy: sy };
  }

  function extent(values, zero) {
    var lo = zero ? 0 : Infinity, hi = -Infinity;
    values.forEach(function (v) { if (v < lo) { lo = v; } if (v > hi) { hi = v; } });
    if (!isFinite(lo)) { lo = 0; }
    if (!isFinite(hi) || hi <= lo) { hi = lo + 1; }
    return [lo, hi];
  }

  function legend(fig, spec) {
    var ul = document.createElement("ul");
    ul.className = "legend";
    spec.series.forEach(function (s, i) {
      var li = document.createElement("li");
      var sw = document.createElement("span");
      sw.className = "swatch";
      sw.style.background = COLORS[i % COLORS.length];
      li.appendChild(sw);
      li.appendChild(document.createTextNode(s.name + (s.n !== undefined ? " (n=" + s.n + ")" : "")));
      ul.appendChild(li);
    });
    fig.appendChild(ul);
  }

  function cdf(svg, spec) {
    var k = spec.x_scale || 1, xs = [];
    spec.series.forEach(function (s) { s.points.forEach(function (p) { xs.push(p[1] * k); }); });
    var f = frame(svg, extent(xs, true), [0, 100], spec);
    spec.series.forEach(function (s, i) {
      var d = "";
      s.points.forEach(function (p, j) {
        var x = f.sx(p[1] * k), y = f.sy(p[0]);
        // A step: along at the last share to this value, then up to this share.
        d += j === 0 ? "M" + x.toFixed(1) + "," + y.toFixed(1) : " H" + x.toFixed(1) + " V" + y.toFixed(1);
      });
      el("path", { d: d, "class": "mark line", stroke: COLORS[i % COLORS.length],
        "stroke-dasharray": s.outcome === "failed" ? "5,3" : "none" }, svg);
    });
  }

  function rounds(svg, spec) {
    var k = spec.y_scale || 1, xs = [], ys = [];
    spec.series.forEach(function (s) {
      s.points.forEach(function (p) { xs.push(p[0]); ys.push(p[2] * k); });
    });
    var xe = extent(xs, false), pad = (xe[1] - xe[0]) * 0.05 || 0.5;
    // The levels themselves are the ticks when there are few of them.
    var levels = xs.filter(function (v, i) { return xs.indexOf(v) === i; }).sort(function (a, b) { return a - b; });
    var f = frame(svg, [xe[0] - pad, xe[1] + pad], extent(ys, true), spec, levels.length <= 12 ? levels : null);
    spec.series.forEach(function (s, i) {
      var c = COLORS[i % COLORS.length], byX = {};
      s.points.forEach(function (p) {
        (byX[p[0]] = byX[p[0]] || []).push(p[2] * k);
        el("circle", { cx: f.sx(p[0]), cy: f.sy(p[2] * k), r: 4, fill: c, "class": "mark point" }, svg)
          .appendChild(document.createElementNS(NS, "title")).textContent =
            s.name + ": " + p[0] + (p[1] === null ? "" : " round " + p[1]) + " = " + fmt(p[2] * k);
      });
      // The line joins each level's median round.
      var d = "";
      Object.keys(byX).map(Number).sort(function (a, b) { return a - b; }).forEach(function (x, j) {
        var v = byX[x].slice().sort(function (a, b) { return a - b; });
        var med = v[Math.ceil(v.length / 2) - 1];
        d += (j === 0 ? "M" : " L") + f.sx(x).toFixed(1) + "," + f.sy(med).toFixed(1);
      });
      el("path", { d: d, "class": "mark line", stroke: c }, svg);
    });
  }

  // The measured rounds, shaded, each titled with its label.
  function spans(svg, f, rounds) {
    rounds.forEach(function (r, i) {
      var x1 = f.sx(r.start_us / 1e6), x2 = f.sx(r.end_us / 1e6);
      el("rect", { x: x1, y: M.t, width: Math.max(1, x2 - x1), height: H - M.t - M.b,
        "class": "span " + (i % 2 ? "odd" : "even") }, svg)
        .appendChild(document.createElementNS(NS, "title")).textContent = r.label;
    });
  }

  function timeline(svg, spec) {
    var bin = spec.bin_us, t0 = spec.first_bin * bin, n = 0, ys = [];
    spec.series.forEach(function (s) { n = Math.max(n, s.counts.length); ys = ys.concat(s.counts); });
    var f = frame(svg, [t0 / 1e6, (t0 + n * bin) / 1e6], extent(ys, true), spec);
    spans(svg, f, spec.rounds);
    spec.series.forEach(function (s, i) {
      var d = "";
      s.counts.forEach(function (v, j) {
        var x1 = f.sx((t0 + j * bin) / 1e6), x2 = f.sx((t0 + (j + 1) * bin) / 1e6), y = f.sy(v);
        d += (j === 0 ? "M" + x1.toFixed(1) + "," + y.toFixed(1) : " V" + y.toFixed(1)) + " H" + x2.toFixed(1);
      });
      el("path", { d: d, "class": "mark line", stroke: COLORS[i % COLORS.length] }, svg);
    });
  }

  // The worker's and the GPU's lines on the run's clock, the measured rounds shaded.
  function series(svg, spec) {
    var xs = [], ys = [];
    spec.series.forEach(function (s) {
      s.points.forEach(function (p) { xs.push(p[0] / 1e6); ys.push(p[1]); });
    });
    spec.rounds.forEach(function (r) { xs.push(r.start_us / 1e6); xs.push(r.end_us / 1e6); });
    var f = frame(svg, extent(xs, false), extent(ys, true), spec);
    spans(svg, f, spec.rounds);
    spec.series.forEach(function (s, i) {
      var c = COLORS[i % COLORS.length], d = "";
      s.points.forEach(function (p, j) {
        d += (j === 0 ? "M" : " L") + f.sx(p[0] / 1e6).toFixed(1) + "," + f.sy(p[1]).toFixed(1);
      });
      el("path", { d: d, "class": "mark line", stroke: c }, svg)
        .appendChild(document.createElementNS(NS, "title")).textContent = s.name + " (" + s.metric + ")";
    });
  }

  // A search: each probe's value at its load, its bound as a bar, the SLOs' bounds as
  // dashed lines and the answer as a vertical line.
  function search(svg, spec) {
    var xs = [], ys = [];
    spec.series.forEach(function (s) {
      s.points.forEach(function (p) {
        xs.push(p[0]);
        p.slice(1).forEach(function (v) { if (v !== null) { ys.push(v); } });
      });
    });
    spec.lines.forEach(function (l) { ys.push(l.y); });
    if (spec.knee !== null) { xs.push(spec.knee); }
    var xe = extent(xs, false), pad = (xe[1] - xe[0]) * 0.05 || 0.5;
    var f = frame(svg, [xe[0] - pad, xe[1] + pad], extent(ys, true), spec);
    spec.lines.forEach(function (l, i) {
      el("line", { x1: M.l, x2: W - M.r, y1: f.sy(l.y), y2: f.sy(l.y), "class": "mark slo",
        stroke: COLORS[i % COLORS.length], "stroke-dasharray": "6,4" }, svg)
        .appendChild(document.createElementNS(NS, "title")).textContent = l.label;
    });
    if (spec.knee !== null) {
      el("line", { x1: f.sx(spec.knee), x2: f.sx(spec.knee), y1: M.t, y2: H - M.b,
        "class": "mark knee", stroke: "#000", "stroke-dasharray": "2,3" }, svg)
        .appendChild(document.createElementNS(NS, "title")).textContent = "answer: " + spec.knee;
    }
    spec.series.forEach(function (s, i) {
      var c = COLORS[i % COLORS.length];
      s.points.forEach(function (p) {
        if (p[1] === null) { return; }
        if (p[2] !== null && p[3] !== null) {
          el("line", { x1: f.sx(p[0]), x2: f.sx(p[0]), y1: f.sy(p[2]), y2: f.sy(p[3]),
            stroke: c, "class": "mark bar" }, svg);
        }
        el("circle", { cx: f.sx(p[0]), cy: f.sy(p[1]), r: 4, fill: c, "class": "mark point" }, svg)
          .appendChild(document.createElementNS(NS, "title")).textContent =
            s.name + " at " + p[0] + ": " + fmt(p[1]) +
            (p[2] !== null && p[3] !== null ? " [" + fmt(p[2]) + ", " + fmt(p[3]) + "]" : "");
      });
    });
  }

  var DRAW = { cdf: cdf, rounds: rounds, timeline: timeline, series: series, search: search };

  document.querySelectorAll("figure.chart").forEach(function (fig) {
    var plot = fig.querySelector(".plot");
    try {
      var spec = JSON.parse(fig.querySelector("script.chart-data").textContent);
      // A timeline (and the worker's lines under it) spans the page: wider, same height.
      W = spec.kind === "timeline" || spec.kind === "series" ? 1200 : 720;
      var svg = el("svg", { viewBox: "0 0 " + W + " " + H, role: "img",
        "aria-label": spec.title, preserveAspectRatio: "xMidYMid meet" });
      plot.appendChild(svg);
      DRAW[spec.kind](svg, spec);
      legend(fig, spec);
      fig.setAttribute("data-drawn", String(svg.querySelectorAll(".mark").length));
    } catch (e) {
      plot.textContent = "This chart could not be drawn: " + e;
      fig.setAttribute("data-drawn", "0");
      fig.setAttribute("data-error", String(e));
    }
  });
  document.body.setAttribute("data-report-ready", "true");
})();
