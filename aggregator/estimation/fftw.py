"""FFTW plans run from compiled loops, for the planar channel's convolutions.

This is the optional ``fast`` extra's path (``pip install '.[aggregator,fast]'``):
pyFFTW wraps the GPL-licensed FFTW, so the default install leaves it out and
the channel runs on ``scipy.fft`` (:mod:`aggregator.estimation.planar_steps`).
The FFTW library is the one pyFFTW's wheels ship (and its extension is linked
against); it is called through ctypes, so that numba-compiled code runs a whole
convolution, or a whole run of IBU steps, without a Python call per transform.
:func:`load` returns ``None`` when pyFFTW, its library or numba is missing; it
imports them only when first called (building a planar channel), never at import.

Only ``fftw_execute`` is thread-safe in FFTW: planning and destroying plans go
through one lock here. Transforms keep to the plans' own buffers.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import weakref
from enum import IntEnum, IntFlag
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from aggregator.estimation.native import native_lock


class Sign(IntEnum):
    """fftw3.h's transform directions."""

    FORWARD = -1
    BACKWARD = 1


class Flag(IntFlag):
    """fftw3.h's planner flags."""

    MEASURE = 0
    DESTROY_INPUT = 1
    ESTIMATE = 1 << 6


# The longest FFTW may spend measuring one plan. Measured plans are remembered
# (FFTW's wisdom), so a shape is measured once per process.
PLANNING_TIME_LIMIT_S = 0.25
# The double-precision library, under its plain or its wheel-mangled name
# (libfftw3.so.3, libfftw3-6b983104.so.3.5.5), not libfftw3f, libfftw3l or libfftw3_omp.
_LIBRARY_NAME = re.compile(r"^libfftw3(-[0-9a-f]+)?\.so")


# Plans are made and destroyed in native threads (gevent's thread pool runs estimates).
_planning = native_lock()


def _library_path() -> str | None:
    """The FFTW library pyFFTW loaded, from the process's mapped files; else the system's."""
    try:
        import pyfftw  # noqa: F401 - loads the library it is linked against
    except ImportError:
        return None
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip()
                if _LIBRARY_NAME.match(Path(path).name):
                    return path
    except OSError:
        pass
    return ctypes.util.find_library("fftw3")


@cache
def load() -> SimpleNamespace | None:
    """FFTW's entry points and the compiled loops over them, or ``None`` if unavailable."""
    path = _library_path()
    if path is None:
        return None
    try:
        import numba  # noqa: F401 - the loops below are compiled with it
    except ImportError:
        return None
    library = ctypes.CDLL(path)
    pointer, integer, integers = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int)
    layout = [integer, integers, integer, pointer, integers, integer, integer]
    layout += [pointer, integers, integer, integer]
    for name, extra in (
        ("fftw_plan_many_dft_r2c", []),
        ("fftw_plan_many_dft_c2r", []),
        ("fftw_plan_many_dft", [integer]),
    ):
        function = getattr(library, name)
        function.argtypes = [*layout, *extra, ctypes.c_uint]
        function.restype = pointer
    library.fftw_execute.argtypes = [pointer]
    library.fftw_execute.restype = None
    library.fftw_destroy_plan.argtypes = [pointer]
    library.fftw_destroy_plan.restype = None
    library.fftw_set_timelimit.argtypes = [ctypes.c_double]
    library.fftw_set_timelimit.restype = None
    with _planning:
        library.fftw_set_timelimit(PLANNING_TIME_LIMIT_S)
    from aggregator.estimation import fftw_loops

    execute = ctypes.cast(library.fftw_execute, ctypes.c_void_p).value
    return SimpleNamespace(library=library, execute=execute, loops=fftw_loops)


class Convolution:
    """One thread's buffers and plans for linear 2-D convolutions of small images.

    Write the image into ``image`` (``rows x shape[1]``; columns beyond the
    image are zero padding, and rows up to ``shape[0]`` are implied zeros),
    then :meth:`apply` a kernel's half spectrum of ``shape`` already divided by
    the transform size: ``result``'s rows are the first ``rows`` rows of the
    circular convolution. The transform runs in two stages, rows then columns,
    so the padding rows are never transformed and only ``rows`` rows come back.
    The row stages are measured (planned by timing, once per shape and
    process), the column stages estimated: measuring those gains nothing.
    """

    def __init__(self, binding: SimpleNamespace, rows: int, shape: tuple[int, int]):
        from pyfftw import zeros_aligned  # SIMD-aligned buffers; present wherever load() is

        n_rows, n_cols = shape
        half = n_cols // 2 + 1
        self.rows, self.shape, self.binding = rows, shape, binding
        self.image = zeros_aligned((rows, n_cols), float)
        rows_spectrum = zeros_aligned((n_rows, half), complex)  # rows beyond `rows` stay zero
        self.spectrum = zeros_aligned((n_rows, half), complex)
        back = zeros_aligned((n_rows, half), complex)
        self.result = zeros_aligned((rows, n_cols), float)
        library = binding.library
        many = (ctypes.c_int * 1)(n_cols), (ctypes.c_int * 1)(n_rows)
        with _planning:
            handles = (
                library.fftw_plan_many_dft_r2c(
                    1, many[0], rows, _at(self.image), None, 1, n_cols,
                    _at(rows_spectrum), None, 1, half, Flag.MEASURE,
                ),
                library.fftw_plan_many_dft(
                    1, many[1], half, _at(rows_spectrum), None, half, 1,
                    _at(self.spectrum), None, half, 1, Sign.FORWARD, Flag.ESTIMATE,
                ),
                library.fftw_plan_many_dft(
                    1, many[1], half, _at(self.spectrum), None, half, 1,
                    _at(back), None, half, 1, Sign.BACKWARD, Flag.ESTIMATE | Flag.DESTROY_INPUT,
                ),
                library.fftw_plan_many_dft_c2r(
                    1, many[0], rows, _at(back), None, 1, half,
                    _at(self.result), None, 1, n_cols, Flag.MEASURE | Flag.DESTROY_INPUT,
                ),
            )  # fmt: skip
            if not all(handles):
                for handle in filter(None, handles):
                    library.fftw_destroy_plan(handle)
                raise RuntimeError(f"FFTW could not plan a {n_rows} x {n_cols} transform")
        # Measuring scribbles on the buffers: the zero padding is laid down afterwards.
        self.image[:] = 0.0
        rows_spectrum[:] = 0.0
        self.plans = np.array(handles, dtype=np.uintp)
        # The plans write into these arrays: they live as long as the plans.
        self._buffers = (rows_spectrum, back)
        weakref.finalize(self, _destroy, library, handles)

    def apply(self, spectrum: np.ndarray) -> np.ndarray:
        """The first ``rows`` rows of ``image`` convolved with ``spectrum`` (a shared buffer)."""
        self.binding.loops.convolve(self.binding.execute, self.plans, self.spectrum, spectrum)
        return self.result


def _at(array: np.ndarray) -> int:
    return array.ctypes.data


def _destroy(library, handles) -> None:
    with _planning:
        for handle in handles:
            library.fftw_destroy_plan(handle)
