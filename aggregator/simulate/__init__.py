"""``ldp-simulate``: plan a collection by simulating it, in-process or against a server."""
