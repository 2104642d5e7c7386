"""Empirical Bayes for k-RR: a nonparametric prior on the category shares (k-RR's default).

A k-RR category's report count is ``Binomial(n, q_x)`` with
``q_x = p_other + (p_keep - p_other) p_x``. Treating the ``k`` shares as draws
from an unknown distribution ``G`` on [0, 1], :class:`KRREmpiricalBayes`
estimates ``G`` on a grid of atoms (0, log-spaced values up to 1, and atoms as
fine as the reports measure the shares where they lie: :func:`prior_atoms`) by
maximising the marginal likelihood ``sum_x log sum_j w_j Binom(c_x | n, q(t_j))``
over the weights ``w`` (EM on the weights: Kiefer and Wolfowitz's
nonparametric maximum likelihood, "g-modelling"; Jiang and Zhang, Annals of
Statistics 2009; Koenker and Mizera, JASA 2014), then takes each category's
posterior mean ``E[p_x | c_x]`` under it, renormalised to sum to 1.

The shares estimated are those of the users who reported, so the posterior
means are taken under the mechanism's noise alone
(:func:`participant_likelihoods`; a second prior is fitted under it), not under
the binomial above, which also counts the drawing of the users from a
population: at a high epsilon, where the reports are nearly the users' own
answers, the binomial's wider noise pooled shares the reports had measured apart.

It shrinks adaptively (towards a common value, towards 0 for the empty
categories of a spiky truth, barely for well-measured large shares) and, where
the reports carry signal, it beat hindsight-best IBU in the benchmark; where
they carry little (near-uniform shares at epsilon 1 or below), the prior
fitted to ``k`` noisy counts is too dispersed, and the estimate's mean total
variation was 2-3 times the raw report shares' (up to 10 times in a seed).
``blend=(low, high)`` guards that case: with ``g`` the log-likelihood ratio of the fitted prior over a
homogeneous population (every share ``1 / k``; in the binomial model), the estimate is the raw
shares when ``g <= low``, the posterior mean when ``g >= high``, and their
linear mix between. The service's default for k-RR over three categories or
more is ``blend=(5, 15)`` (:func:`estimators.default_estimator`);
docs/estimation.md gives the figures.

Categories with equal counts share a likelihood row, so one EM step costs
``(distinct counts) x atoms`` (two priors: twice the steps); every step is charged to the work budget
(:mod:`aggregator.estimation.budget`) at that many units.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import binom

from aggregator.estimation import budget
from aggregator.estimation.channels import KRRChannel, log_likelihood, report_counts

DEFAULT_ATOMS = 300
DEFAULT_EM_STEPS = 300
# The smallest non-zero atom, as a fraction of 1 / max(n, k): below it a share is 0 in effect.
SMALLEST_ATOM = 1e-3
# Atoms added where the report shares lie, this many of a count's standard deviations apart,
# reaching this many beyond the smallest and the largest share; at most MAX_FINE_ATOMS of them
# (wider apart if the span needs more).
FINE_SPACING_SD = 0.25
FINE_REACH_SD = 5.0
MAX_FINE_ATOMS = 1000
# The least variance of a count (a count is an integer: half a report's standard deviation).
MIN_COUNT_VARIANCE = 0.25
# Counts up to this get their exact likelihood under the mechanism's noise alone (larger ones a
# normal one): participant_likelihoods.
EXACT_COUNT_MAX = 30
NOISE_MODELS = ("participants", "multinomial")
# EM steps between two budget checks.
CHUNK_STEPS = 32


def atom_likelihoods(
    counts: np.ndarray, n: float, channel: KRRChannel, atoms: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each count's binomial likelihood (``n`` reports, without the binomial coefficient,
    which cancels) at each atom's share: a row per count, scaled so that its largest entry
    is 1, and each row's log scale."""
    q = channel.p_other + (channel.p_keep - channel.p_other) * atoms
    q = np.clip(q, np.finfo(float).tiny, 1.0 - 1e-16)
    log_rows = counts[:, None] * np.log(q) + (n - counts)[:, None] * np.log1p(-q)
    shift = log_rows.max(axis=1)
    return np.exp(log_rows - shift[:, None]), shift


