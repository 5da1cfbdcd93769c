"""The replica core: partitions, the replica manager, and the delayed operations that wait
on them."""
