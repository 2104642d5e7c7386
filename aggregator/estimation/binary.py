"""Randomized response's default: the posterior median of the respondents' share.

Binary randomized response (k-RR over two labels) reports each user's answer, flipped with
probability ``q = p_other``. Of ``n`` respondents, ``m`` hold the second label (``yes``); its
report count is ``c = m + A - B`` with ``A ~ Binomial(n - m, q)`` (other answers flipped to it)
and ``B ~ Binomial(m, q)`` (its own flipped away). Whatever ``m``, ``c`` varies by
``n q (1 - q)``: the mechanism's noise alone, since the respondents are given (the share a
dashboard shows is theirs, not a population's).

:class:`RRPosteriorMedian` takes the median of ``m`` given ``c`` under a flat prior on
``0..n``:

* where the count's noise is small (``n q (1 - q)`` at most :data:`EXACT_MAX_VARIANCE`), on
  the exact likelihood above. At a high epsilon most reports equal their user's answer, and
  the median keeps the count where no flip is the likeliest explanation: the unbiased
  inversion ``(c / n - q) / (1 - 2q)`` moves every estimate by a fraction of a report that
  is mostly not there (at epsilon 6 with 1,000 users, 2.7 times the raw shares' error for
  IBU stopped by cross-validation, the earlier default);
* elsewhere, on its normal approximation (the same variance whatever ``m``): the inversion,
  kept within ``[0, n]`` as the median of the truncated normal.

It is then mixed with the raw report shares. Their share ``c / n`` is biased by
``q (1 - 2p)`` for a true share ``p`` and its noise is the inversion's times ``1 - 2q``, so
the mix ``w c / n + (1 - w) p_inv`` has squared error
``w^2 q^2 (1 - 2p)^2 + (1 - 2 q w)^2 V`` (``V`` the inversion's variance). With the noise
term to first order in ``w``, ``V (1 - 4 q w)``, it is least at ``w = 2V / (q (1 - 2p)^2)``,
more weight on the raw shares than the exact optimum ``2V / (q ((1 - 2p)^2 + 4V))``. Near
``p = 1/2`` the raw shares are nearly unbiased and far less noisy than any correction for the
noise, which cannot then be better than them; the weight takes ``(1 - 2p)^2`` at the least
the reports allow, :data:`BIAS_STANDARD_ERRORS` standard errors below its estimate, so that
it leans to the raw shares unless the reports show their bias. docs/estimation.md gives the
figures, and those of the exact optimum (further from the raw shares near one half).
"""

from __future__ import annotations

import numpy as np
from scipy import special, stats

from aggregator.estimation import budget
from aggregator.estimation.channels import KRRChannel, log_likelihood
from shared.mechanisms import KRR

# Above this variance of the count (a standard deviation of 20 reports) the likelihood is
# taken as normal; at or below it, exact. The exact one costs about (24 sd / (1 - 2q)) x
# (n q + 12 sd) terms: at most about 1,600 x 1,000.
EXACT_MAX_VARIANCE = 400.0
# How far into the tails the exact likelihood is summed, in standard deviations.
TAIL_SD = 12.0
# The raw shares' bias is taken this many standard errors below its estimate.
BIAS_STANDARD_ERRORS = 2.0


def is_binary(subject) -> bool:
    """Whether ``subject`` (a channel, or the mechanism it is built from) is k-RR over two
    labels (randomized response), where :class:`RRPosteriorMedian` runs."""
    return isinstance(subject, (KRRChannel, KRR)) and subject.n_inputs == 2


