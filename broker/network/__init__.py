"""broker/network."""
