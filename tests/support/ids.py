"""Ids that no other test uses, for tests that share one server."""

from __future__ import annotations

import uuid


def unique_id(prefix: str) -> str:
    """``prefix-`` and 10 random hex digits: a campaign id of this test's own."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"
