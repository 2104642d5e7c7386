/* Campaign page: polls the dashboard's JSON endpoints and draws the charts with plotly.js.
 *
 * The summary (report count, last report, time series) is polled every few seconds;
 * the estimate is fetched again only when the number of reports changed or the
 * estimator was switched. Data travels with the session cookie; the analyst token
 * never reaches the page. Text from the server goes into the DOM as text only.
 */
(function () {
  "use strict";

  var root = document.getElementById("main");
  var cfg = root.dataset;
  // Grid mechanisms (the server's GRID_MECHANISMS) draw maps: the page says which.
  var planar = "grid" in cfg;
  var ordinal = cfg.mechanism === "geometric";
  var ORDINAL_TABLE_ROWS = 20;
  var refreshMs = Math.max(1, Number(cfg.refreshS) || 5) * 1000;
  var plotConfig = { responsive: true, displaylogo: false, displayModeBar: false };
  var font = { family: "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", size: 13 };
  var colorscale = "Viridis";
  // The share of the noisy reports per category, shown beside the estimate as a reference.
  var RAW_NAME = "raw report shares (reference)";

  var methodSelect = document.getElementById("method");
  var sortSelect = document.getElementById("sort");
  var topSelect = document.getElementById("top");
  var statusLine = document.getElementById("refresh-status");

  var state = {
    n: null, estimate: null, estimateKey: null, pending: {}, retryAt: {}, timer: null,
    stopped: false,
  };

  function SessionEnded() {}

  function ApiError(status, body, retryAfterS) {
    this.status = status;
    this.message = body && body.error ? body.error.message : "the server answered " + status;
    this.retryAfterS = retryAfterS;
  }

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        if (response.status === 401) {
          throw new SessionEnded();
        }
        return response.json().then(
          function (body) {
            if (!response.ok) {
              throw new ApiError(
                response.status, body, Number(response.headers.get("Retry-After")) || null
              );
            }
            return body;
          },
          function () {
            throw new ApiError(response.status, null);
          }
        );
      });
  }

  function withMethod(url) {
    return url + "?method=" + encodeURIComponent(methodSelect.value);
  }

  /* plotly reads a few HTML tags in text; labels are shown literally. */
  function escapeLabel(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  function percent(x, digits) {
    return (100 * x).toFixed(digits === undefined ? 1 : digits) + "%";
  }

  /* A share for the table: two decimals of a percent, more for shares under 0.1%. */
  function sharePercent(x) {
    return percent(x, x !== 0 && Math.abs(x) < 0.001 ? 3 : 2);
  }

  /* A share axis whose ticks always differ: a round step (1, 2, 2.5 or 5 times a power
   * of ten) giving about five ticks up to ``top``, and as many decimals as the step
   * needs (0.25%, 0.1%, 20%). With nothing to show (``top`` is 0 or missing) the axis
   * runs from 0 to 1%. */
  function shareTicks(top) {
    if (!(top > 0) || !isFinite(top)) {
      return { dtick: 0.002, tickformat: ".1%", range: [0, 0.01] };
    }
    var rough = top / 5;
    var power = Math.pow(10, Math.floor(Math.log10(rough)));
    var step = [1, 2, 2.5, 5, 10].map(function (m) { return m * power; })
      .filter(function (candidate) { return candidate >= rough * 0.999; })[0];
    var decimals = 0;
    while (decimals < 6 && Math.abs(Math.round(step * 100 * Math.pow(10, decimals)) -
      step * 100 * Math.pow(10, decimals)) > 1e-6) {
      decimals += 1;
    }
    return { dtick: step, tick0: 0, tickformat: "." + decimals + "%" };
  }

  function formatTime(iso) {
    return iso ? iso.slice(0, 10) + " " + iso.slice(11, 19) + " UTC" : "never";
  }

  function setText(id, text) {
    document.getElementById(id).textContent = text;
  }

  function axis(title, extra) {
    var base = { title: { text: title }, automargin: true, gridcolor: "#e3e6ea", zeroline: false };
    return Object.assign(base, extra || {});
  }

  function baseLayout(extra) {
    return Object.assign(
      {
        font: font,
        margin: { l: 64, r: 24, t: 16, b: 56 },
        paper_bgcolor: "rgba(0,0,0,0)",
        plot_bgcolor: "#ffffff",
        hoverlabel: { font: font },
      },
      extra
    );
  }

  /* -- report count over time ---------------------------------------------------------- */

  /* Reports per bucket (an hour) as bars spanning their bucket, over at least a six-bucket
   * window ending with the current one; the hover gives the running total. */
  function renderSeries(series) {
    var bucket = series.bucket_s * 1000;
    var points = series.points;
    function stamp(ms) {
      return new Date(ms).toISOString().slice(0, 19).replace("T", " ");
    }
    var trace = {
      type: "bar",
      name: "reports",
      x: points.map(function (p) { return stamp(Date.parse(p.start) + bucket / 2); }),
      y: points.map(function (p) { return p.count; }),
      width: points.map(function () { return bucket * 0.9; }),
      customdata: points.map(function (p) { return [stamp(Date.parse(p.start)), p.total]; }),
      marker: { color: "#2f6fb3" },
      hovertemplate:
        "from %{customdata[0]} UTC<br>%{y:,} reports<br>%{customdata[1]:,} in total<extra></extra>",
    };
    var now = Date.now();
    var end = Math.max(now, points.length ? Date.parse(points[points.length - 1].start) : now);
    end = Math.floor(end / bucket) * bucket + bucket;
    var first = points.length ? Date.parse(points[0].start) : end - bucket;
    var layout = baseLayout({
      xaxis: axis("time (UTC), one bar per " + series.bucket_name, {
        type: "date",
        range: [stamp(Math.min(first, end - 6 * bucket)), stamp(end)],
        tickformat: "%H:%M\n%b %d",
      }),
      yaxis: axis("reports per " + series.bucket_name, { rangemode: "tozero", tickformat: ",d" }),
      showlegend: false,
      margin: { l: 72, r: 24, t: 12, b: 64 },
    });
    if (!points.length) {
      layout.annotations = [{
        text: "No reports yet", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5,
        font: { size: 15, color: "#5b6b7a" },
      }];
      layout.yaxis.range = [0, 1];
    }
    Plotly.react("series-chart", [trace], layout, plotConfig);
  }

  function renderSummary(summary) {
    setText("n-reports", summary.n_reports.toLocaleString("en"));
    setText("last-report", formatTime(summary.last_report_at));
    setText("expected-error", summary.expected_error.text);
    var status = document.getElementById("status");
    status.textContent = summary.status;
    status.className = "status status-" + summary.status;
    renderSeries(summary.series);
  }

  /* -- estimate: categories ------------------------------------------------------------- */

  function shownRows(estimates) {
    var rows = estimates.map(function (e, i) { return Object.assign({ index: i }, e); });
    var top = topSelect.value === "all" ? rows.length : Number(topSelect.value);
    if (top < rows.length) {
      rows = rows
        .slice()
        .sort(function (a, b) { return b.frequency - a.frequency || a.index - b.index; })
        .slice(0, top);
    }
    var order = sortSelect.value;
    rows.sort(function (a, b) {
      if (order === "frequency") { return b.frequency - a.frequency || a.index - b.index; }
      if (order === "label") { return a.label < b.label ? -1 : a.label > b.label ? 1 : 0; }
      return a.index - b.index;
    });
    return rows;
  }

  /* Upright labels while they fit side by side, slanted when they would overlap. */
  function labelAngle(rows) {
    var longest = rows.reduce(function (m, r) { return Math.max(m, String(r.label).length); }, 0);
    var width = document.getElementById("estimate-chart").clientWidth - 100;
    return rows.length * (longest * 7.5 + 8) > width ? -45 : 0;
  }

  function hasRaw(rows) {
    return rows.length > 0 && rows.every(function (r) { return typeof r.raw_frequency === "number"; });
  }

  /* The estimate as bars with their intervals, drawn from the interval's own bounds (an
   * interval that does not contain its estimate is drawn where it is, not clipped to
   * the bar), and the raw report share beside each bar (a reference) when the API gives it. */
  function renderBars(estimate) {
    var rows = shownRows(estimate.estimates);
    var level = percent(estimate.confidence, 0);
    var labels = rows.map(function (r) { return escapeLabel(r.label); });
    var raw = hasRaw(rows);
    var trace = {
      type: "bar",
      name: "estimate, " + level + " interval",
      x: labels,
      y: rows.map(function (r) { return r.frequency; }),
      customdata: rows.map(function (r) { return [r.ci_low, r.ci_high]; }),
      marker: { color: "#2f6fb3" },
      error_y: {
        type: "data",
        symmetric: false,
        // Signed on purpose: plotly draws the whisker from y - arrayminus to y + array,
        // which are exactly ci_low and ci_high whatever side of the estimate they lie.
        array: rows.map(function (r) { return r.ci_high - r.frequency; }),
        arrayminus: rows.map(function (r) { return r.frequency - r.ci_low; }),
        color: "#1b2b3a",
        thickness: 1.5,
        width: 4,
      },
      hovertemplate:
        "<b>%{x}</b><br>estimate %{y:.2%}<br>" + level +
        " interval %{customdata[0]:.2%} to %{customdata[1]:.2%}<extra></extra>",
    };
    var traces = [trace];
    if (raw) {
      traces.push({
        type: "bar",
        name: RAW_NAME,
        x: labels,
        y: rows.map(function (r) { return r.raw_frequency; }),
        marker: { color: "#c5cbd3" },
        hovertemplate: "<b>%{x}</b><br>raw report share %{y:.2%}<extra></extra>",
      });
    }
    var top = rows.reduce(function (m, r) {
      return Math.max(m, r.frequency, r.ci_high, raw ? r.raw_frequency : 0);
    }, 0);
    var layout = baseLayout({
      xaxis: axis("category", { type: "category", tickangle: labelAngle(rows) }),
      yaxis: axis("share of reporters", Object.assign({ zeroline: true }, shareTicks(top))),
      showlegend: raw,
      legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
      barmode: "group",
      bargap: 0.25,
      bargroupgap: 0.05,
    });
    if (raw) {
      layout.margin = Object.assign({}, layout.margin, { t: 40 });
    }
    Plotly.react("estimate-chart", traces, layout, plotConfig);
    renderTable(rows.map(function (r) { return [r.label, r]; }),
      (rows.length < (estimate.domain_size || estimate.estimates.length)
        ? "Top " + rows.length + " of " + (estimate.domain_size || estimate.estimates.length).toLocaleString("en")
        : "All " + rows.length) +
      " categories, with " + level + " intervals" +
      (raw ? " and the " + RAW_NAME + ": the share of the noisy reports, before correcting" +
        " for the noise" : ""));
  }

  /* -- estimate: an integer range ---------------------------------------------------------- */

  /* The estimate over the whole range in order as a line, its intervals as a shaded band,
   * and the raw report shares (a reference) as a thin grey line; the table lists the most
   * likely values. */
  function renderLine(estimate) {
    var rows = estimate.estimates;
    var level = percent(estimate.confidence, 0);
    var x = rows.map(function (r) { return Number(r.label); });
    var raw = hasRaw(rows);
    var traces = [
      {
        type: "scatter", mode: "lines", name: level + " interval", x: x,
        y: rows.map(function (r) { return r.ci_low; }),
        line: { width: 0 }, hoverinfo: "skip", showlegend: false,
      },
      {
        type: "scatter", mode: "lines", name: level + " interval", x: x,
        y: rows.map(function (r) { return r.ci_high; }),
        fill: "tonexty", fillcolor: "rgba(47, 111, 179, 0.2)", line: { width: 0 },
        hoverinfo: "skip",
      },
      {
        type: "scatter", mode: rows.length <= 60 ? "lines+markers" : "lines", name: "estimate",
        x: x, y: rows.map(function (r) { return r.frequency; }),
        customdata: rows.map(function (r) { return [r.ci_low, r.ci_high]; }),
        line: { color: "#2f6fb3", width: 2 },
        hovertemplate: "<b>%{x}</b><br>estimate %{y:.2%}<br>" + level +
          " interval %{customdata[0]:.2%} to %{customdata[1]:.2%}<extra></extra>",
      },
    ];
    if (raw) {
      traces.push({
        type: "scatter", mode: "lines", name: RAW_NAME, x: x,
        y: rows.map(function (r) { return r.raw_frequency; }),
        line: { color: "#9aa3ad", width: 1 },
        hovertemplate: "<b>%{x}</b><br>raw report share %{y:.2%}<extra></extra>",
      });
    }
    var top = rows.reduce(function (m, r) {
      return Math.max(m, r.frequency, r.ci_high, raw ? r.raw_frequency : 0);
    }, 0);
    var layout = baseLayout({
      xaxis: axis("value", { type: "linear" }),
      yaxis: axis("share of reporters", Object.assign({ zeroline: true }, shareTicks(top))),
      showlegend: true,
      legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
    });
    layout.margin = Object.assign({}, layout.margin, { t: 40 });
    Plotly.react("estimate-chart", traces, layout, plotConfig);
    var likely = rows
      .map(function (r, i) { return Object.assign({ index: i }, r); })
      .sort(function (a, b) { return b.frequency - a.frequency || a.index - b.index; })
      .slice(0, ORDINAL_TABLE_ROWS);
    renderTable(likely.map(function (r) { return [r.label, r]; }),
      "The " + likely.length + " most likely of " + rows.length.toLocaleString("en") +
      " values, with " + level + " intervals" +
      (raw ? " and the " + RAW_NAME : ""));
  }

  /* -- estimate: locations -------------------------------------------------------------- */

  function colorbar(zmax) {
    var ticks = shareTicks(zmax);
    return {
      title: { text: "share" }, thickness: 14, dtick: ticks.dtick, tick0: 0,
      tickformat: ticks.tickformat,
    };
  }

  function renderHeatmaps(estimate) {
    var h = estimate.heatmap;
    var latMid = (h.lat[0] + h.lat[h.lat.length - 1]) / 2;
    var zmax = h.zmax > 0 ? h.zmax : 1;
    function heatmap(z, label) {
      return {
        type: "heatmap",
        x: h.lon,
        y: h.lat,
        z: z,
        zmin: 0,
        zmax: zmax,
        colorscale: colorscale,
        colorbar: colorbar(zmax),
        hovertemplate:
          "lat %{y:.5f}°, lon %{x:.5f}°<br>" + label + " %{z:.2%}<extra></extra>",
      };
    }
    function layout() {
      return baseLayout({
        xaxis: axis("longitude (°E)", { tickformat: ".3f", constrain: "domain" }),
        // Square cells on screen: a degree of longitude is cos(lat) of a degree of latitude.
        yaxis: axis("latitude (°N)", {
          tickformat: ".3f",
          scaleanchor: "x",
          scaleratio: 1 / Math.cos((latMid * Math.PI) / 180),
          constrain: "domain",
        }),
        margin: { l: 72, r: 16, t: 8, b: 56 },
      });
    }
    Plotly.react("heatmap-raw", [heatmap(h.raw, "share of reports")], layout(), plotConfig);
    Plotly.react("heatmap-estimate", [heatmap(h.estimate, "estimated share")], layout(), plotConfig);
    var cells = estimate.estimates
      .map(function (e, i) { return Object.assign({ index: i }, e); })
      .sort(function (a, b) { return b.frequency - a.frequency || a.index - b.index; })
      .slice(0, 10)
      .map(function (e) {
        var row = Math.floor(e.index / h.cols);
        var col = e.index % h.cols;
        var where = e.label + " (" + h.lat[row].toFixed(5) + ", " + h.lon[col].toFixed(5) + ")";
        return [where, e];
      });
    renderTable(cells, "The " + cells.length + " cells with the largest estimated share, with " +
      percent(estimate.confidence, 0) + " intervals");
  }

  /* -- estimate: shared --------------------------------------------------------------- */

  function renderTable(rows, caption) {
    var body = document.querySelector("#estimate-table tbody");
    var fragment = document.createDocumentFragment();
    rows.forEach(function (pair) {
      var tr = document.createElement("tr");
      var th = document.createElement("th");
      th.scope = "row";
      th.textContent = pair[0];
      tr.appendChild(th);
      var values = [pair[1].frequency, pair[1].ci_low, pair[1].ci_high];
      if (!planar) {
        values.push(pair[1].raw_frequency);
      }
      values.forEach(function (value) {
        var td = document.createElement("td");
        td.className = "num";
        td.textContent = typeof value === "number" ? sharePercent(value) : "–";
        tr.appendChild(td);
      });
      fragment.appendChild(tr);
    });
    body.replaceChildren(fragment);
    setText("estimate-caption", caption);
  }

  function showMessage(text) {
    var message = document.getElementById("estimate-message");
    message.textContent = text || "";
    message.hidden = !text;
  }

  /* The poisoning check of the estimate API: a banner while the counts are flagged. */
  function renderPoisoning(estimate) {
    var check = estimate.poisoning;
    var flagged = Boolean(check && check.flagged);
    document.getElementById("poisoning-banner").hidden = !flagged;
    setText("poisoning-text", flagged ? check.explanation : "");
    root.dataset.poisoningFlagged = String(flagged);
  }

  /* What ran (the API's headline ``estimator``, else its ``method``), its warnings, and the
   * Details disclosure: the [name, text] pairs the server lists in ``display.details``. */
  function renderEstimator(estimate) {
    setText("estimate-estimator", estimate.estimator || estimate.method);
    var warnings = Array.isArray(estimate.warnings) ? estimate.warnings : [];
    var list = document.getElementById("estimate-warnings");
    var fragment = document.createDocumentFragment();
    warnings.forEach(function (text) {
      var item = document.createElement("li");
      item.textContent = text;
      fragment.appendChild(item);
    });
    list.replaceChildren(fragment);
    document.getElementById("estimate-warnings-box").hidden = warnings.length === 0;
    var rows = estimate.display && estimate.n > 0 ? estimate.display.details : [];
    var details = document.createDocumentFragment();
    rows.forEach(function (pair) {
      var name = document.createElement("dt");
      name.textContent = pair[0];
      var value = document.createElement("dd");
      value.textContent = pair[1];
      details.append(name, value);
    });
    document.getElementById("estimate-details-list").replaceChildren(details);
    document.getElementById("estimate-details").hidden = rows.length === 0;
  }

  function clearCharts() {
    (planar ? ["heatmap-raw", "heatmap-estimate"] : ["estimate-chart"]).forEach(function (id) {
      Plotly.purge(id);
    });
    document.querySelector("#estimate-table tbody").replaceChildren();
    setText("estimate-caption", "");
  }

  function renderEstimate(estimate) {
    renderPoisoning(estimate);
    renderEstimator(estimate);
    setText("estimate-n", estimate.n.toLocaleString("en"));
    if (estimate.n === 0) {
      setText("estimate-iterations", "–");
      setText("estimate-seconds", "–");
      setText("estimate-intervals", "–");
      clearCharts();
      showMessage("No reports yet: the charts appear with the first report.");
      root.dataset.renderedMethod = estimate.method;
      root.dataset.renderedN = "0";
      return;
    }
    showMessage(null);
    setText("estimate-iterations", estimate.display.iterations);
    var ms = estimate.seconds * 1000;
    setText("estimate-seconds", ms < 1 ? "under 1 ms" : ms.toFixed(0) + " ms");
    setText("estimate-intervals", estimate.display.intervals);
    if (planar) {
      renderHeatmaps(estimate);
    } else if (ordinal) {
      renderLine(estimate);
    } else {
      renderBars(estimate);
    }
    root.dataset.renderedMethod = estimate.method;
    root.dataset.renderedN = String(estimate.n);
  }

  function updateDownloads() {
    document.getElementById("download-csv").href = withMethod(cfg.csvUrl);
    document.getElementById("download-json").href = withMethod(cfg.jsonUrl);
  }

  /* -- polling ------------------------------------------------------------------------- */

  function stamp() {
    var now = new Date();
    statusLine.textContent =
      "Updated " + now.toLocaleTimeString("en-GB") + "; refreshing every " + refreshMs / 1000 + " s.";
  }

  function fail(error) {
    if (error instanceof SessionEnded) {
      state.stopped = true;
      statusLine.textContent = "";
      var link = document.createElement("a");
      link.href = cfg.loginUrl;
      link.textContent = "Sign in again";
      statusLine.append("Your session has ended. ", link, " to keep watching.");
      return;
    }
    statusLine.textContent = "Could not refresh: " + (error.message || error) + ". Retrying.";
  }

  /* At most one estimate request per method is in flight: a slow estimate (a large grid)
   * is never asked for again while it is being computed. */
  function refreshEstimate() {
    var method = methodSelect.value;
    var key = method + "@" + state.n;
    if (key === state.estimateKey || Date.now() < (state.retryAt[key] || 0)) {
      return Promise.resolve();
    }
    if (state.pending[method]) {
      return state.pending[method];
    }
    setBusy(true);
    var request = getJSON(withMethod(cfg.estimateUrl))
      .then(
        function (estimate) {
          if (estimate.method !== methodSelect.value) {
            return; // the estimator was switched meanwhile; its own request draws the chart
          }
          state.estimate = estimate;
          state.estimateKey = estimate.method + "@" + estimate.n;
          renderEstimate(estimate);
        },
        function (error) {
          if (error instanceof ApiError && error.status === 422) {
            state.estimateKey = key;
            showMessage(error.message);
            root.dataset.renderedMethod = method;
            return;
          }
          if (error instanceof ApiError && error.status === 503 && error.retryAfterS) {
            // The estimate was stopped at the server's time limit: say so, and ask again
            // once the server says to (or when new reports change the counts).
            state.retryAt[key] = Date.now() + error.retryAfterS * 1000;
            showMessage(error.message);
            return;
          }
          throw error;
        }
      )
      .finally(function () {
        delete state.pending[method];
        setBusy(Object.keys(state.pending).length > 0);
      });
    state.pending[method] = request;
    return request;
  }

  function setBusy(busy) {
    document.getElementById("estimate-busy").hidden = !busy;
    document.getElementById("estimate-section").setAttribute("aria-busy", String(busy));
  }

  /* Poll the summary on a timer; the estimate is fetched alongside, without holding the
   * timer back, so the report count keeps moving while a large estimate is computed. */
  function refresh() {
    window.clearTimeout(state.timer);
    return getJSON(cfg.summaryUrl)
      .then(function (summary) {
        state.n = summary.n_reports;
        renderSummary(summary);
        refreshEstimate().then(stamp, fail);
      })
      .then(stamp, fail)
      .then(function () {
        if (!state.stopped) {
          state.timer = window.setTimeout(refresh, refreshMs);
        }
      });
  }

  methodSelect.addEventListener("change", function () {
    updateDownloads();
    refreshEstimate().catch(fail);
  });
  [sortSelect, topSelect].forEach(function (select) {
    if (select) {
      select.addEventListener("change", function () {
        if (state.estimate && state.estimate.n > 0) {
          renderBars(state.estimate);
        }
      });
    }
  });
  var resizeTimer = null;
  window.addEventListener("resize", function () {
    window.clearTimeout(resizeTimer);
    resizeTimer = window.setTimeout(function () {
      if (!planar && !ordinal && state.estimate && state.estimate.n > 0) {
        renderBars(state.estimate);
      }
    }, 200);
  });
  document.getElementById("controls").addEventListener("submit", function (event) {
    event.preventDefault();
  });
  document.getElementById("refresh-now").addEventListener("click", function () {
    if (!state.stopped) {
      refresh();
    }
  });

  updateDownloads();
  refresh();
})();
