"""Cluster metadata: the metadata store, topics, producer-id blocks and dynamic configs."""
