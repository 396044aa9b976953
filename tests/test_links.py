"""A client connection's links (:class:`backends.links.LinkPool`), opened by kfan's real cluster view against the
librdkafka mock cluster over real sockets: which links a client holds as the broker it asks changes."""

from __future__ import annotations

import trio

from backends.cluster import Cluster
from backends.link import LinkError, own_request
from backends.links import Lane, LinkPool
from backends.reads import read_metadata
from proxy.kafka import apis
from proxy.tools.mock_cluster import MockCluster
from tests.support.waiting import wait_for_async


async def test_a_client_holds_one_shared_link_and_an_earlier_one_closes_once_answered() -> None:
    """The SHARED lane goes to the client's "any broker" only. When that broker changes, the SHARED link to the
    earlier one closes, after the answer it still owes (so a client holds one, not one per broker it ever asked);
    one whose broker does not answer closes after the request timeout, its waiter told the link failed."""
    with MockCluster(3) as mock:
        async with trio.open_nursery() as nursery:
            cluster = Cluster([mock.brokers[1]], request_timeout=1.0)
            with trio.fail_after(30):
                await nursery.start(cluster.run)
            version = cluster.version_for(1, apis.METADATA)
            metadata = own_request(apis.METADATA, version, {"topics": []})
            pool = LinkPool(cluster, nursery, max_frame_bytes=cluster.max_frame_bytes)

            mock.set_rtt(1, 300)  # broker 1's answer is still out when the client moves on
            first = pool.link(1, Lane.SHARED)
            assert first is not None
            owed = first.submit(metadata)
            second = pool.link(2, Lane.SHARED)
            assert second is not None and second is not first
            with trio.fail_after(10):
                answer = read_metadata(await owed.wait(), version)
            assert {b["node_id"] for b in answer["brokers"]} == {1, 2, 3}, "the answer owed came in whole"
            await wait_for_async("the SHARED link to broker 1 to close", lambda: first.failed is not None, 10)
            assert pool.link(2, Lane.SHARED) is second and second.failed is None
            main = pool.link(1, Lane.MAIN)
            assert main is not None and main is not first, "the other lanes keep a link per broker"

            mock.set_rtt(2, 60_000)  # broker 2 holds its answer past the request timeout (1 s)
            unanswered = second.submit(metadata)
            third = pool.link(3, Lane.SHARED)
            assert third is not None
            await wait_for_async("the SHARED link to broker 2 to close", lambda: second.failed is not None, 10)
            assert isinstance(unanswered.failure, LinkError), "told, not left waiting"
            assert main.failed is None, "a MAIN link is not the SHARED lane's"
            nursery.cancel_scope.cancel()
