"""Produce's own rules, on top of the split by leader.

Record batches are checked before they are sent (:mod:`proxy.kafka.records`):
a partition whose records a broker would refuse unread is answered at once
with CORRUPT_MESSAGE or INVALID_RECORD and sent nowhere; the request's other
partitions go on as usual.

acks=0: the client expects no response, so none is written (the request
still holds its place in the response order), and the brokers are not
expected to answer either. A broker that fails under a Produce is reported
so that every client retries without losing or doubling a batch it cannot
know the fate of (see :data:`FAILURE`).
"""

from __future__ import annotations

from typing import Any

from ..kafka import errors
from ..kafka.headers import RequestHeader
from ..kafka.records import Invalid, check_records, producer
from ..kafka.schema import Struct
from ..kafka.wire import Malformed
from . import leader
from .answers import decode_answer
from .layout import Layout, TopicPartition
from .plan import BrokerFailure, Context, LeaderSplit, Plan, ProducerBatch, ProducerBatchesNotSent, ProducerPartition, Route

# NETWORK_EXCEPTION is the general answer for a failed broker, but librdkafka
# fails a produced batch for good on it. So a Produce that reached the broker
# gets REQUEST_TIMED_OUT ("maybe written", retried by every client), and one
# that never left kfan NOT_LEADER_OR_FOLLOWER ("not written": refresh, retry).
FAILURE = BrokerFailure(written=errors.REQUEST_TIMED_OUT, unwritten=errors.NOT_LEADER_OR_FOLLOWER)


def plan(route: Route[Any], ctx: Context, hdr: RequestHeader, payload: memoryview, request: Struct) -> Plan:
    expect = request["acks"] != 0
    refused = invalid_records(request, leader.layouts_of(route, hdr.api_version)[0]) if ctx.validate_records else {}
    found = leader.split(route, ctx, hdr, request, {tp: bad.code for tp, bad in refused.items()})
    out = leader.plan_split(route, ctx, hdr, payload, found, expect, refused)
    if found.unroutable and (not_sent := unroutable_batches(found)):
        out.at_plan.append(ProducerBatchesNotSent(not_sent))
    return out


def invalid_records(request: Struct, request_layout: Layout) -> dict[TopicPartition, Invalid]:
    """The partitions whose records a broker would refuse unread (a bad checksum, a broken frame): not sent."""
    out: dict[TopicPartition, Invalid] = {}
    for topic, partition in request_layout.entries(request):
        problem = check_records(partition["records"])
        if problem is not None:
            out[(topic, request_layout.partition_index(partition))] = problem
    return out


def sequenced(split: LeaderSplit) -> dict[int, dict[ProducerPartition, ProducerBatch]]:
    """Per broker, the partitions a Produce sends it with an idempotent or transactional producer's batches.

    A broker orders one connection's requests only, and accepts any sequence number as a producer's first on a
    partition: kfan keeps these in the order it read them, whichever link they go on
    (:mod:`backends.sequences`).
    """
    out: dict[int, dict[ProducerPartition, ProducerBatch]] = {}
    layout = split.request_layout
    for broker, sub in split.by_leader.items():
        found: dict[ProducerPartition, ProducerBatch] = {}
        for topic, p in layout.entries(sub):
            pid, epoch, sequence = producer(p["records"])
            if pid >= 0:
                found[(pid, topic, layout.partition_index(p))] = (epoch, sequence)
        if found:
            out[broker] = found
    return out


def unroutable_batches(split: LeaderSplit) -> dict[ProducerPartition, ProducerBatch]:
    """The idempotent producers' batches kfan answers itself (no leader known, say) with an error the client
    retries: it sends them again, so a later batch must not be written before them, even if kfan finds the
    leader before that later batch comes (:mod:`backends.sequences`)."""
    out: dict[ProducerPartition, ProducerBatch] = {}
    layout = split.request_layout
    for topic, p in layout.entries(split.request):
        tp = (topic, layout.partition_index(p))
        if split.unroutable.get(tp) in SENT_AGAIN:
            pid, epoch, sequence = producer(p["records"])
            if pid >= 0:
                out[(pid, *tp)] = (epoch, sequence)
    return out


# A partition answered with one of these was not written (or may not have been), and Kafka's clients send its
# batch again (their retriable errors for Produce): a later batch of its producer must not be written before.
SENT_AGAIN = errors.LEADERSHIP | {
    errors.CORRUPT_MESSAGE,
    errors.REQUEST_TIMED_OUT,
    errors.NETWORK_EXCEPTION,
    errors.NOT_ENOUGH_REPLICAS,
    errors.OUT_OF_ORDER_SEQUENCE_NUMBER,
    errors.KAFKA_STORAGE_ERROR,
}


def sent_again(hdr: RequestHeader, response_layout: Layout, payload: bytes | memoryview) -> set[TopicPartition] | None:
    """The partitions a broker's Produce answer refused with an error the client retries (:data:`SENT_AGAIN`);
    None when it does not decode (kfan tells the client its broker failed: every partition is sent again)."""
    try:
        body = decode_answer(hdr, payload)
    except Malformed:
        return None
    return {(t, response_layout.partition_index(p)) for t, p in response_layout.entries(body) if p["error_code"] in SENT_AGAIN}
