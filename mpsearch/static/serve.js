// mpsearch serve: upload size checks, the profile card, live job progress and its mini-chart.
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
  if (D.chart && $("results-chart")) drawFront($("results-chart"), D.chart.points, D.chart.front, D.chart);
  function render(status) {
    var job = status.job, p = status.progress;
    var state = $("job-state");
    if (state) {
      state.textContent = job.state + (status.position ? " (#" + status.position + " in the queue)" : "");
      state.className = "state " + job.state;
    }
    if (!p) return;
    var bar = p.bar, text = p.stage;
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
