"""The posterior median of each category's users: randomized response's default, and k-RR's and
the geometric mechanism's at a high epsilon.

k-RR reports each user's category, kept with probability ``p_keep`` and otherwise replaced by
one of the others. Of ``n`` respondents, ``m`` hold a category; its report count is
``c = m - B + A`` with ``B ~ Binomial(m, q_out)`` (its users' reports moved away,
``q_out = 1 - p_keep``) and ``A ~ Binomial(n - m, q_in)`` (the other users' reports moved to
it, ``q_in = p_other``). Randomized response is k-RR over two labels, where
``q_in = q_out``. Whatever ``m``, ``c`` varies by ``m q_out (1 - q_out) + (n - m) q_in
(1 - q_in)``: the mechanism's noise alone, since the respondents are given (the share a
dashboard shows is theirs, not a population's).

:class:`PosteriorMedian` takes, for each category, the median of ``m`` given ``c`` under a
flat prior on ``0..n``:

* where the count's noise is small (at most :data:`EXACT_MAX_VARIANCE` for the ``m`` it may
  be), on the exact likelihood above. At a high epsilon most reports equal their user's answer, and the
  median keeps the count where no change is the likeliest explanation: the unbiased inversion
  ``(c / n - q_in) / (1 - q_in - q_out)`` moves every estimate by a fraction of a report that
  is mostly not there (for randomized response at epsilon 6 with 1,000 users, IBU stopped by
  cross-validation, the earlier default, had 2.7 times the raw shares' error);
* elsewhere, on its normal approximation (with the variance at the inversion): the
  inversion, kept within ``[0, n]`` as the median of the truncated normal.

Each is then mixed with the category's raw report share and the mix renormalised. The raw
share ``c / n`` is biased by ``q_in - s p`` for a true share ``p`` (``s = q_in + q_out``) and
its noise is the inversion's times ``1 - s``, so the mix ``w c / n + (1 - w) p_inv`` has
squared error ``w^2 (q_in - s p)^2 + (1 - s w)^2 V`` (``V`` the inversion's variance). With
the noise term to first order in ``w``, ``V (1 - 2 s w)``, it is least at
``w = s V / (q_in - s p)^2``, more weight on the raw share than the exact optimum. Near
``p = q_in / s`` (one half for randomized response, ``1 / k`` for k-RR) the raw share is
nearly unbiased and far less noisy than any correction for the noise, which cannot then be
better than it; the weight takes the bias at the least the reports allow,
:data:`BIAS_STANDARD_ERRORS` standard errors below its estimate, so that it leans to the raw
share unless the reports show its bias. docs/estimation.md gives the figures.

Over three categories or more the service takes this only at a high epsilon
(:func:`estimators.default_method`): with more noise, a prior fitted to all the counts
(empirical Bayes) pools what the categories have in common, which a flat prior per category
cannot.

The geometric mechanism moves a report to the values near its user's, so the reports moving
to a value come from its neighbours, in numbers that depend on theirs. Each value is taken as
above with its own ``q_out`` (the mechanism's chance of moving a report off it, smaller at the
range's ends, where the noise is clamped) and ``q_in`` (the share of the other users' reports
that move to it), the latter with the other values' users at the raw report shares, then at the
medians (:data:`PLUG_IN_ROUNDS`). At a high epsilon, where a report moves at most one value
away, few reports move at all and this is what the counts support; the service takes it there
(docs/estimation.md).
"""

from __future__ import annotations

import numpy as np
from scipy import special, stats

from aggregator.estimation import budget
from aggregator.estimation.channels import KRRChannel, log_likelihood, report_counts
from aggregator.estimation.ordinal import GeometricChannel
from shared.mechanisms import KRR, Geometric

# Above this variance of a count (a standard deviation of 20 reports) the likelihood is taken
# as normal; at or below it, exact. The exact one sums about (12 sd / (1 - s)) x
# (m q_out + 6 sd) terms per distinct count (far fewer for a small category at a high
# epsilon, whose count varies by a report or two) ...
EXACT_MAX_VARIANCE = 400.0
# ... and at most this many (about 16 MB per array of them; randomized response's widest,
# about 1,600 users at an epsilon of 0.25, has 1.3 million). Over many categories at a low
# epsilon, where a count says little about its users, the window spans most of 0..n.
EXACT_MAX_TERMS = 2_000_000
# ... and over all the distinct counts at most this many (about 0.3 s), the smallest sums first,
# for at most this many counts (each a step of its own: about 0.1 ms even when small).
EXACT_MAX_TOTAL_TERMS = 10_000_000
EXACT_MAX_COUNTS = 2000
# How far into the tails the exact likelihood is summed, in standard deviations (over 1,815
# random counts and flips the median was the same at 12; so were the sweeps' figures).
TAIL_SD = 6.0
# The raw shares' bias is taken this many standard errors below its estimate.
BIAS_STANDARD_ERRORS = 2.0
# The geometric mechanism: the other values' users are taken at the raw report shares, then at
# the medians, this many times in all.
PLUG_IN_ROUNDS = 2


