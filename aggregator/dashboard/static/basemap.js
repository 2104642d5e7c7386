/* The campaign page's basemap: the grid's cells over map tiles, with Leaflet.
 *
 * Loaded only when the operator set a tile URL (LDP_MAP_TILES_URL); without one the page
 * shows the coordinates-only heatmaps and no request leaves the dashboard's server. The
 * cells are coloured on the heatmaps' scale (Viridis from 0 to the largest share of the
 * layers) and give the same values on hover. campaign.js announces each new estimate's
 * layers with an "ldp:heatmap" event on <main>. Text from the server goes into the DOM as
 * text only (the attribution is escaped before Leaflet writes it).
 */
(function () {
  "use strict";

  var root = document.getElementById("main");
  var element = document.getElementById("basemap");
  if (!element || typeof L === "undefined") {
    return;
  }
  // plotly's Viridis, so that a cell is the colour it has on the heatmaps.
  var VIRIDIS = [
    [0, "#440154"], [0.06274509803921569, "#48186a"], [0.12549019607843137, "#472d7b"],
    [0.18823529411764706, "#424086"], [0.25098039215686274, "#3b528b"],
    [0.3137254901960784, "#33638d"], [0.3764705882352941, "#2c728e"],
    [0.4392156862745098, "#26828e"], [0.5019607843137255, "#21918c"],
    [0.5647058823529412, "#1fa088"], [0.6274509803921569, "#28ae80"],
    [0.6901960784313725, "#3fbc73"], [0.7529411764705882, "#5ec962"],
    [0.8156862745098039, "#84d44b"], [0.8784313725490196, "#addc30"],
    [0.9411764705882353, "#d8e219"], [1, "#fde725"],
  ];
  // Cells let the streets under them show through.
  var CELL_OPACITY = 0.55;
  var METRES_PER_DEGREE = 111320;

  function escapeText(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;");
  }

  function rgb(hex) {
    var n = parseInt(hex.slice(1), 16);
    return [n >> 16, (n >> 8) & 255, n & 255];
  }

  /* The colour of ``t`` in [0, 1] on VIRIDIS, interpolated between its stops as plotly does. */
  function viridis(t) {
    t = Math.min(1, Math.max(0, isFinite(t) ? t : 0));
    for (var i = 1; i < VIRIDIS.length; i += 1) {
      if (t <= VIRIDIS[i][0]) {
        var a = VIRIDIS[i - 1];
        var b = VIRIDIS[i];
        var f = (t - a[0]) / (b[0] - a[0]);
        var ca = rgb(a[1]);
        var cb = rgb(b[1]);
        return "rgb(" + [0, 1, 2].map(function (k) {
          return Math.round(ca[k] + f * (cb[k] - ca[k]));
        }).join(", ") + ")";
      }
    }
    return VIRIDIS[VIRIDIS.length - 1][1];
  }

  var map = L.map(element, { scrollWheelZoom: false });
  L.tileLayer(element.dataset.tilesUrl, {
    attribution: escapeText(element.dataset.attribution || ""),
    maxZoom: 19,
    crossOrigin: false,
  }).addTo(map);
  var layers = {
    estimate: L.layerGroup().addTo(map),
    raw: L.layerGroup(),
  };
  var control = null;
  var legend = null;
  // The region the grid covers, in view before the first estimate.
  map.fitBounds([
    [Number(element.dataset.latMin), Number(element.dataset.lonMin)],
    [Number(element.dataset.latMax), Number(element.dataset.lonMax)],
  ]);

  /* Half a cell in degrees of latitude and longitude, from the centres (or the cell's size). */
  function halfCell(h) {
    var latMid = (h.lat[0] + h.lat[h.lat.length - 1]) / 2;
    var dLat = h.lat.length > 1 ? (h.lat[1] - h.lat[0]) / 2
      : h.cell_size_m / METRES_PER_DEGREE / 2;
    var dLon = h.lon.length > 1 ? (h.lon[1] - h.lon[0]) / 2
      : h.cell_size_m / (METRES_PER_DEGREE * Math.cos((latMid * Math.PI) / 180)) / 2;
    return [dLat, dLon];
  }

  function fill(group, z, h, zmax, label, formatShare) {
    var half = halfCell(h);
    group.clearLayers();
    z.forEach(function (line, row) {
      line.forEach(function (value, col) {
        var lat = h.lat[row];
        var lon = h.lon[col];
        var cell = L.rectangle(
          [[lat - half[0], lon - half[1]], [lat + half[0], lon + half[1]]],
          {
            className: "basemap-cell",
            stroke: false,
            fillColor: viridis(value / zmax),
            fillOpacity: CELL_OPACITY,
          }
        );
        cell.bindTooltip(
          "lat " + lat.toFixed(5) + "°, lon " + lon.toFixed(5) + "°<br>" + label + " " +
            escapeText(formatShare(value)),
          { sticky: true }
        );
        group.addLayer(cell);
      });
    });
  }

  function drawLegend(zmax, formatShare) {
    if (legend) {
      legend.remove();
    }
    legend = L.control({ position: "bottomright" });
    legend.onAdd = function () {
      var box = L.DomUtil.create("div", "basemap-legend");
      var bar = L.DomUtil.create("div", "basemap-legend-bar", box);
      bar.style.background = "linear-gradient(to right, " + VIRIDIS.map(function (stop) {
        return stop[1] + " " + (100 * stop[0]).toFixed(1) + "%";
      }).join(", ") + ")";
      bar.style.opacity = String(CELL_OPACITY + 0.3);
      var scale = L.DomUtil.create("div", "basemap-legend-scale", box);
      var low = L.DomUtil.create("span", "", scale);
      low.textContent = "0%";
      var high = L.DomUtil.create("span", "", scale);
      high.textContent = formatShare(zmax);
      return box;
    };
    legend.addTo(map);
  }

  function draw(h, formatShare) {
    var zmax = h.zmax > 0 ? h.zmax : 1;
    fill(layers.estimate, h.estimate, h, zmax, "estimated share", formatShare);
    if (h.raw) {
      fill(layers.raw, h.raw, h, zmax, "share of reports", formatShare);
      if (!control) {
        control = L.control.layers(
          { "Estimated share": layers.estimate, "Raw report shares (reference)": layers.raw },
          null,
          { collapsed: false }
        ).addTo(map);
      }
    }
    drawLegend(zmax, formatShare);
    root.dataset.basemapCells = String(h.rows * h.cols);
  }

  root.addEventListener("ldp:heatmap", function (event) {
    if (event.detail) {
      draw(event.detail.heatmap, event.detail.formatShare);
    } else {
      layers.estimate.clearLayers();
      layers.raw.clearLayers();
      root.dataset.basemapCells = "0";
    }
  });
})();