def prior_atoms(
    counts: np.ndarray, channel: KRRChannel, atoms: int, *, fine: bool = True
) -> np.ndarray:
    """The shares the prior may put weight on: 0, ``atoms - 1`` log-spaced values from
    ``SMALLEST_ATOM / max(n, k)`` to 1, and atoms as fine as the reports measure the shares
    where those lie (without ``fine``, the log-spaced ones alone).

    The log-spaced ones are 5-7% of their value apart (more with more reports), while with
    many reports at a high epsilon a share is measured to a small fraction of that: a prior
    confined to them moves every estimate onto its nearest atom. A count's share ``c / n`` has
    a standard deviation of ``1 / (2 sqrt(n))`` on the scale ``arcsin(sqrt(c / n))``, whatever
    its value, so the fine atoms are evenly spaced on that scale.
    """
    n, k = counts.sum(), counts.size
    coarse = np.concatenate([[0.0], np.geomspace(SMALLEST_ATOM / max(n, k), 1.0, atoms - 1)])
    if not fine:
        return coarse
    sd = 0.5 / np.sqrt(n)
    shares = counts / n
    lowest = max(_angle(shares.min()) - FINE_REACH_SD * sd, _angle(channel.p_other))
    highest = min(_angle(shares.max()) + FINE_REACH_SD * sd, _angle(channel.p_keep))
    if highest <= lowest:
        return coarse
    step = max(FINE_SPACING_SD * sd, (highest - lowest) / MAX_FINE_ATOMS)
    added = (np.sin(np.arange(lowest, highest, step)) ** 2 - channel.p_other) / (
        channel.p_keep - channel.p_other
    )
    return np.unique(np.concatenate([coarse, added[(added > 0) & (added < 1)]]))


