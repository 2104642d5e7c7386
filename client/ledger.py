"""The privacy budget ledger: pins, what each report costs, what has been spent, what is left.

The ledger lives in the state document (:mod:`client.state`): for each campaign, the spec
pinned at first use and the epsilon charged per value tag (:func:`client.memo.value_tag`, never
the value), plus what campaigns the user has since forgotten had spent. The methods here read
and change a :class:`client.state.State` inside the caller's transaction, so that paying for a
report and queueing it (:mod:`client.outbox`) stay one atomic write.

The rules, all enforced before anything is spent or sent:

- a campaign whose report costs more than the policy's per-report cap is refused;
- a campaign whose spec differs from the pinned one is refused;
- a campaign counts a device at most once per period (its spec's ``period``): a repeat
  of the period's answer is that period's report again, and another answer is refused
  until the next period;
- a value reported before in the campaign costs nothing (its report is memoized);
- a new value that would take the total past the policy's budget is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from client.errors import (
    AlreadyReported,
    BudgetExceeded,
    ClientError,
    EpsilonCapExceeded,
    SpecChanged,
    StateError,
)
from client.policy import Policy
from client.state import CampaignRecord, PeriodReport, State
from shared.periods import DAY, ONCE, next_period_start
from shared.spec import GEOMETRIC, GRID_MECHANISMS, PLANAR_LAPLACE, CampaignSpec

# Relative slack for float sums when comparing with the budget and the cap.
SLACK = 1e-9


@dataclass(frozen=True)
class Charge:
    """What a report costs: ``epsilon`` (0 when ``memoized``, the value was reported before).

    ``repeat`` is the period's report when the device already made it with this
    answer: that report is the one to send again, nothing new is made.
    """

    tag: str
    epsilon: float
    memoized: bool
    repeat: PeriodReport | None = None


class Ledger:
    """The user's privacy budget, kept by the rules of ``policy``.

    Parameters
    ----------
    policy : Policy
        The per-report cap, the total budget and the location radius that prices a report.
    """

    def __init__(self, policy: Policy):
        self.policy = policy

    def cost(self, spec: CampaignSpec) -> float:
        """Epsilon a new value costs in this campaign; refused if above the per-report cap.

        Raises
        ------
        EpsilonCapExceeded
            The campaign costs more than :attr:`Policy.max_epsilon` per report.
        """
        cost = self.policy.cost(spec)
        if cost > self.policy.max_epsilon * (1 + SLACK):
            raise EpsilonCapExceeded(
                f"campaign {spec.id!r} costs epsilon {cost:.4g} per report"
                f"{self._cost_basis(spec)}, above your cap of {self.policy.max_epsilon:.4g}: "
                "refused, nothing was spent or sent",
                field="epsilon",
            )
        return cost

    def charge(
        self, state: State, key: str, spec: CampaignSpec, tag: str, cost: float, period: str
    ) -> Charge:
        """What reporting the value tagged ``tag`` in ``period`` (a period key) would spend.

        Nothing is changed.

        Raises
        ------
        SpecChanged
            The campaign is pinned to another spec.
        AlreadyReported
            The device reported another value in this period.
        BudgetExceeded
            A new value that would take the total spent past the budget.
        """
        record = state.campaigns.get(key)
        if record is not None and record.spec_hash != spec.spec_hash:
            raise SpecChanged(
                f"the server now serves a different spec for campaign {record.campaign_id!r} "
                f"(hash {spec.spec_hash[:12]}..., pinned {record.spec_hash[:12]}... at "
                f"first use): refused, nothing was spent or sent. If you trust the change, "
                f"`ldp-client forget {record.campaign_id}` (weakens longitudinal protection)",
                field="spec_hash",
            )
        reported = None if record is None else record.period_report
        if reported is not None and reported.period == period:
            if reported.tag != tag:
                raise AlreadyReported(
                    changed_answer_message(spec.id, spec.period, period), field="value"
                )
            return Charge(tag=tag, epsilon=0.0, memoized=True, repeat=reported)
        if record is not None and tag in record.charges:
            return Charge(tag=tag, epsilon=0.0, memoized=True)
        spent = state.total_spent
        if spent + cost > self.policy.total_budget * (1 + SLACK):
            raise BudgetExceeded(
                f"this report would spend epsilon {cost:.4g}, but only {self.left(spent):.4g} "
                f"of your budget of {self.policy.total_budget:.4g} is left: refused, nothing "
                "was spent or sent",
                field="epsilon",
            )
        return Charge(tag=tag, epsilon=cost, memoized=False)

    @staticmethod
    def record(
        state: State,
        key: str,
        server: str,
        spec: CampaignSpec,
        charge: Charge,
        now: float,
        report: PeriodReport | None = None,
    ) -> None:
        """Pin the campaign if it is new, book ``charge`` (from :meth:`charge`) against it,
        and keep ``report`` as the campaign's report in its period."""
        record = state.campaigns.get(key)
        if record is None:
            record = CampaignRecord(
                server=server,
                campaign_id=spec.id,
                spec=spec.to_dict(),
                spec_hash=spec.spec_hash,
                pinned_at=now,
            )
            state.campaigns[key] = record
        if not charge.memoized:
            record.charges[charge.tag] = charge.epsilon
        if report is not None:
            record.period_report = report

    @staticmethod
    def forget(state: State, key: str, server: str, campaign_id: str) -> float:
        """Drop a campaign's pin and charges, keep what it spent in the total; return that.

        Raises
        ------
        ClientError
            ``not_pinned``: the campaign is not in the ledger.
        """
        record = state.campaigns.pop(key, None)
        if record is None:
            raise ClientError(
                f"campaign {campaign_id!r} on {server} is not in the state",
                field="campaign",
                code="not_pinned",
            )
        spent = record.spent
        state.forgotten_spent = math.fsum([state.forgotten_spent, spent])
        return spent

    def left(self, spent: float) -> float:
        """Budget left after ``spent`` (never below 0)."""
        return max(self.policy.total_budget - spent, 0.0)

    def budget(self, state: State) -> dict[str, float]:
        """The total budget, what is spent and left, and the part spent in forgotten campaigns."""
        spent = state.total_spent
        return {
            "total": self.policy.total_budget,
            "spent": spent,
            "left": self.left(spent),
            "forgotten": state.forgotten_spent,
        }

    def campaigns(self, state: State) -> list[dict[str, Any]]:
        """One entry per pinned campaign (sorted by key): its spec's terms and what it spent."""
        rows = []
        for _key, record in sorted(state.campaigns.items()):
            spec = pinned_spec(record)
            reported = record.period_report
            rows.append(
                {
                    "campaign": record.campaign_id,
                    "server": record.server,
                    "mechanism": spec.mechanism,
                    "period": spec.period,
                    "last_reported_period": None if reported is None else reported.period,
                    "epsilon": spec.epsilon,
                    "cost_per_value": self.policy.cost(spec),
                    "values_reported": len(record.charges),
                    "spent": record.spent,
                    "spec_hash": record.spec_hash,
                    "pinned_at": record.pinned_at,
                }
            )
        return rows

    def _cost_basis(self, spec: CampaignSpec) -> str:
        if spec.mechanism == GEOMETRIC:
            return (
                f" (epsilon {spec.epsilon:.4g} per unit over {self.policy.value_radius} "
                "values, at most the range's width)"
            )
        if spec.mechanism not in GRID_MECHANISMS:
            return ""
        metric = "" if spec.mechanism == PLANAR_LAPLACE else f" of {spec.metric} distance"
        return (
            f" (epsilon {spec.epsilon:.4g}/m{metric} over {self.policy.location_radius_m:g} m "
            f"and {spec.cell_size_m:g} m cells)"
        )


