"""Frequency estimators over channel operators.

Each estimator is configured in ``__init__``; ``fit(counts, channel)``
returns ``self`` with the results in attributes ending in ``_``
(``frequencies_``, ``n_iter_``, ...). ``counts[y]`` is the number of
reports of output ``y``; ``channel`` is a :class:`channels.Channel`.

* :class:`MatrixInversion`: the unbiased ``p = q C^{-1}`` (``q`` the
  observed report frequencies), optionally made a distribution by clipping
  negatives and renormalising, or by Euclidean projection onto the simplex.
* :class:`IBU`: the Iterative Bayesian Update, i.e. EM for the maximum
  likelihood ``p`` (Agrawal and Aggarwal, PODS 2001; ElSalamouny and
  Palamidessi, "Generalized iterative Bayesian update and applications to
  mechanisms for privacy protection", EuroS&P 2020).
"""

from __future__ import annotations

import numpy as np

POSTPROCESS = ("none", "clip", "projection")
STOPPING = ("cv", "tolerance")


def _as_counts(counts, channel) -> np.ndarray:
    counts = np.asarray(counts, dtype=float)
    if counts.shape != (channel.n_outputs,):
        raise ValueError(f"expected {channel.n_outputs} counts, got shape {counts.shape}")
    if np.any(counts < 0) or not np.all(np.isfinite(counts)):
        raise ValueError("counts must be finite and non-negative")
    if counts.sum() <= 0:
        raise ValueError("no reports to estimate from")
    return counts


def project_to_simplex(v: np.ndarray) -> np.ndarray:
    """The Euclidean projection of ``v`` onto the probability simplex.

    The sort-based algorithm of Held, Wolfe and Crowder (1974), as in Duchi et
    al., "Efficient projections onto the l1-ball", ICML 2008: O(k log k).
    """
    u = np.sort(v)[::-1]
    cumulative = np.cumsum(u) - 1.0
    index = np.arange(1, v.size + 1)
    rho = np.nonzero(u - cumulative / index > 0)[0][-1]
    theta = cumulative[rho] / (rho + 1)
    return np.maximum(v - theta, 0.0)


def clip_and_normalise(v: np.ndarray) -> np.ndarray:
    """Negative entries set to 0, then rescaled to sum to 1 (uniform if nothing is left)."""
    clipped = np.maximum(v, 0.0)
    total = clipped.sum()
    return clipped / total if total > 0 else np.full(v.size, 1.0 / v.size)


def log_likelihood(counts: np.ndarray, predicted: np.ndarray) -> float:
    """Multinomial log-likelihood ``sum_y counts_y log predicted_y`` (without the constant)."""
    seen = counts > 0
    with np.errstate(divide="ignore"):
        return float(np.sum(counts[seen] * np.log(predicted[seen])))


class MatrixInversion:
    """Matrix inversion: solve ``p C = q`` for the observed report frequencies ``q``.

    Parameters
    ----------
    postprocess : {"none", "clip", "projection"}
        ``"none"`` keeps the unbiased solution (it may have negative entries);
        ``"clip"`` sets negatives to zero and renormalises; ``"projection"``
        takes the closest distribution in Euclidean distance.
    """

    def __init__(self, *, postprocess: str = "none"):
        if postprocess not in POSTPROCESS:
            raise ValueError(f"postprocess must be one of {POSTPROCESS}, got {postprocess!r}")
        self.postprocess = postprocess

    def fit(self, counts, channel) -> MatrixInversion:
        counts = _as_counts(counts, channel)
        self.n_ = counts.sum()
        self.unbiased_, self.converged_ = channel.solve_with_info(counts / self.n_)
        if self.postprocess == "clip":
            self.frequencies_ = clip_and_normalise(self.unbiased_)
        elif self.postprocess == "projection":
            self.frequencies_ = project_to_simplex(self.unbiased_)
        else:
            self.frequencies_ = self.unbiased_
        self.n_iter_ = None
        return self


class IBUSteps:
    """IBU's steps on one set of counts, through the channel's ``forward`` and ``backward``.

    ``p`` starts uniform; ``predicted`` is always ``forward(p)``. A channel
    may run the same steps faster (:meth:`channels.Channel.ibu_steps`).
    """

    def __init__(self, channel, counts: np.ndarray):
        self._channel = channel
        self._counts = counts
        self._observed = counts > 0
        self.p = np.full(channel.n_inputs, 1.0 / channel.n_inputs)
        self.predicted = channel.forward(self.p)

    def advance(self, steps: int, tol: float) -> tuple[int, float]:
        """Up to ``steps`` steps, stopping after one that changes no frequency by more than
        ``tol``. Returns the steps taken and the last one's largest change."""
        taken, change = 0, np.inf
        while taken < steps:
            # p_x <- p_x * sum_y C[x, y] counts_y / predicted_y; unreported outputs add nothing.
            ratio = np.zeros_like(self.predicted)
            with np.errstate(divide="ignore"):
                np.divide(self._counts, self.predicted, out=ratio, where=self._observed)
            updated = self.p * self._channel.backward(ratio)
            updated /= updated.sum()
            change = float(np.max(np.abs(updated - self.p)))
            taken += 1
            self.p = updated
            self.predicted = self._channel.forward(updated)
            if change <= tol:
                break
        return taken, change


