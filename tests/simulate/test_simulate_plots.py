"""The simulation's figures: one colour per method in every panel, a legend in each, units."""

from __future__ import annotations

import matplotlib.colors
import pytest

from simulate.metrics import Scores
from simulate.plots import error_vs_epsilon_figure, method_colours
from simulate.runner import NOISY, ResultRow

METHODS = ("ibu", "inversion", "clip", "projection", NOISY)


def rows_for(mechanism: str, methods=METHODS) -> list[ResultRow]:
    rows = []
    for n in (1_000, 10_000):
        for epsilon in (0.01, 0.02, 0.04):
            for rank, method in enumerate(methods):
                # Inversion's estimate has negative entries, so it has no EMD (as in the runner).
                emd = None if method == "inversion" else 100.0 / epsilon / n**0.5 + rank
                scores = Scores(tv=0.1 * rank + 1 / epsilon / n, mse=0.0, max_abs=0.0, emd_m=emd)
                rows.append(ResultRow(mechanism, epsilon, n, method, 1, scores, scores, 0.01, None))
    return rows


def panel_colours(figure) -> list[dict[str, tuple]]:
    return [
        {line.get_label(): matplotlib.colors.to_rgba(line.get_color()) for line in axes.lines}
        for axes in figure.axes
    ]


def test_each_method_keeps_its_colour_in_every_panel():
    figure = error_vs_epsilon_figure(rows_for("planar_laplace"), location=True)
    panels = panel_colours(figure)
    assert len(panels) == 4  # total variation and EMD, for two values of n
    emd_panels = [
        p for p, axes in zip(panels, figure.axes, strict=True) if "EMD" in axes.get_ylabel()
    ]
    assert all("inversion" not in panel for panel in emd_panels)
    colour_of: dict[str, tuple] = {}
    for panel in panels:
        for method, colour in panel.items():
            assert colour_of.setdefault(method, colour) == colour, method
    assert set(colour_of) == set(METHODS)
    assert len(set(colour_of.values())) == len(METHODS)


def test_every_panel_has_a_legend_of_what_it_draws():
    figure = error_vs_epsilon_figure(rows_for("planar_laplace"), location=True)
    for axes in figure.axes:
        legend = axes.get_legend()
        assert legend is not None
        assert [text.get_text() for text in legend.get_texts()] == [
            line.get_label() for line in axes.lines
        ]


@pytest.mark.parametrize(
    ("mechanism", "location", "unit"),
    [("planar_laplace", True, "per metre"), ("krr", False, "per report")],
)
def test_the_epsilon_axis_names_its_unit(mechanism, location, unit):
    figure = error_vs_epsilon_figure(rows_for(mechanism), location=location)
    for axes in figure.axes:
        assert axes.get_xscale() == "log"
        assert "epsilon" in axes.get_xlabel()
        assert unit in axes.get_xlabel()


def test_colours_do_not_depend_on_which_methods_are_drawn():
    everything = method_colours(["auto", *METHODS])
    fewer = method_colours(["projection", "auto"])
    assert fewer == {m: everything[m] for m in ("projection", "auto")}
    categorical = panel_colours(error_vs_epsilon_figure(rows_for("krr", ("clip",)), location=False))
    assert categorical[0]["clip"] == matplotlib.colors.to_rgba(everything["clip"])