def pinned_spec(record: CampaignRecord) -> CampaignSpec:
    """The spec a campaign was pinned to, checked against its hash.

    Raises
    ------
    StateError
        The stored spec is damaged or does not match the pinned hash.
    """
    try:
        spec = CampaignSpec.from_dict(record.spec)
    except ValueError as exc:
        raise StateError(f"the pinned spec of {record.campaign_id!r} is damaged: {exc}") from exc
    if spec.spec_hash != record.spec_hash:
        raise StateError(f"the pinned spec of {record.campaign_id!r} does not match its hash")
    return spec


def period_rule(period: str) -> str:
    """A campaign's period as a rule: "one report per device per day (UTC)", ..."""
    if period == ONCE:
        return "one report per device"
    if period == DAY:
        return "one report per device per day (UTC)"
    return "one report per device per ISO week (UTC)"


def period_when(period: str, key: str) -> str:
    """The current period (``key``) after a verb: "", " today (2025-01-15)", " this week (...)"."""
    if period == ONCE:
        return ""
    if period == DAY:
        return f" today ({key})"
    return f" this week ({key})"


def changed_answer_message(campaign_id: str, period: str, key: str) -> str:
    """Why another answer in a period already reported is refused, and when it can be sent."""
    start = next_period_start(period, key)
    if start is None:
        then = "a changed answer is not sent"
    else:
        then = f"a changed answer can be reported from {start:%Y-%m-%d %H:%M} UTC"
    return (
        f"campaign {campaign_id!r} takes {period_rule(period)}, and this device already "
        f"reported to it{period_when(period, key)} with another answer: that report stands, "
        f"and {then} (nothing was spent or sent)"
    )