def is_binary(subject) -> bool:
    """Whether ``subject`` (a channel, or the mechanism it is built from) is k-RR over two
    labels (randomized response), where :class:`PosteriorMedian` is the default at every
    epsilon; or the geometric mechanism over two values, which is randomized response with
    ``q = a / (1 + a)``."""
    return takes_posterior_median(subject) and subject.n_inputs == 2


def takes_posterior_median(subject) -> bool:
    """Whether ``subject`` (a channel, or the mechanism it is built from) is k-RR or the
    geometric mechanism, which :class:`PosteriorMedian` estimates."""
    return isinstance(subject, (KRRChannel, KRR, GeometricChannel, Geometric))


def noise_share(subject) -> float:
    """The mechanism's share of the report counts' variance with every share ``1 / k``: its
    noise given the users, against that of users drawn from a population (the multinomial's,
    ``1 - 1 / k`` in all). Near 0 at a high epsilon, where the reports are nearly the users'
    own answers. For k-RR or the geometric mechanism (``subject`` a channel or the mechanism);
    the geometric mechanism's is taken away from the range's ends, where it is largest.

    The noise of the reports of the users holding ``x`` is ``1 - sum_y C[x, y]^2`` in all: for
    k-RR ``1 - p_keep^2 - (k - 1) p_other^2``, for the geometric mechanism's interior
    ``1 - ((1 - a) / (1 + a))^2 (1 + a^2) / (1 - a^2)`` (``a = exp(-epsilon)``).
    """
    k = subject.n_inputs
    if isinstance(subject, (GeometricChannel, Geometric)):
        a = subject.alpha
        noise = 1.0 - ((1.0 - a) / (1.0 + a)) ** 2 * (1.0 + a * a) / (1.0 - a * a)
    else:
        noise = 1.0 - subject.p_keep**2 - (k - 1) * subject.p_other**2
    return float(noise / (1.0 - 1.0 / k)) if k > 1 else 0.0


class PosteriorMedian:
    """Each category's posterior median under a flat prior, mixed with its raw report share
    (module docstring).

    Attributes
    ----------
    frequencies_, n_iter_ and converged_ (None: nothing iterates), log_likelihood_,
    warnings_, median_ (the posterior medians' shares, before the mix), raw_weight_ (each
    category's raw share's part in the mix), exact_ (for each category, whether its median
    is on the exact likelihood), degenerate_ (why the estimate is the raw shares whatever the
    counts, or None), geometric_ (whether the channel was the geometric mechanism's), moves_
    (for the geometric mechanism, each value's ``q_in`` and ``q_out`` as last taken, which
    its intervals map the report shares through; None for k-RR, whose are the channel's).
    """

    def fit(self, counts, channel) -> PosteriorMedian:
        if not takes_posterior_median(channel):
            raise TypeError(
                "the posterior median is for k-RR and the geometric mechanism, "
                f"got {type(channel).__name__}"
            )
        counts = report_counts(counts, channel)
        n = float(counts.sum())
        raw = counts / n
        geometric = self.geometric_ = isinstance(channel, GeometricChannel)
        self.moves_: tuple[np.ndarray, np.ndarray] | None = None
        # Where the reports say nothing about the answers, or are them: the raw shares.
        self.degenerate_ = (
            "the mechanism changes no answer"
            if (channel.alpha if geometric else channel.p_other) <= 0.0 or counts.size == 1
            else "the reports say nothing about the answers"
            if not geometric and channel.p_keep <= channel.p_other
            else None
        )
        if self.degenerate_ is None and geometric:
            # The reports moved to each value are taken from the other values' users at the
            # raw shares, then at the medians.
            self.median_ = raw
            for _ in range(PLUG_IN_ROUNDS):
                q_in, q_out = geometric_moves(channel, self.median_)
                users, self.exact_ = medians(counts, n, q_in, q_out)
                self.median_ = users / users.sum() if users.sum() > 0 else raw
            # The raw shares' bias and the inversion's variance: the channel's own, whose
            # inverse mixes each value with its neighbours' noise.
            inversion = channel.solve_with_info(raw)[0]
            variance = np.maximum(channel.inversion_second_moment(raw) - inversion**2, 0.0) / n
            bias = channel.forward(inversion) - inversion
            self.raw_weight_ = least_bias_weights(bias, variance, q_in + q_out)
            self.moves_ = (q_in, q_out)
        elif self.degenerate_ is None:
            other, moved = float(channel.p_other), float(1.0 - channel.p_keep)
            self.raw_weight_ = raw_weights(counts, n, other, moved)
            distinct, row_of = np.unique(counts, return_inverse=True)
            users, exact = medians(distinct, n, other, moved)
            self.median_, self.exact_ = users[row_of] / n, exact[row_of]
        else:
            self.raw_weight_, self.median_ = np.ones(counts.size), raw
            self.exact_ = np.zeros(counts.size, dtype=bool)
            if geometric:  # no moves: the intervals are the report shares'
                self.moves_ = (np.zeros(counts.size), np.zeros(counts.size))
        mixed = self.raw_weight_ * raw + (1.0 - self.raw_weight_) * self.median_
        self.frequencies_ = mixed / mixed.sum()
        self.n_iter_ = self.converged_ = None
        self.log_likelihood_ = log_likelihood(counts, channel.forward(self.frequencies_))
        self.warnings_: list[str] = []
        return self

    def describe(self) -> str:
        """What the last :meth:`fit` ran, in words (for the estimate API's ``estimator``)."""
        if self.degenerate_ is not None:
            return f"raw report shares ({self.degenerate_})"
        likelihood = (
            "exact likelihood"
            if self.exact_.all()
            else "normal likelihood"
            if not self.exact_.any()
            else "exact likelihood for the smaller counts, normal for the others"
        )
        if self.geometric_:
            text = (
                "the posterior median of each value's respondents under a flat prior "
                f"({likelihood} of the mechanism's moves, those from the other values taken "
                "at their medians)"
            )
        else:
            text = (
                "the posterior median of each category's respondents under a flat prior "
                f"({likelihood} of the mechanism's changes)"
            )
        unit = "value" if self.geometric_ else "category"
        low, high = float(self.raw_weight_.min()), float(self.raw_weight_.max())
        if high == 0.0:
            return text
        if low == 1.0:
            return (
                "raw report shares (the reports do not rule out shares where they are nearly "
                "unbiased and less noisy than " + text + ")"
            )
        weighted = "weighted by the least bias of theirs the reports allow"
        if f"{low:.0%}" == f"{high:.0%}":  # as the words will say them
            return f"{1.0 - low:.0%} " + text + f", {low:.0%} the raw report shares ({weighted})"
        return (
            text + f", mixed with the raw report shares by {unit} ({low:.0%} to {high:.0%} "
            f"of each; {weighted})"
        )


