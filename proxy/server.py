"""The kfan server: the control plane plus a listener serving client connections."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial

import trio

from backends.cluster import Cluster

from .connection import Limits, serve_client
from .core import Identity

log = logging.getLogger("kfan.server")


@dataclass(frozen=True)
class ServerConfig:
    bootstrap: list[tuple[str, int]]
    listen: tuple[str, int] = ("127.0.0.1", 9092)
    advertise: tuple[str, int] | None = None  # defaults to the listen address
    node_id: int = 0
    metadata_refresh_s: float = 30.0
    limits: Limits = field(default_factory=Limits)


@dataclass
class Running:
    """What a started server reports: where it listens and how clients should reach it."""

    port: int
    identity: Identity
    cluster: Cluster


async def serve(config: ServerConfig, task_status: trio.TaskStatus[Running] = trio.TASK_STATUS_IGNORED) -> None:
    cluster = Cluster(
        config.bootstrap,
        refresh_interval=config.metadata_refresh_s,
        max_frame_bytes=config.limits.max_frame_bytes,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(cluster.run)
        host, port = config.listen
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]
        adv_host, adv_port = config.advertise or (host, bound)
        if adv_port == 0:
            adv_port = bound
        identity = Identity(config.node_id, adv_host, adv_port)
        log.info("kfan listening on %s:%s, advertised as %s:%s (node %s)", host, bound, adv_host, adv_port, config.node_id)
        task_status.started(Running(bound, identity, cluster))
        await trio.serve_listeners(partial(serve_client, cluster=cluster, identity=identity, limits=config.limits), listeners)
