"""The HTTP face of the aggregator: routes, authentication, errors, rate limits, the OpenAPI document."""