def geometric_moves(channel: GeometricChannel, shares: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each value's ``q_in`` and ``q_out`` under the geometric mechanism, the users' values
    at ``shares``: the share of the other users' reports that move to it, and the chance that a
    report of its own moves off it (``2a / (1 + a)`` inside the range, ``a / (1 + a)`` at its
    ends, where the noise is clamped)."""
    stay = channel.diagonal()
    others = 1.0 - shares
    arriving = channel.forward(shares) - shares * stay
    q_in = np.divide(arriving, others, out=np.zeros(stay.size), where=others > 0.0)
    return np.clip(q_in, 0.0, 1.0), 1.0 - stay


def medians(counts: np.ndarray, n: float, q_in, q_out) -> tuple[np.ndarray, np.ndarray]:
    """The posterior median of the users holding a category with each of ``counts`` reports,
    and whether it is on the exact likelihood (module docstring); ``q_in`` and ``q_out`` are
    one for all the counts or one per count."""
    q_in, q_out = np.broadcast_to(q_in, counts.shape), np.broadcast_to(q_out, counts.shape)
    slope = 1.0 - q_in - q_out
    centre = (counts - n * q_in) / slope  # the inversion, in users

    def variance(users: np.ndarray) -> np.ndarray:  # a count's, given its users
        users = np.clip(users, 0.0, n)
        return users * q_out * (1.0 - q_out) + (n - users) * q_in * (1.0 - q_in)

    # The posterior's window reaches TAIL_SD standard deviations beyond the inversion, where
    # the variance is larger if the category's own reports move more often than others' come.
    at_centre = reach = variance(centre)
    for _ in range(2):
        reach = np.maximum(reach, variance(centre + TAIL_SD * np.sqrt(reach) / slope))
    sd = np.sqrt(reach)
    # Users within TAIL_SD standard deviations of the inversion, at least as wide a window
    # inside [0, n] where the inversion is outside it; and the reports moved away from them.
    width = np.ceil(2.0 * TAIL_SD * sd / slope) + 4.0
    lo = np.clip(np.floor(centre - TAIL_SD * sd / slope) - 2.0, 0.0, n)
    hi = np.clip(np.ceil(centre + TAIL_SD * sd / slope) + 2.0, 0.0, n)
    lo, hi = np.minimum(lo, np.maximum(0.0, hi - width)), np.maximum(hi, np.minimum(n, lo + width))
    moved = np.minimum(np.ceil(hi * q_out + TAIL_SD * sd + 2.0), hi)
    terms = (hi - lo + 1.0) * (moved + 1.0)
    # The exact likelihood is of whole counts.
    exact = (
        (reach <= EXACT_MAX_VARIANCE) & (terms <= EXACT_MAX_TERMS) & (counts == np.round(counts))
    )
    order = np.argsort(np.where(exact, terms, np.inf), kind="stable")
    exact[order[np.cumsum(np.where(exact, terms, 0.0)[order]) > EXACT_MAX_TOTAL_TERMS]] = False
    exact[order[EXACT_MAX_COUNTS:]] = False
    users = np.empty(counts.size)
    for i in np.flatnonzero(exact):
        m, b = np.arange(int(lo[i]), int(hi[i]) + 1), np.arange(int(moved[i]) + 1)
        users[i] = _exact_median(counts[i], n, q_in[i], q_out[i], m, b)
    # Elsewhere at the inversion's variance: the inversion, kept within [0, n] (no noise: the
    # inversion itself).
    sd = np.sqrt(at_centre) / slope
    normal = ~exact & (sd > 0.0)
    at, sd_m = centre[normal], sd[normal]
    users[normal] = stats.truncnorm.median(-at / sd_m, (n - at) / sd_m, at, sd_m)
    still = ~exact & ~normal
    users[still] = np.clip(centre[still], 0.0, n)
    return users, exact


def _exact_median(
    c: float, n: float, q_in: float, q_out: float, m: np.ndarray, b: np.ndarray
) -> float:
    """The posterior median of a category's users given its ``c`` reports on the exact
    likelihood, over the users ``m`` and their reports moved away ``b`` it may be."""
    budget.charge(2 * m.size * b.size)
    # log P(b moved away | m) + log P(c - m + b moved to it | n - m): a term in m, one in b and
    # one in b - m, each computed once along its axis.
    in_m = special.gammaln(m + 1.0) + special.gammaln(n - m + 1.0)
    in_b = _where(
        b <= n - c,
        lambda b: (
            special.xlogy(b, q_out)
            + special.xlog1py(n - c - b, -q_in)
            - special.gammaln(b + 1.0)
            - special.gammaln(n - c - b + 1.0)
        ),
        b,
    )
    d = np.arange(-m[-1], b[-1] - m[0] + 1)  # b - m
    in_d = _where(
        (d <= 0) & (c + d >= 0),
        lambda d: (
            special.xlogy(c + d, q_in)
            + special.xlog1py(-d, -q_out)
            - special.gammaln(1.0 - d)
            - special.gammaln(c + d + 1.0)
        ),
        d,
    )
    terms = in_m[:, None] + in_b[None, :] + in_d[b[None, :] - m[:, None] - d[0]]
    log_likelihood = special.logsumexp(terms, axis=1)
    posterior = np.exp(log_likelihood - log_likelihood.max())
    cumulative = np.cumsum(posterior) / posterior.sum()
    return float(m[np.searchsorted(cumulative, 0.5)])


def _where(inside: np.ndarray, term, values: np.ndarray) -> np.ndarray:
    """``term(values)`` where ``inside``, ``-inf`` elsewhere (a log-probability of 0)."""
    out = np.full(values.shape, -np.inf)
    out[inside] = term(values[inside].astype(float))
    return out


def raw_weights(counts: np.ndarray, n: float, q_in, q_out) -> np.ndarray:
    """Each category's raw report share's weight in the mix with its posterior median
    (module docstring); ``q_in`` and ``q_out`` as for :func:`medians`."""
    q_in, q_out = np.broadcast_to(q_in, counts.shape), np.broadcast_to(q_out, counts.shape)
    spread = q_in + q_out
    slope = 1.0 - spread
    inversion = (counts / n - q_in) / slope
    at = np.clip(inversion, 0.0, 1.0)
    variance = (at * q_out * (1.0 - q_out) + (1.0 - at) * q_in * (1.0 - q_in)) / (n * slope**2)
    return least_bias_weights(q_in - spread * inversion, variance, spread)


def least_bias_weights(bias: np.ndarray, variance: np.ndarray, spread: np.ndarray) -> np.ndarray:
    """The raw shares' weights ``s V / b^2`` (at most 1) in the mix with an estimate, given
    their estimated ``bias``, the inversion's ``variance`` and the moves' ``spread``
    (``q_in + q_out``), with ``b`` the bias :data:`BIAS_STANDARD_ERRORS` standard errors
    (``s sqrt(V)``) below its estimate (module docstring)."""
    least = np.maximum(np.abs(bias) - BIAS_STANDARD_ERRORS * spread * np.sqrt(variance), 0.0)
    weights = np.ones(bias.size)
    apart = least * least > spread * variance  # elsewhere the raw share alone
    weights[apart] = spread[apart] * variance[apart] / (least[apart] * least[apart])
    return weights
