"""What one client connection may do and hold: the limits and timeouts it is served under (reloadable)."""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.server.prelogin import PreLoginLimits


@dataclass(frozen=True)
class Limits:
    max_frame_bytes: int = 100 * 1024 * 1024
    max_inflight: int = 256
    max_connection_bytes: int = 64 * 1024 * 1024  # held per connection before its reader waits
    request_timeout: float = 30.0  # beyond the time the request itself allows the broker
    max_hold: float = 300.0  # the longest a request's own fields may let a broker keep it
    idle_timeout: float = 600.0  # Kafka's connections.max.idle.ms
    frame_timeout: float = 30.0  # a frame begun must arrive whole within this
    max_buffered_bytes: int = 512 * 1024 * 1024  # held for all connections of the process
    max_connections: int = 10_000
    validate_records: bool = True  # --validate-records crc: bad produced batches stop at kfan
    fetch_ahead_bytes: int = 16 * 1024 * 1024  # records sub-fetches sent ahead may bring in, per connection
    max_age: float = 0.0  # --connection-max-age: close at a safe point once older (0: never)
    max_age_jitter: float = 0.0  # a random part up to this, added to each connection's max age
    login: PreLoginLimits = field(default_factory=PreLoginLimits)  # what a connection not logged in yet may hold
