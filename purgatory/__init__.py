"""purgatory."""
