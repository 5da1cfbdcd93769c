"""Security: who a connection is (TLS, SASL) and what it may do (ACLs), with Kafka's rules.

Layering: this package sits beside the replica manager layer; the network layer asks it who a
connection is, the API handlers ask it what that principal may do.
"""
