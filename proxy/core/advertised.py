"""kfan as its clients see it: the broker, or brokers, its answers name (``--node-id``, ``--broker-ids``,
``--broker-port-base``, ``--advertise``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Identity:
    """kfan as its clients see it (``--broker-ids``).

    ``cluster_ids`` False: one broker, kfan, node ``node_id``. True: the cluster's own brokers, each under its own
    node id, every one of them at kfan's address (so a client keeps a connection, and a Fetch in flight, per broker
    as it would directly; kfan still splits whatever reaches it by the real leaders); with ``port_base``, broker N
    at port ``port_base + N`` of kfan's host, for clients that tell brokers apart by address.
    """

    node_id: int
    host: str
    port: int
    cluster_ids: bool = False
    port_base: int = 0

    def port_of(self, node_id: int) -> int:
        """Where a client reaches broker ``node_id`` (with the cluster's ids)."""
        port = self.port_base + node_id
        return port if self.port_base and node_id >= 0 and port <= MAX_PORT else self.port


MAX_PORT = 65535
