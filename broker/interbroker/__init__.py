"""Requests from one broker to another (Kafka's inter-broker NetworkClients): the client and its
settings (client.py), and what uses it: transaction markers and the KIP-890 check against a
remote transaction coordinator (txn.py)."""
