"""broker/log."""
