"""Fixtures for the client's unit tests: a fake aggregator and reporters on a temp state dir."""

from __future__ import annotations

import pytest
from client_fakes import DAILY_SPEC, KRR_SPEC, PLANAR_SPEC, RR_SPEC, SERVER, Clock, FakeAggregator

from client import Policy, Reporter


@pytest.fixture
def fake():
    aggregator = FakeAggregator()
    aggregator.add(KRR_SPEC)
    aggregator.add(RR_SPEC)
    aggregator.add(PLANAR_SPEC)
    aggregator.add(DAILY_SPEC)
    return aggregator


@pytest.fixture
def clock():
    """The devices' clock, moved on by hand (``clock.next_day()``)."""
    return Clock()


@pytest.fixture
def state_dir(tmp_path):
    return tmp_path / "state"


@pytest.fixture
def make_reporter(fake, state_dir):
    """Reporters sharing the fake server and the state directory (like separate runs)."""
    made = []

    def make(policy: Policy | None = None, **kwargs) -> Reporter:
        reporter = Reporter(
            SERVER,
            state_dir=str(state_dir),
            policy=policy,
            session=kwargs.pop("session", None) or fake.session(),
            **kwargs,
        )
        made.append(reporter)
        return reporter

    yield make
    for reporter in made:
        reporter.close()
