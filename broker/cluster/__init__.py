"""A cluster of mini-brokers: metadata in etcd (docs/cluster.md).

``store`` is the interface (MetadataStore) and its types, ``memory`` the in-process store,
``etcd_store`` the etcd one (imports grpc: only when a cluster is configured), ``lease_keeper``
the keepalive task, ``etcd_process`` an etcd child process for tests and embedded clusters.
"""
