// mpsearch serve: upload size checks, the profile card, errors brought into view, live job
// progress (the whole job and the current stage) and its mini-chart, and the results' front
// chart (plotly.js, served locally: hover shows a point, a click selects it).
// Plain browser JavaScript, served locally; every page works without it (forms post normally).
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("page-data").textContent || "{}");
  function $(id) { return document.getElementById(id); }

  function showError(slot, text) {
    var box = $("error-" + slot);
    if (!box) return;
    box.hidden = false;
    box.setAttribute("role", "alert");
    box.textContent = text;
  }

  // A page that comes back with an error (a refused form) scrolls to it: the user is there.
  var alert = document.querySelector(".error[role=alert]:not([hidden])");
  if (alert && alert.textContent.trim()) {
    alert.scrollIntoView({block: "center"});
    alert.setAttribute("tabindex", "-1");
    alert.focus({preventScroll: true});
  }

  // Opening a bundled model: one click, one entry (the server also reuses an opened copy).
  document.querySelectorAll("form.bundled").forEach(function (form) {
    form.addEventListener("submit", function () {
      setTimeout(function () {
        form.querySelectorAll("button").forEach(function (b) { b.disabled = true; });
      }, 0);
    });
  });

  // Uploads: refuse files over the server's limit before sending them.
  document.querySelectorAll("form.upload").forEach(function (form) {
    form.addEventListener("submit", function (ev) {
      var input = form.querySelector("input[type=file]");
      var max = +form.getAttribute("data-max-bytes");
      var file = input && input.files && input.files[0];
      if (file && max && file.size > max) {
        ev.preventDefault();
        showError(form.getAttribute("data-slot"), "upload too large: " + file.name + " is " +
          (file.size / 1e6).toFixed(1) + " MB and the limit is " + (max / 1e6).toFixed(1) +
          " MB; restart `mpsearch serve` with a larger --max-upload-mb");
        return;
      }
      var button = form.querySelector("button[type=submit]");
      if (button) { button.disabled = true; button.textContent = "Uploading…"; }
    });
  });

  // The job form buttons: show that something happens.
  var jobForm = $("job-form");
  if (jobForm) {
    jobForm.addEventListener("submit", function () {
      jobForm.querySelectorAll("button").forEach(function (b) {
        setTimeout(function () { b.disabled = true; }, 0);
      });
    });
  }

  // The hardware profile: show its formats and op rules, and use it for the job.
  var select = $("profile-select");
  if (select) {
    select.addEventListener("change", function () {
      document.querySelectorAll("input[type=hidden][name=profile]").forEach(function (h) {
        h.value = select.value;
      });
      fetch(select.getAttribute("data-card-url") + "?ref=" + encodeURIComponent(select.value))
        .then(function (r) { return r.text(); })
        .then(function (html) { $("profile-card").innerHTML = html; })
        .catch(function (e) { $("profile-card").textContent = "cannot load the profile: " + e; });
    });
  }

  // A running job: poll its state, show progress and the current front.
  function clock(s) {
    if (s === null || s === undefined) return "?";
    s = Math.round(s);
    var m = Math.floor(s / 60), r = s % 60;
    return m + ":" + (r < 10 ? "0" : "") + r;
  }
  function size(b) {
    var u = [[1e9, "GB"], [1e6, "MB"], [1e3, "kB"]];
    for (var i = 0; i < u.length; i++) if (b >= u[i][0]) return (b / u[i][0]).toFixed(2) + " " + u[i][1];
    return b + " B";
  }
  var NS = "http://www.w3.org/2000/svg";
  function el(name, attrs, text) {
    var node = document.createElementNS(NS, name);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function drawFront(box, points, front, labels) {
    labels = labels || {};
    box.replaceChildren();
    if (!points || !points.length) return;
    var W = 460, H = 244, L = 58, R = 40, T = 26, B = 34;
    var xs = points.map(function (p) { return p[1]; }), ys = points.map(function (p) { return p[0]; });
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    if (x1 === x0) { x1 += 1; x0 -= 1; }
    if (y1 === y0) { y1 += 0.01; y0 -= 0.01; }
    function X(v) { return L + (v - x0) / (x1 - x0) * (W - L - R); }
    function Y(v) { return H - B - (v - y0) / (y1 - y0) * (H - T - B); }
    var svg = el("svg", {width: W, height: H, viewBox: "0 0 " + W + " " + H, id: box.id + "-svg",
                         role: "img", "aria-label": "Pareto front: " + (labels.y || "metric") +
                         " against " + (labels.x || "size")});
    svg.appendChild(el("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#999"}));
    svg.appendChild(el("line", {x1: L, y1: T, x2: L, y2: H - B, stroke: "#999"}));
    svg.appendChild(el("text", {x: L, y: H - 18, "font-size": 11}, size(x0)));
    svg.appendChild(el("text", {x: W - R, y: H - 18, "font-size": 11, "text-anchor": "end"}, size(x1)));
    svg.appendChild(el("text", {x: (L + W) / 2, y: H - 4, "font-size": 11, "text-anchor": "middle"},
                       labels.x || "weights (bytes)"));
    svg.appendChild(el("text", {x: 6, y: 14, "font-size": 11, "class": "y-label"},
                       labels.y || "metric (search split)"));
    svg.appendChild(el("text", {x: L - 4, y: T + 10, "font-size": 11, "text-anchor": "end"}, y1.toFixed(3)));
    svg.appendChild(el("text", {x: L - 4, y: H - B, "font-size": 11, "text-anchor": "end"}, y0.toFixed(3)));
    points.forEach(function (p) {
      svg.appendChild(el("circle", {cx: X(p[1]), cy: Y(p[0]), r: 2.5, fill: "#bbb"}));
    });
    if (front && front.length) {
      var d = front.map(function (p, i) { return (i ? "L" : "M") + X(p[1]) + " " + Y(p[0]); }).join(" ");
      svg.appendChild(el("path", {d: d, fill: "none", stroke: "#1f77b4", "stroke-width": 1.5}));
      front.forEach(function (p) {
        svg.appendChild(el("circle", {cx: X(p[1]), cy: Y(p[0]), r: 4, fill: "#1f77b4",
                                      "class": "front-point"}));
      });
    }
    (labels.marks || []).forEach(function (p) {
      svg.appendChild(el("rect", {x: X(p[1]) - 4, y: Y(p[0]) - 4, width: 8, height: 8, fill: "#d62728"}));
      svg.appendChild(el("text", {x: X(p[1]) - 8, y: Y(p[0]) + 4, "font-size": 11, "text-anchor": "end"},
                         labels.mark || ""));
    });
    box.appendChild(svg);
  }
  // The results' chart: plotly.js when it loaded (the SVG drawing otherwise).
  function selectPoint(k, fromChart) {
    var radio = $("point-" + k);
    if (!radio) return;
    radio.checked = true;
    var named = $("export-point");  // the command line exports the selected point
    if (named) named.textContent = k;
    document.querySelectorAll("tr.selected").forEach(function (r) { r.classList.remove("selected"); });
    var row = $("row-" + k);
    if (row) {
      row.classList.add("selected");
      var box = row.closest("details");
      if (box) box.open = true;
      if (fromChart) row.scrollIntoView({block: "nearest"});
    }
    var chart = $("results-chart");
    if (chart && chart.data && window.Plotly) {
      var p = (D.chart.points || []).filter(function (q) { return q.index === k; })[0];
      if (p) Plotly.restyle(chart, {x: [[p.size]], y: [[p.metric]]}, [chart.data.length - 1]);
    }
  }
  function frontChart(box, c) {
    var shown = c.points.filter(function (p) { return p.shown; });
    var hidden = c.points.filter(function (p) { return !p.shown; });
    var timed = shown.some(function (p) { return p.ms !== null; });
    var times = shown.concat(c.marks).map(function (p) { return p.ms; })
      .filter(function (v) { return v !== null; });
    var lo = Math.min.apply(null, times), hi = Math.max.apply(null, times);
    if (!(hi > lo)) { lo *= 0.8; hi *= 1.2; }  // one time only: a scale around it
    var line = shown.slice().sort(function (a, b) { return a.size - b.size; });
    var sel = c.points.filter(function (p) { return p.index === c.selected; })[0];
    function pick(ps, key) { return ps.map(function (p) { return p[key]; }); }
    var traces = [
      {x: pick(line, "size"), y: pick(line, "metric"), mode: "lines", name: "front",
       line: {color: "#9ab", width: 1, shape: "hv"}, hoverinfo: "skip", showlegend: false},
      {x: pick(c.marks, "size"), y: pick(c.marks, "metric"), mode: "markers+text", name: "baselines",
       customdata: pick(c.marks, "index"),
       text: pick(c.marks, "label"), textposition: "bottom center", textfont: {size: 10, color: "#a33"},
       hovertext: pick(c.marks, "hover"), hoverinfo: "text",
       marker: {symbol: "square-open", size: 15, color: "#d62728", line: {width: 2}}},
      {x: pick(shown, "size"), y: pick(shown, "metric"), mode: "markers", name: "front points",
       customdata: pick(shown, "index"), hovertext: pick(shown, "hover"), hoverinfo: "text",
       marker: timed ? {size: 11, color: shown.map(function (p) { return p.ms === null ? NaN : p.ms; }),
                        colorscale: "Viridis", reversescale: true, showscale: true, cmin: lo, cmax: hi,
                        colorbar: {title: {text: c.colour, side: "right"}, thickness: 12},
                        line: {color: "#333", width: 1}}
                     : {size: 11, color: "#1f77b4", line: {color: "#333", width: 1}}},
      {x: pick(hidden, "size"), y: pick(hidden, "metric"), mode: "markers",
       name: "beaten (hidden)", visible: "legendonly", customdata: pick(hidden, "index"),
       hovertext: pick(hidden, "hover"), hoverinfo: "text",
       marker: {symbol: "x", size: 8, color: "#999"}},
      {x: sel ? [sel.size] : [], y: sel ? [sel.metric] : [], mode: "markers", name: "selected",
       hoverinfo: "skip", marker: {symbol: "circle-open", size: 20, color: "#000", line: {width: 2}}}
    ];
    var sizes = pick(c.points, "size").concat(pick(c.marks, "size"));
    var wide = Math.max.apply(null, sizes) / Math.max(1, Math.min.apply(null, sizes)) > 20;
    // The y axis fits the data (plotly widens one repeated value to about +-0.7).
    var ys = pick(c.points, "metric").concat(pick(c.marks, "metric"));
    var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    var pad = Math.max((y1 - y0) * 0.12, Math.abs(y1) * 0.005, 1e-6);
    var yrange = [y0 - pad, y1 + pad];
    // Baselines at (nearly) one place share one label instead of printing over each other.
    var x0 = Math.min.apply(null, sizes), x1 = Math.max.apply(null, sizes);
    function near(a, b) {
      var dx = wide ? Math.abs(Math.log(a.size / b.size)) / Math.max(1e-9, Math.log(x1 / x0))
                    : Math.abs(a.size - b.size) / Math.max(1, x1 - x0);
      return dx < 0.08 && Math.abs(a.metric - b.metric) < 0.08 * (yrange[1] - yrange[0]);
    }
    var texts = c.marks.map(function (m) { return m.label; });
    c.marks.forEach(function (m, i) {
      for (var j = 0; j < i; j++) {
        if (texts[j] !== "" && near(c.marks[j], m)) { texts[j] += " / " + m.label; texts[i] = ""; return; }
      }
    });
    traces[1].text = texts;
    Plotly.newPlot(box, traces, {
      height: 380, margin: {l: 64, r: 10, t: 10, b: 48}, hovermode: "closest",
      xaxis: {title: {text: c.x}, type: wide ? "log" : "linear"},
      yaxis: {title: {text: c.y}, range: yrange},
      legend: {orientation: "h", y: -0.22}
    }, {displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d"]});
    box.on("plotly_click", function (ev) {
      var pt = ev.points && ev.points[0];
      if (pt && pt.customdata !== undefined && pt.customdata !== null) selectPoint(pt.customdata, true);
    });
  }
  document.querySelectorAll("input[name=point]").forEach(function (r) {
    r.addEventListener("change", function () { selectPoint(+r.value, false); });
  });
  function partialChart(box, c) {
    function xs(ps) { return ps.map(function (p) { return p[1]; }); }
    function ys(ps) { return ps.map(function (p) { return p[0]; }); }
    Plotly.newPlot(box, [
      {x: xs(c.all), y: ys(c.all), mode: "markers", name: "trials", marker: {color: "#bbb", size: 5},
       hovertemplate: "trial: %{y:.4f}, %{x:,} B<extra></extra>"},
      {x: xs(c.front), y: ys(c.front), mode: "lines+markers", name: "front so far",
       line: {shape: "hv", color: "#1f77b4"}, marker: {size: 9},
       hovertemplate: "front: %{y:.4f}, %{x:,} B<extra></extra>"}
    ], {height: 380, margin: {l: 64, r: 10, t: 10, b: 48}, hovermode: "closest",
        xaxis: {title: {text: c.x}}, yaxis: {title: {text: c.y}}, legend: {orientation: "h", y: -0.25}},
    {displaylogo: false, responsive: true});
  }
  var resultsBox = $("results-chart");
  if (D.chart && resultsBox) {
    if (window.Plotly && D.chart.kind === "front") frontChart(resultsBox, D.chart);
    else if (window.Plotly && D.chart.kind === "partial") partialChart(resultsBox, D.chart);
    else if (D.chart.kind === "partial") drawFront(resultsBox, D.chart.all, D.chart.front, D.chart);
    else drawFront(resultsBox, D.chart.points.map(function (p) { return [p.metric, p.size]; }),
                   D.chart.points.filter(function (p) { return p.shown; })
                     .map(function (p) { return [p.metric, p.size]; })
                     .sort(function (a, b) { return a[1] - b[1]; }),
                   {x: D.chart.x, y: D.chart.y,
                    marks: D.chart.marks.map(function (m) { return [m.metric, m.size]; })});
  }
  function render(status) {
    var job = status.job, p = status.progress;
    var state = $("job-state");
    if (state) {
      state.textContent = job.state + (status.position ? " (#" + status.position + " in the queue)" : "");
      state.className = "state " + job.state;
    }
    if (!p) return;
    var all = p.overall;
    if (all) {
      var stage = all.phases[all.index];
      var t = "Step " + (all.index + 1) + " of " + all.phases.length + ": " + stage + " · " +
        clock(all.elapsed) + " elapsed";
      if (all.left !== null && all.left !== undefined)
        t += " · " + (all.upper ? "at most about " : "about ") + clock(all.left) + " left (an estimate)";
      $("overall-text").textContent = t;
      var ob = $("overall-bar");
      if (all.fraction !== null && all.fraction !== undefined) { ob.max = 1; ob.value = all.fraction; }
      else ob.removeAttribute("value");  // indeterminate until the time left can be told
      $("overall-note").textContent = "Stages: " + all.phases.map(function (name, i) {
        return (i < all.index ? "\u2713 " : i === all.index ? "\u25b6 " : "") + name;
      }).join(" \u2192 ") + (all.notes.length ? ". " + all.notes.join("; ")
        .replace(/^./, function (ch) { return ch.toUpperCase(); }) + "." : "");
    }
    var bar = p.bar, text = "This stage: " + p.stage;
    if (bar) text += ": " + bar.done + "/" + bar.total + ", " + clock(bar.elapsed) + " elapsed, " +
      clock(bar.left) + " left in this stage";
    $("progress-text").textContent = text;
    $("progress-message").textContent = p.message || "";
    if (bar && bar.total) { $("progress-bar").max = bar.total; $("progress-bar").value = bar.done; }
    if (p.trials_total) {
      var t = "trials " + p.trials_done + "/" + p.trials_total + " · front " + (p.front_size || 0) +
        " points" + (p.best !== undefined ? " · best " + p.best.toFixed(4) + " (search split)" : "") +
        (p.left !== null && p.left !== undefined ? " · about " + clock(p.left) + " left" : "");
      $("progress-trials").textContent = t;
      drawFront($("mini-front"), p.points, p.front, {y: "metric (search split)", x: "weights (bytes)"});
    }
  }
  if (D.job && (D.state === "queued" || D.state === "running")) {
    var timer = setInterval(function () {
      fetch("/api/jobs/" + D.job, {headers: {Accept: "application/json"}})
        .then(function (r) { return r.json(); })
        .then(function (status) {
          if (status.job.state !== "queued" && status.job.state !== "running") {
            clearInterval(timer);
            location.reload();
            return;
          }
          render(status);
        })
        .catch(function () { /* the server restarts: try again next tick */ });
    }, 1000);
    if (D.progress) render({job: {state: D.state}, progress: D.progress});
  }

  // Export: the download takes a few seconds while the point is rebuilt and verified.
  var exportForm = $("export-form");
  if (exportForm) {
    exportForm.addEventListener("submit", function () {
      var b = $("export-button");
      b.textContent = "Exporting… the download starts when the model is verified";
      setTimeout(function () { b.textContent = "Download the selected point's QDQ model"; }, 8000);
    });
  }
})();