def _steps(channel, counts: np.ndarray):
    """The channel's own IBU steps where it has them, else the generic ones."""
    steps = channel.ibu_steps(counts)
    return IBUSteps(channel, counts) if steps is None else steps


class IBU:
    """The Iterative Bayesian Update (EM for the maximum-likelihood distribution).

    Starting from the uniform distribution, each step is
    ``p_x <- p_x * sum_y C[x, y] q_y / (p C)_y``; the log-likelihood never
    decreases.

    Run to convergence, IBU fits the noise: with few reports per output its
    reconstruction gets worse as iterations grow (it is Richardson-Lucy
    deconvolution). The default ``stopping="cv"`` therefore picks the number
    of iterations by two-fold cross-validation: the reports are split at
    random into two halves (binomial thinning of the counts); IBU runs on each
    half and scores the held-out half's log-likelihood under its predicted
    report distribution after every iteration; the iteration count that
    maximises the summed held-out score is then run on all reports. The
    curves are followed until the best score is ``patience`` iterations old
    (at least 25, at least the best count itself) or IBU has converged.
    ``stopping="tolerance"`` runs until no frequency changes by more than
    ``tol`` (or ``max_iter``), which is the plain maximum-likelihood estimate.

    Parameters
    ----------
    stopping : {"cv", "tolerance"}
    tol : float
        Convergence threshold on the largest change of a frequency in one step.
    max_iter : int
        Iteration cap.
    seed : int
        Seed of the cross-validation split (estimates are reproducible).

    Attributes
    ----------
    frequencies_, n_iter_, converged_, log_likelihood_,
    log_likelihood_history_ (one value per iteration, on all reports),
    cv_scores_ (held-out score per iteration, ``stopping="cv"`` only).
    """

    def __init__(
        self,
        *,
        stopping: str = "cv",
        tol: float = 1e-9,
        max_iter: int = 10_000,
        seed: int = 0,
        record_history: bool = False,
    ):
        if stopping not in STOPPING:
            raise ValueError(f"stopping must be one of {STOPPING}, got {stopping!r}")
        if not (tol >= 0 and np.isfinite(tol)):
            raise ValueError(f"tol must be finite and >= 0, got {tol!r}")
        if int(max_iter) < 1:
            raise ValueError(f"max_iter must be >= 1, got {max_iter!r}")
        self.stopping = stopping
        self.tol = tol
        self.max_iter = int(max_iter)
        self.seed = seed
        self.record_history = record_history

    def _run(self, counts, channel, n_iter: int | None):
        """IBU on ``counts`` for ``n_iter`` steps, or until converged if ``None``.

        Returns the steps (their estimate and its report distribution), the
        steps taken, whether it converged, and the log-likelihood history.
        """
        steps = _steps(channel, counts)
        limit = self.max_iter if n_iter is None else n_iter
        history = []
        if self.record_history:
            taken, change = 0, np.inf
            while taken < limit and not change <= self.tol:
                change = steps.advance(1, self.tol)[1]
                taken += 1
                history.append(log_likelihood(counts, steps.predicted))
        else:
            taken, change = steps.advance(limit, self.tol)
        return steps, taken, bool(change <= self.tol), history

    def _cross_validate(self, counts, channel) -> tuple[int, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        first = rng.binomial(counts.astype(np.int64), 0.5).astype(float)
        halves = (first, counts - first)
        if min(h.sum() for h in halves) == 0:
            return 1, np.zeros(1)
        steps = [_steps(channel, half) for half in halves]
        scores = []
        best = 0
        for step in range(self.max_iter):
            score = 0.0
            change = 0.0
            for train, held_out in zip(steps, halves[::-1], strict=True):
                change = max(change, train.advance(1, self.tol)[1])
                score += log_likelihood(held_out, train.predicted)
            scores.append(score)
            if score > scores[best]:
                best = step
            if change <= self.tol or step - best >= max(25, best):
                break
        return best + 1, np.asarray(scores)

    def fit(self, counts, channel, n_iter: int | None = None) -> IBU:
        """Estimate from ``counts``; ``n_iter`` forces a fixed number of iterations."""
        counts = _as_counts(counts, channel)
        self.n_ = counts.sum()
        self.cv_scores_ = None
        if n_iter is None and self.stopping == "cv":
            n_iter, self.cv_scores_ = self._cross_validate(counts, channel)
        steps, taken, converged, history = self._run(counts, channel, n_iter)
        self.frequencies_ = steps.p.copy()
        self.n_iter_ = taken
        # With a chosen iteration count, reaching it is the stopping rule firing.
        self.converged_ = converged or n_iter is not None
        self.log_likelihood_ = log_likelihood(counts, steps.predicted)
        self.log_likelihood_history_ = np.asarray(history)
        return self