def participant_atoms(atoms: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The atoms the users' prior is fitted on for ``counts``: where some count's likelihood is
    exact (:func:`exact_counts`; it is on whole numbers of users), ``atoms`` rounded to whole
    users and every number of users up to :data:`EXACT_COUNT_MAX`; else ``atoms`` unchanged."""
    n = round(float(counts.sum()))
    if not np.any(exact_counts(counts)):
        return atoms
    users = np.concatenate([np.rint(atoms * n), np.arange(min(n, EXACT_COUNT_MAX) + 1)])
    return np.unique(users) / n


def exact_counts(counts: np.ndarray) -> np.ndarray:
    """Which ``counts`` get their exact likelihood: whole numbers up to :data:`EXACT_COUNT_MAX`
    (counts given as fractions, from weighted reports, keep the normal one)."""
    return (counts <= EXACT_COUNT_MAX) & (counts == np.rint(counts))


def participant_likelihoods(
    counts: np.ndarray, n: float, channel: KRRChannel, atoms: np.ndarray
) -> np.ndarray:
    """Each count's likelihood at each atom taken as the share of the users who reported, not
    of a population they were drawn from: a row per count, scaled so that its largest entry
    is 1.

    With ``u = n t`` of the ``n`` users in the category, its count is
    ``Binomial(u, p_keep) + Binomial(n - u, p_other)``, whose variance
    ``n (t p_keep (1 - p_keep) + (1 - t) p_other (1 - p_other))`` is only the mechanism's: at a
    high epsilon it is far below the multinomial's ``n q (1 - q)``, which also counts the
    drawing of the users. Whole counts up to :data:`EXACT_COUNT_MAX` get that sum's exact
    probability (``u`` rounded to whole users; use :func:`participant_atoms`): a count of 0, 1
    or 2 is far from normal, and the normal curve, which gives a count of 1 much the same
    likelihood from no user (a stray report) as from one, put shares of a fraction of a user
    on the many categories a few users or stray reports fall in. Larger counts are taken as
    normal with that mean and variance (at least :data:`MIN_COUNT_VARIANCE`).
    """
    rows = np.empty((counts.size, atoms.size))
    small = exact_counts(counts)
    if not np.all(small):
        keep, other = channel.p_keep, channel.p_other
        mean = n * (other + (keep - other) * atoms)
        variance = n * (atoms * keep * (1.0 - keep) + (1.0 - atoms) * other * (1.0 - other))
        variance = np.maximum(variance, MIN_COUNT_VARIANCE)
        log_rows = -0.5 * (counts[~small, None] - mean) ** 2 / variance - 0.5 * np.log(variance)
        rows[~small] = np.exp(log_rows - log_rows.max(axis=1)[:, None])
    if np.any(small):
        exact = exact_count_log_probabilities(int(counts[small].max()), n, channel, atoms)
        exact = exact[:, counts[small].astype(int)].T
        rows[small] = np.exp(exact - exact.max(axis=1)[:, None])
    return rows


def exact_count_log_probabilities(
    largest: int, n: float, channel: KRRChannel, atoms: np.ndarray
) -> np.ndarray:
    """``log P(count = c)`` for ``c`` up to ``largest``, a row per atom: the count of a category
    holding ``u = n t`` of the ``n`` users (``u`` rounded to whole users) is its users' kept
    reports, ``Binomial(u, p_keep)``, plus the others' stray ones, ``Binomial(n - u,
    p_other)``; a sum of two counts, so the lowest ``largest + 1`` probabilities of each
    convolve exactly. In logs: a count far from what any share makes likely (a category with
    no report from thousands of users at a low epsilon) has probabilities below the smallest
    float at every atom, and only their ratios matter."""
    users = np.rint(atoms * n)
    values = np.arange(largest + 1)
    kept = binom.logpmf(values[None, :], users[:, None], channel.p_keep)
    stray = binom.logpmf(values[None, :], (round(n) - users)[:, None], channel.p_other)
    # terms[:, c, j]: j of the count's reports kept from its users, c - j stray.
    taken = values[:, None] - values[None, :]
    terms = kept[:, None, :] + np.where(taken >= 0, stray[:, np.maximum(taken, 0)], -np.inf)
    largest_term = terms.max(axis=2)
    return largest_term + np.log(np.exp(terms - largest_term[:, :, None]).sum(axis=2))


def _angle(report_share: float) -> float:
    return float(np.arcsin(np.sqrt(report_share)))


class KRREmpiricalBayes:
    """Posterior-mean shares under a nonparametric prior fitted to the k-RR counts.

    Parameters
    ----------
    atoms : int
        Grid points of the prior: 0 and ``atoms - 1`` log-spaced values from
        ``1e-3 / max(n, k)`` to 1, to which :func:`prior_atoms` adds up to
        :data:`MAX_FINE_ATOMS` where the reports put the shares.
    em_steps : int
        EM steps on the prior's weights, from equal weights.
    blend : tuple of two floats, or None
        ``(low, high)``: mix the raw report shares in where the fitted prior's
        log-likelihood ratio over a homogeneous population is below ``high``
        (entirely at or below ``low``); ``None`` always takes the posterior mean.
    fine : bool
        Add the fine atoms of :func:`prior_atoms` (``False``: the log-spaced grid
        alone, as before they were added; for comparisons).
    noise : {"participants", "multinomial"}
        The likelihood the posterior means are taken under: the mechanism's noise
        given the shares of the users who reported (:func:`participant_likelihoods`,
        what the estimate is of), or the binomial of users drawn from a population
        (as before; for comparisons). The blend's gain is the multinomial one either way.

    Attributes
    ----------
    frequencies_, atoms_, prior_ (the weights of ``atoms_`` the posterior means
    were taken under), gain_ (the log-likelihood ratio of the prior fitted in the
    binomial model over every share ``1 / k``),
    weight_ (the posterior mean's share in the estimate, 1 without ``blend``),
    em_steps_ (EM steps run, both priors; the second is not fitted where the blend
    keeps the raw shares alone), log_likelihood_ (the counts' multinomial
    log-likelihood under the estimate, without the constant), warnings_
    (human-readable strings); n_iter_ and converged_ are None (they describe
    IBU runs).
    """

    warnings_: list[str]

    def __init__(
        self,
        *,
        atoms: int = DEFAULT_ATOMS,
        em_steps: int = DEFAULT_EM_STEPS,
        blend: tuple[float, float] | None = None,
        fine: bool = True,
        noise: str = "participants",
    ):
        if int(atoms) < 2:
            raise ValueError(f"atoms must be >= 2, got {atoms!r}")
        if int(em_steps) < 1:
            raise ValueError(f"em_steps must be >= 1, got {em_steps!r}")
        if blend is not None and not (0 <= blend[0] < blend[1] and np.isfinite(blend[1])):
            raise ValueError(f"blend must be (low, high) with 0 <= low < high, got {blend!r}")
        self.atoms = int(atoms)
        self.em_steps = int(em_steps)
        self.blend = blend
        self.fine = fine
        if noise not in NOISE_MODELS:
            raise ValueError(f"noise must be one of {', '.join(NOISE_MODELS)}, got {noise!r}")
        self.noise = noise

    def fit(self, counts, channel) -> KRREmpiricalBayes:
        if not isinstance(channel, KRRChannel):
            raise TypeError(f"empirical Bayes is for k-RR channels, got {type(channel).__name__}")
        counts = report_counts(counts, channel)
        n, k = counts.sum(), counts.size
        excess, other = channel.p_keep - channel.p_other, channel.p_other
        atoms = prior_atoms(counts, channel, self.atoms, fine=self.fine)
        distinct, row_of, multiplicity = np.unique(counts, return_inverse=True, return_counts=True)
        self.em_steps_ = 0
        # Whether the shares differ at all: the counts' likelihood under a prior fitted to them
        # against equal shares, users drawn at random (the multinomial model).
        binomial, shift = atom_likelihoods(distinct, n, channel, atoms)
        weights = self._fit_prior(binomial, multiplicity)
        q_flat = other + excess / k
        log_flat = distinct * np.log(q_flat) + (n - distinct) * np.log1p(-q_flat)
        # In logs with the shift put back: the flat likelihood can underflow beside the prior's.
        self.gain_ = float(np.sum(multiplicity * (np.log(binomial @ weights) + shift - log_flat)))
        self.weight_ = 1.0
        if self.blend is not None:
            low, high = self.blend
            self.weight_ = float(np.clip((self.gain_ - low) / (high - low), 0.0, 1.0))
        likelihood = binomial
        if self.noise == "participants" and self.weight_ > 0.0:
            atoms = participant_atoms(atoms, counts)
            likelihood = participant_likelihoods(distinct, n, channel, atoms)
            weights = self._fit_prior(likelihood, multiplicity)
        posterior_mean = (likelihood @ (weights * atoms)) / (likelihood @ weights)
        shares = posterior_mean[row_of]
        shares /= shares.sum()
        self.frequencies_ = self.weight_ * shares + (1.0 - self.weight_) * counts / n
        self.atoms_, self.prior_ = atoms, weights
        self.n_iter_ = self.converged_ = None
        self.log_likelihood_ = log_likelihood(counts, channel.forward(self.frequencies_))
        self.warnings_ = []
        if self.weight_ == 0.0:
            self.warnings_.append(
                "the reports do not tell the shares apart from equal shares (a prior fitted to "
                f"them is only {max(self.gain_, 0.0):.1f} log-likelihood units more likely), so "
                "the estimate is the raw report shares: differences between rows may be noise"
            )
        return self

    def _fit_prior(self, likelihood: np.ndarray, multiplicity: np.ndarray) -> np.ndarray:
        """The atoms' weights maximising the counts' marginal likelihood (EM from equal
        weights; ``likelihood`` has a row per distinct count, ``multiplicity`` its categories)."""
        categories = multiplicity.sum()
        weights = np.full(likelihood.shape[1], 1.0 / likelihood.shape[1])
        done = 0
        while done < self.em_steps:
            chunk = min(CHUNK_STEPS, self.em_steps - done)
            budget.charge(chunk * likelihood.size)
            for _ in range(chunk):
                weights = weights * ((multiplicity / (likelihood @ weights)) @ likelihood)
                weights /= categories
            done += chunk
        self.em_steps_ += done
        return weights

    def describe(self) -> str:
        """What the last :meth:`fit` ran, in words (for the estimate API's ``estimator``)."""
        text = (
            "empirical Bayes: posterior means under a prior on the shares fitted to the counts "
            f"({self.atoms_.size} atoms)"
        )
        if self.blend is None or self.weight_ == 1.0:
            return text
        if self.weight_ == 0.0:
            return "raw report shares (" + text + ", not supported by the reports)"
        return (
            f"{self.weight_:.0%} " + text + f", {1 - self.weight_:.0%} the raw report shares "
            f"(the prior's log-likelihood gain {self.gain_:.1f})"
        )