class RRPosteriorMedian:
    """The posterior median of the respondents' share under a flat prior, mixed with the raw
    report shares (module docstring).

    Attributes
    ----------
    frequencies_, n_iter_ and converged_ (None: nothing iterates), log_likelihood_,
    warnings_, median_ (the posterior median's shares), raw_weight_ (the raw shares' part),
    exact_ (whether the exact likelihood was used), degenerate_ (why the estimate is the raw
    shares whatever the counts, or None).
    """

    def fit(self, counts, channel) -> RRPosteriorMedian:
        if not is_binary(channel):
            raise TypeError(
                "the posterior median is for randomized response (k-RR over two labels)"
            )
        counts = np.asarray(counts, dtype=float)
        if counts.shape != (2,):
            raise ValueError(f"expected 2 counts, got shape {counts.shape}")
        if np.any(counts < 0) or not np.all(np.isfinite(counts)) or counts.sum() <= 0:
            raise ValueError("counts must be finite, non-negative and not all zero")
        n = float(counts.sum())
        raw = counts / n
        q = float(channel.p_other)
        slope = float(channel.p_keep - channel.p_other)
        # Computed for the label with fewer reports and mirrored: both labels are treated alike.
        low = int(np.argmin(counts))
        # The exact likelihood is of whole counts.
        whole = bool(np.all(counts == np.round(counts)))
        self.exact_ = whole and n * q * (1.0 - q) <= EXACT_MAX_VARIANCE
        # Where the reports say nothing about the answers, or are them: the raw shares.
        self.degenerate_ = (
            "the reports say nothing about the answers"
            if slope <= 0.0
            else "the mechanism flips no answer"
            if q <= 0.0
            else None
        )
        if self.degenerate_ is None:
            self.raw_weight_ = raw_weight(counts[low], n, q, slope)
            share = self._median(counts[low], n, q, slope)
        else:
            self.raw_weight_, share = 1.0, raw[low]
        self.median_ = np.empty(2)
        self.median_[low], self.median_[1 - low] = share, 1.0 - share
        self.frequencies_ = self.raw_weight_ * raw + (1.0 - self.raw_weight_) * self.median_
        self.n_iter_ = self.converged_ = None
        self.log_likelihood_ = log_likelihood(counts, channel.forward(self.frequencies_))
        self.warnings_: list[str] = []
        return self

    def _median(self, c: float, n: float, q: float, slope: float) -> float:
        """The posterior median of the share ``m / n`` given ``c`` reports of the label."""
        variance = n * q * (1.0 - q)
        centre = (c - n * q) / slope  # the inversion, in users
        sd_m = np.sqrt(variance) / slope
        if not self.exact_:
            truncated = stats.truncnorm.median(-centre / sd_m, (n - centre) / sd_m, centre, sd_m)
            return float(truncated) / n
        # Users within TAIL_SD standard deviations of the inversion, at least as wide a window
        # inside [0, n] where the inversion is outside it.
        width = int(np.ceil(2.0 * TAIL_SD * sd_m)) + 4
        lo = int(np.clip(np.floor(centre - TAIL_SD * sd_m) - 2, 0, n))
        hi = int(np.clip(np.ceil(centre + TAIL_SD * sd_m) + 2, 0, n))
        lo, hi = min(lo, max(0, hi - width)), max(hi, min(int(n), lo + width))
        m = np.arange(lo, hi + 1)
        flipped_most = int(np.ceil(m[-1] * q + TAIL_SD * np.sqrt(variance) + 2))
        b = np.arange(min(flipped_most, int(m[-1])) + 1)  # the label's own answers flipped away
        budget.charge(2 * m.size * b.size)
        own = stats.binom.logpmf(b[None, :], m[:, None], q)
        other = stats.binom.logpmf(c - m[:, None] + b[None, :], n - m[:, None], q)
        log_likelihood = special.logsumexp(own + other, axis=1)
        posterior = np.exp(log_likelihood - log_likelihood.max())
        cumulative = np.cumsum(posterior) / posterior.sum()
        return float(m[np.searchsorted(cumulative, 0.5)]) / n

    def describe(self) -> str:
        """What the last :meth:`fit` ran, in words (for the estimate API's ``estimator``)."""
        if self.degenerate_ is not None:
            return f"raw report shares ({self.degenerate_})"
        likelihood = "exact likelihood" if self.exact_ else "normal likelihood"
        text = (
            "the posterior median of the respondents' share under a flat prior "
            f"({likelihood} of the mechanism's flips)"
        )
        if self.raw_weight_ == 0.0:
            return text
        if self.raw_weight_ == 1.0:
            return (
                "raw report shares (the reports do not rule out shares near one half, where "
                "they are nearly unbiased and less noisy than " + text + ")"
            )
        return (
            f"{1.0 - self.raw_weight_:.0%} " + text + f", {self.raw_weight_:.0%} the raw report "
            "shares (weighted by the least bias of theirs the reports allow)"
        )


def raw_weight(c: float, n: float, q: float, slope: float) -> float:
    """The raw report shares' weight in the mix with the posterior median (module docstring)."""
    variance = q * (1.0 - q) / (n * slope * slope)  # the inversion's
    if variance == 0.0:  # no flips: the reports are the answers
        return 1.0
    inversion = (c / n - q) / slope
    apart = max(abs(1.0 - 2.0 * inversion) - 2.0 * BIAS_STANDARD_ERRORS * np.sqrt(variance), 0.0)
    if q * apart * apart <= 2.0 * variance:
        return 1.0
    return float(2.0 * variance / (q * apart * apart))
