"""The classic consumer-group coordinator: membership, rebalances, committed offsets."""
