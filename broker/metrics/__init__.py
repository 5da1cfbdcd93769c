"""Metrics: leaf instruments for the hot path, the scrape-time collector, the endpoint."""
