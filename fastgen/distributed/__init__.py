"""The engine's process side: the process group and its collectives, failure propagation between ranks
(``group``), the torchrun launch (``launch``), replication and sharding of networks and their full-state gathering
(``parallelize``), what every rank holds compared across ranks (``fingerprint``, ``rank_check``) and
world-size-independent random streams (``keyed_rng``). ``docs/architecture.md`` draws where it sits."""
