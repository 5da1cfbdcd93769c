"""A cluster of mini-brokers: metadata in etcd (docs/cluster.md).

``store`` is the interface (MetadataStore) and its types, ``memory`` the in-process store,
``etcd_store`` the etcd one (imports grpc: only when a cluster is configured), ``lease_keeper``
the keepalive task, ``etcd_process`` an etcd child process for tests and embedded clusters.
On top of them, the membership: ``settings`` (the cluster's keys), ``meta_properties`` and
``cluster_id`` (which cluster a log dir belongs to), ``registration`` (``/brokers/ids/<id>``
and the broker epoch), ``controller`` (election and the controller-epoch fence), ``liveness``
(the controller's view of live brokers), ``placement`` (Kafka's replica assignment), ``paths``
(the key layout), and ``membership``, which puts them together for the server.
"""
