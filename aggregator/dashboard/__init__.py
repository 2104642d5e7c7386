"""Analyst dashboards: sign-in, the campaign list and campaign pages, as one blueprint."""

from aggregator.dashboard.views import bp

__all__ = ["bp"]
