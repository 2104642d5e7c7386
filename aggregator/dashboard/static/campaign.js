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
  // How far below the time axis its date labels start, in pixels (renderSeries).
  var SERIES_DATE_STANDOFF_PX = 12;
  var plotConfig = { responsive: true, displaylogo: false, displayModeBar: false };
  var font = { family: "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", size: 13 };
  var colorscale = "Viridis";
  // The share of the noisy reports per category, shown beside the estimate as a reference.
  var RAW_NAME = "raw report shares (reference)";

  // Shares that span more than this factor (1.5 orders of magnitude) are drawn on a log axis
  // when the scale is automatic: on a linear axis the smallest would be a few pixels tall.
  var LOG_SPAN = Math.pow(10, 1.5);
  // A log axis shows at most this many decades below the largest share; smaller shares and
  // zeros are drawn at its floor.
  var LOG_DECADES = 4;
  // Shares closer to zero than this many percent are written as below it (formatShare).
  var SMALLEST_SHOWN_PERCENT = 0.0001;

  var methodSelect = document.getElementById("method");
  var sortSelect = document.getElementById("sort");
  var topSelect = document.getElementById("top");
  var scaleSelect = document.getElementById("scale");
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
    return url + "?method=" + encodeURIComponent(methodSelect.value) + windowQuery();
  }

  /* plotly reads a few HTML tags in text; labels are shown literally. */
  function escapeLabel(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  function percent(x, digits) {
    return (100 * x).toFixed(digits === undefined ? 1 : digits) + "%";
  }

  /* Every share the page shows (table, hover, axis ticks, colour bars, captions): a percent
   * with three significant digits ("55.0%", "1.50%", "0.0700%"), whole percents from 100% up
   * ("275%"), "0%" for zero and "<0.0001%" (">-0.0001%") for a share closer to zero than
   * that; never exponent notation, never "0.00%" for a share that is not zero. ``trim``
   * drops trailing zeros (axis ticks). The server writes shares by the same rule
   * (aggregator/dashboard/data.py, share_text). */
  function formatShare(x, trim) {
    if (typeof x !== "number" || !isFinite(x)) {
      return "–";
    }
    if (x === 0) {
      return "0%";
    }
    var value = Math.abs(100 * x);
    if (value < SMALLEST_SHOWN_PERCENT) {
      return (x > 0 ? "<" : ">-") + SMALLEST_SHOWN_PERCENT + "%";
    }
    var digits = value >= 100 ? String(Math.round(value)) : value.toPrecision(3);
    if (trim && digits.indexOf(".") >= 0) {
      digits = digits.replace(/0+$/, "").replace(/\.$/, "");
    }
    return (x < 0 ? "-" : "") + digits + "%";
  }

  /* A linear share axis from ``low`` (0 or below) to ``top``: a round step (1, 2, 2.5 or 5
   * times a power of ten) giving about five ticks, labelled by formatShare, so ticks always
   * differ (0.25%, 0.1%, 20%). With nothing to show the axis runs from 0 to 1%. */
  function linearShareAxis(low, top) {
    low = Math.min(0, isFinite(low) ? low : 0);
    if (!(top > 0) || !isFinite(top)) {
      top = 0.01;
    }
    var rough = (top - low) / 5;
    var power = Math.pow(10, Math.floor(Math.log10(rough)));
    var step = [1, 2, 2.5, 5, 10].map(function (m) { return m * power; })
      .filter(function (candidate) { return candidate >= rough * 0.999; })[0];
    var high = top * 1.05;
    var bottom = low < 0 ? low - 0.05 * (top - low) : 0;
    var values = [];
    for (var i = Math.ceil(bottom / step - 1e-9); i * step <= high + 1e-12; i += 1) {
      values.push(Number((i * step).toPrecision(12)));
    }
    return {
      type: "linear",
      range: [bottom, high],
      tickvals: values,
      ticktext: values.map(function (v) { return formatShare(v, true); }),
    };
  }

  /* A log share axis from ``floor`` to ``top``, ticked at 1, 2 and 5 times each power of
   * ten over up to 2.5 decades, at 1 and 3 times over up to 4.5, at the powers of ten
   * beyond: about ten ticks at most. */
  function logShareAxis(floor, top) {
    var values = [];
    var decades = Math.log10(top / floor);
    var steps = decades <= 2.5 ? [1, 2, 5] : decades <= 4.5 ? [1, 3] : [1];
    for (var e = Math.floor(Math.log10(floor)); e <= Math.ceil(Math.log10(top)); e += 1) {
      steps.forEach(function (m) {
        var v = Number((m * Math.pow(10, e)).toPrecision(12));
        if (v >= floor && v <= top) {
          values.push(v);
        }
      });
    }
    return {
      type: "log",
      range: [Math.log10(floor), Math.log10(top)],
      tickvals: values,
      ticktext: values.map(function (v) { return formatShare(v, true); }),
    };
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
        // The first date label sits under the corner, where the count axis writes its 0:
        // set below the axis by more than half a line, the two never meet.
        ticklabelstandoff: SERIES_DATE_STANDOFF_PX,
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

  /* The scale the categories are drawn on: the Scale menu's choice, or when that is automatic,
   * log when the positive estimates shown span more than LOG_SPAN (the smallest would be a
   * few pixels tall as bars from 0), linear otherwise. */
  function chooseScale(rows) {
    var positive = rows.map(function (r) { return r.frequency; })
      .filter(function (f) { return f > 0; });
    var largest = positive.length ? Math.max.apply(null, positive) : 0;
    var smallest = positive.length ? Math.min.apply(null, positive) : 0;
    var span = positive.length > 1 ? largest / smallest : 1;
    var choice = scaleSelect ? scaleSelect.value : "auto";
    return {
      scale: choice === "auto" ? (span > LOG_SPAN ? "log" : "linear") : choice,
      auto: choice === "auto",
      span: span,
      largest: largest,
      smallest: smallest,
    };
  }

  /* Says which scale the chart is on, above it and in the Scale menu's automatic choice. */
  function describeScale(choice, level, floor, belowFloor) {
    var chart = document.getElementById("estimate-chart");
    chart.dataset.scale = choice.scale;
    var note;
    if (choice.scale === "log") {
      chart.setAttribute("aria-label", "Dot plot of the estimated share of each category on a " +
        "logarithmic axis, with confidence intervals");
      note = "Logarithmic scale" + (choice.auto
        ? ", chosen because the estimates shown span " +
          Math.round(choice.span).toLocaleString("en") + "-fold (" +
          formatShare(choice.largest) + " to " + formatShare(choice.smallest) +
          "): as bars from 0 the smallest would be a few pixels tall"
        : "") +
        ". Each step up the axis multiplies the share; dots are the estimates, whiskers their " +
        level + " intervals, and an interval that reaches 0 runs off the bottom" +
        (belowFloor
          ? "; ▼ marks an estimate of 0 or below (or under " + formatShare(floor, true) +
            "), drawn at the foot of the axis: the table gives its value"
          : "") + ".";
    } else {
      chart.setAttribute("aria-label",
        "Bar chart of the estimated share of each category with confidence intervals");
      note = "Linear scale: bar heights are proportional to the shares" +
        (choice.auto && choice.span > 1
          ? " (the estimates shown span " + Math.round(choice.span).toLocaleString("en") +
            "-fold)"
          : "") +
        "; whiskers are the " + level + " intervals.";
    }
    setText("scale-note", note);
    if (scaleSelect) {
      scaleSelect.querySelector('option[value="auto"]').textContent =
        "Automatic (" + (choice.scale === "log" ? "logarithmic" : "linear") + " here)";
    }
  }

  /* The hover text of an estimate: the same numbers as the table, in the same format. */
  function estimateHover(rows, level) {
    return {
      customdata: rows.map(function (r) {
        return [formatShare(r.frequency), formatShare(r.ci_low), formatShare(r.ci_high)];
      }),
      hovertemplate: "<b>%{x}</b><br>estimate %{customdata[0]}<br>" + level +
        " interval %{customdata[1]} to %{customdata[2]}<extra></extra>",
    };
  }

  function rawHover(rows) {
    return {
      customdata: rows.map(function (r) { return formatShare(r.raw_frequency); }),
      hovertemplate: "<b>%{x}</b><br>raw report share %{customdata}<extra></extra>",
    };
  }

  /* The estimate of each category shown with its interval, drawn from the interval's own
   * bounds (an interval that does not contain its estimate is drawn where it is, never
   * clipped to the estimate), and the raw report share beside it (a reference) when the API
   * gives it: bars on a linear axis, or dots on a log axis (chooseScale). */
  function renderBars(estimate) {
    var rows = shownRows(estimate.estimates);
    var level = percent(estimate.confidence, 0);
    var labels = rows.map(function (r) { return escapeLabel(r.label); });
    var raw = hasRaw(rows);
    var choice = chooseScale(rows);
    var log = choice.scale === "log";
    var top = rows.reduce(function (m, r) {
      return Math.max(m, r.frequency, r.ci_high, raw ? r.raw_frequency : 0);
    }, 0);
    var low = rows.reduce(function (m, r) { return Math.min(m, r.frequency, r.ci_low); }, 0);
    // The log axis' floor, where estimates of 0 or below are drawn: under the smallest
    // positive value drawn, at most LOG_DECADES decades under the largest.
    var positives = [];
    rows.forEach(function (r) {
      [r.frequency, r.ci_low, r.ci_high, raw ? r.raw_frequency : 0].forEach(function (v) {
        if (v > 0) {
          positives.push(v);
        }
      });
    });
    var floor = Math.max(
      top / Math.pow(10, LOG_DECADES),
      positives.length ? Math.min.apply(null, positives) / 1.5 : top / 100
    );
    if (log && !(floor > 0 && isFinite(floor))) {
      // Nothing above 0 to draw (a log scale asked for by hand): bars from 0 instead.
      choice.scale = "linear";
      log = false;
    }
    function drawn(v) {
      return log && !(v > floor) ? floor : v;
    }
    var belowFloor = log && rows.some(function (r) { return !(r.frequency > floor); });
    var ys = rows.map(function (r) { return drawn(r.frequency); });
    var whiskers = {
      type: "data",
      symmetric: false,
      // Signed on purpose: plotly draws the whisker from y - arrayminus to y + array,
      // which are exactly ci_low and ci_high whatever side of the estimate they lie.
      array: rows.map(function (r, i) { return r.ci_high - ys[i]; }),
      arrayminus: rows.map(function (r, i) { return ys[i] - r.ci_low; }),
      color: "#1b2b3a",
      thickness: 1.5,
      width: log ? 6 : 4,
    };
    var trace = Object.assign({
      name: "estimate, " + level + " interval",
      x: labels,
      y: ys,
      error_y: whiskers,
    }, estimateHover(rows, level), log
      ? {
        type: "scatter",
        mode: "markers",
        marker: {
          color: "#2f6fb3",
          size: 10,
          symbol: rows.map(function (r) { return r.frequency > floor ? "circle" : "triangle-down"; }),
        },
      }
      : { type: "bar", marker: { color: "#2f6fb3" } });
    var traces = [trace];
    if (raw) {
      traces.push(Object.assign({
        name: RAW_NAME,
        x: labels,
        y: rows.map(function (r) { return drawn(r.raw_frequency); }),
      }, rawHover(rows), log
        ? { type: "scatter", mode: "markers", marker: { color: "#9aa3ad", size: 8, symbol: "diamond" } }
        : { type: "bar", marker: { color: "#c5cbd3" } }));
    }
    // Room under the floor for its markers to show whole.
    var yaxis = log ? logShareAxis(floor / 1.4, top * 1.5) : linearShareAxis(low, top);
    var layout = baseLayout({
      xaxis: axis("category", { type: "category", tickangle: labelAngle(rows) }),
      yaxis: axis(log ? "share of reporters (log scale)" : "share of reporters",
        Object.assign({ zeroline: !log }, yaxis)),
      showlegend: raw,
      legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
      barmode: "group",
      bargap: 0.25,
      bargroupgap: 0.05,
      scattermode: "group",
      scattergap: 0.4,
    });
    if (raw) {
      layout.margin = Object.assign({}, layout.margin, { t: 40 });
    }
    describeScale(choice, level, floor, belowFloor);
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
      Object.assign({
        type: "scatter", mode: rows.length <= 60 ? "lines+markers" : "lines", name: "estimate",
        x: x, y: rows.map(function (r) { return r.frequency; }),
        line: { color: "#2f6fb3", width: 2 },
      }, estimateHover(rows, level)),
    ];
    if (raw) {
      traces.push(Object.assign({
        type: "scatter", mode: "lines", name: RAW_NAME, x: x,
        y: rows.map(function (r) { return r.raw_frequency; }),
        line: { color: "#9aa3ad", width: 1 },
      }, rawHover(rows)));
    }
    var top = rows.reduce(function (m, r) {
      return Math.max(m, r.frequency, r.ci_high, raw ? r.raw_frequency : 0);
    }, 0);
    var low = rows.reduce(function (m, r) { return Math.min(m, r.frequency, r.ci_low); }, 0);
    var layout = baseLayout({
      xaxis: axis("value", { type: "linear" }),
      yaxis: axis("share of reporters",
        Object.assign({ zeroline: true }, linearShareAxis(low, top))),
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
    var ticks = linearShareAxis(0, zmax);
    return {
      title: { text: "share" }, thickness: 14, tickmode: "array",
      tickvals: ticks.tickvals.filter(function (v) { return v <= zmax; }),
      ticktext: ticks.ticktext.filter(function (_, i) { return ticks.tickvals[i] <= zmax; }),
    };
  }

  /* Tells the basemap (static/basemap.js, loaded when the operator set map tiles) what to
   * draw over its tiles: the same layers and colour scale as the heatmaps, or null to clear. */
  function announceHeatmap(h) {
    root.dispatchEvent(new CustomEvent("ldp:heatmap", {
      detail: { heatmap: h, formatShare: formatShare },
    }));
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
        text: z.map(function (line) { return line.map(function (v) { return formatShare(v); }); }),
        hovertemplate: "lat %{y:.5f}°, lon %{x:.5f}°<br>" + label + " %{text}<extra></extra>",
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
    // No raw map where a report is a hash or a code of its cell, not a cell (OLH, Hadamard).
    if (h.raw) {
      Plotly.react("heatmap-raw", [heatmap(h.raw, "share of reports")], layout(), plotConfig);
    }
    Plotly.react("heatmap-estimate", [heatmap(h.estimate, "estimated share")], layout(), plotConfig);
    announceHeatmap(h);
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
        td.textContent = formatShare(value);
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
      if (document.getElementById(id)) {
        Plotly.purge(id);
      }
    });
    if (planar) {
      announceHeatmap(null);
    }
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

  /* -- time: the window picker, the trend and the comparison ------------------------------ */

  var windowSelect = document.getElementById("window");
  // The window picked: period keys (empty: open end); both empty is all time.
  var picked = { since: "", until: "" };
  // Colours of the trend's lines, one per followed category (a colour-blind-safe set).
  var TREND_COLOURS = ["#2f6fb3", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9",
    "#8c564b", "#7f7f7f", "#bcbd22", "#000000"];
  // The comparison lists at most this many rows: the largest changes first.
  var COMPARE_ROWS = 20;

  function windowQuery() {
    var query = "";
    if (picked.since) {
      query += "&since=" + encodeURIComponent(picked.since);
    }
    if (picked.until) {
      query += "&until=" + encodeURIComponent(picked.until);
    }
    return query;
  }

  /* The picker's choice as since/until; the estimate, downloads, trend and comparison follow. */
  function applyWindow() {
    var option = windowSelect.selectedOptions[0];
    if (windowSelect.value === "custom") {
      picked = {
        since: document.getElementById("window-since").value,
        until: document.getElementById("window-until").value,
      };
    } else {
      picked = { since: option.dataset.since, until: option.dataset.until };
    }
    root.dataset.window = windowSelect.value;
    updateDownloads();
    refreshEstimate().catch(fail);
  }

  /* Which window the estimate shown is over, and its number of reports. */
  function showWindow(estimate) {
    var w = estimate.window;
    setText("window-shown", (w ? "Showing " + windowText(w) : "Showing all time") + ": " +
      estimate.n.toLocaleString("en") + " reports.");
    root.dataset.renderedWindow = windowQuery();
  }

  function windowText(w) {
    return w.since === w.until ? w.since : w.since + " to " + w.until;
  }

  function hexToRgba(hex, alpha) {
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + ", " + ((n >> 8) & 255) + ", " + (n & 255) + ", " + alpha + ")";
  }

  /* One line per followed category (or cell) over the periods, each with its interval as a
   * band of its own colour: the trend API's body as the dashboard's trend endpoint gives it. */
  function renderTrend(trend) {
    var x = trend.periods.map(function (p) { return p.period; });
    var level = percent(trend.confidence, 0);
    var traces = [];
    var top = 0;
    var low = 0;
    trend.series.forEach(function (line, i) {
      var colour = TREND_COLOURS[i % TREND_COLOURS.length];
      var name = escapeLabel(line.label);
      traces.push({
        type: "scatter", mode: "lines", x: x, y: line.ci_low, name: name + " band",
        legendgroup: name, line: { width: 0 }, hoverinfo: "skip", showlegend: false,
        connectgaps: false,
      });
      traces.push({
        type: "scatter", mode: "lines", x: x, y: line.ci_high, name: name + " band",
        legendgroup: name, fill: "tonexty", fillcolor: hexToRgba(colour, 0.15),
        line: { width: 0 }, hoverinfo: "skip", showlegend: false, connectgaps: false,
      });
      traces.push({
        type: "scatter", mode: "lines+markers", x: x, y: line.frequency, name: name,
        legendgroup: name, line: { color: colour, width: 2 }, marker: { size: 5 },
        customdata: line.frequency.map(function (f, j) {
          return [formatShare(f), formatShare(line.ci_low[j]), formatShare(line.ci_high[j]),
            trend.periods[j].n.toLocaleString("en")];
        }),
        hovertemplate: "<b>" + name + "</b>, %{x}<br>estimate %{customdata[0]}<br>" + level +
          " interval %{customdata[1]} to %{customdata[2]}<br>n %{customdata[3]}<extra></extra>",
      });
      line.ci_high.forEach(function (v) { if (v !== null) { top = Math.max(top, v); } });
      line.ci_low.forEach(function (v) { if (v !== null) { low = Math.min(low, v); } });
    });
    // The legend above the plot, on as many lines as the width needs.
    var legendLines = Math.ceil(trend.series.length / (window.innerWidth < 600 ? 2 : 5));
    var layout = baseLayout({
      xaxis: axis("", { type: "category", automargin: true }),
      yaxis: axis("share of reporters", Object.assign({ zeroline: true }, linearShareAxis(low, top))),
      showlegend: true,
      legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
    });
    layout.margin = Object.assign({}, layout.margin, { t: 16 + 24 * legendLines });
    Plotly.react("trend-chart", traces, layout, plotConfig);
    setText("trend-caption", "The estimated share of the " + trend.series.length +
      (planar ? " cells" : " categories") + " with the largest shares over " +
      windowText(trend.window) + ", per " + root.dataset.periodUnit + " (" +
      trend.n.toLocaleString("en") + " reports); each band is the " + level +
      " interval of its " + root.dataset.periodUnit + ".");
    var message = document.getElementById("trend-message");
    message.textContent = (trend.warnings || []).join(" ");
    message.hidden = !(trend.warnings || []).length;
    root.dataset.trendLines = String(trend.series.length);
  }

  /* Each category's change from the window before to the picked one, with its interval; a
   * change whose interval leaves out 0 (the API's excludes_zero) is marked. */
  function renderComparison(body) {
    var rows = body.differences.slice().sort(function (p, q) {
      return Math.abs(q.difference) - Math.abs(p.difference);
    }).slice(0, COMPARE_ROWS);
    var tbody = document.querySelector("#compare-table tbody");
    var fragment = document.createDocumentFragment();
    rows.forEach(function (r) {
      var tr = document.createElement("tr");
      tr.className = r.excludes_zero ? "marked" : "";
      tr.dataset.excludesZero = String(r.excludes_zero);
      var th = document.createElement("th");
      th.scope = "row";
      th.textContent = r.label;
      tr.appendChild(th);
      var mark = r.excludes_zero ? (r.difference > 0 ? " ▲" : " ▼") : "";
      var shares = document.createElement("td");
      shares.className = "num";
      shares.textContent = formatShare(r.a) + " → " + formatShare(r.b);
      var change = document.createElement("td");
      change.className = "num change";
      var interval = document.createElement("span");
      interval.className = "interval";
      interval.textContent = formatShare(r.ci_low) + " to " + formatShare(r.ci_high);
      change.append((r.difference > 0 ? "+" : "") + formatShare(r.difference) + mark, interval);
      tr.append(shares, change);
      if (r.excludes_zero) {
        tr.title = "clearly " + (r.difference > 0 ? "up" : "down") + ": the interval leaves out 0";
      }
      fragment.appendChild(tr);
    });
    tbody.replaceChildren(fragment);
    var level = percent(body.confidence, 0);
    setText("compare-caption", windowText(body.b.window) + " (n " + body.b.n.toLocaleString("en") +
      ") against " + windowText(body.a.window) + " (n " + body.a.n.toLocaleString("en") + "): " +
      (rows.length < body.differences.length ? "the " + rows.length + " largest changes of " +
        body.differences.length : "every change") + ", with " + level + " intervals; " +
      body.excluding_zero + " marked ▲ or ▼");
    setText("compare-note", (body.differences.length ? "▲ ▼ mark a change whose " + level +
      " interval leaves out 0: clearly up or down. Each interval holds on its own, so among " +
      "many categories that did not change about " + percent(1 - body.confidence, 0) +
      " are marked by chance. " : "") + (body.warnings || []).join(" "));
    root.dataset.compareMarked = String(body.excluding_zero);
  }

  /* The trend and the comparison of the picked window, fetched with the estimate. */
  function refreshTime() {
    var asked = methodSelect.value + windowQuery();
    getJSON(withMethod(cfg.trendUrl)).then(function (trend) {
      if (asked === methodSelect.value + windowQuery()) {
        renderTrend(trend);
      }
    }).catch(function (error) {
      var message = document.getElementById("trend-message");
      message.textContent = error.message || String(error);
      message.hidden = false;
    });
    getJSON(withMethod(cfg.compareUrl)).then(function (body) {
      if (asked === methodSelect.value + windowQuery()) {
        renderComparison(body);
      }
    }).catch(function (error) {
      setText("compare-note", error.message || String(error));
    });
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
    var key = method + windowQuery() + "@" + state.n;
    if (key === state.estimateKey || Date.now() < (state.retryAt[key] || 0)) {
      return Promise.resolve();
    }
    var asked = method + windowQuery();
    if (state.pending[asked]) {
      return state.pending[asked];
    }
    setBusy(true);
    var request = getJSON(withMethod(cfg.estimateUrl))
      .then(
        function (estimate) {
          if (estimate.method !== methodSelect.value || asked !== method + windowQuery()) {
            return; // the estimator or window was switched meanwhile; its own request draws
          }
          state.estimate = estimate;
          state.estimateKey = key;
          renderEstimate(estimate);
          showWindow(estimate);
          refreshTime();
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
        delete state.pending[asked];
        setBusy(Object.keys(state.pending).length > 0);
      });
    state.pending[asked] = request;
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
  [sortSelect, topSelect, scaleSelect].forEach(function (select) {
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

  windowSelect.addEventListener("change", function () {
    var custom = windowSelect.value === "custom";
    document.querySelectorAll(".window-custom").forEach(function (el) { el.hidden = !custom; });
    if (!custom) {
      applyWindow();
    }
  });
  document.getElementById("window-picker").addEventListener("submit", function (event) {
    event.preventDefault();
    applyWindow();
  });

  updateDownloads();
  refresh();
})();
