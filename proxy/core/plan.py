"""The values the core hands to the I/O layer and takes back from it.

A client request becomes a :data:`Plan`: a :class:`LocalReply` (answered by
kfan), :class:`NeedCoordinators` (look these up, then plan again) or a
:class:`Forward` (sub-requests per :data:`Destination`, plus the named merge
that turns the brokers' answers into the client's response). Each broker
answer is a :data:`BrokerAnswer`: a :class:`Response`, a :class:`Failed`
code, or :data:`NOT_YET` (a sub-fetch still out when a Fetch is answered).
A merge returns a :class:`Reply`: the response body plus :data:`Effect`
values the I/O layer applies (fold metadata, learn or forget coordinators,
refresh the topology, remember watermarks). Nothing here does I/O.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, NamedTuple, Self, TypeVar

from ..kafka import errors
from ..kafka.headers import RequestHeader
from ..kafka.records import Invalid
from ..kafka.schema import Struct, StructSpec
from ..kafka.wire import Parts
from .acls import Access, Decision
from .advertised import MAX_PORT, Identity  # noqa: F401 (Identity is the core's, imported from here too)
from .layout import Layout, TopicKey, TopicPartition
from .read_replicas import ReadReplicaKey
from .share_state import KeepShareSession, ReopenShareSessions, ShareKey, ShareSession
from .topology import Topology


class Unsupported(Exception):
    """A request kfan does not serve: the connection is closed, as a broker does."""


class ClosesConnection(Exception):
    """No response can carry the request's refusal (an acks=0 Produce the ACLs refuse): close the connection, as a
    broker does; the argument is the reason, for the metrics."""


class BrokerUnavailable(Exception):
    """A broker failure that no error code in the response can express: close the client connection."""


class KeyType(enum.IntEnum):
    """FindCoordinator's key_type."""

    GROUP = 0
    TRANSACTION = 1


@dataclass(frozen=True, slots=True)
class Coordinator:
    """The coordinator of a group or transaction, not yet resolved to a broker."""

    key_type: KeyType
    key: str


# Group and transactional ids have no length limit in Kafka, and clients choose
# them: a longer one is looked up each time it is used and never cached, so
# that no client grows kfan's process-wide state with ids of its choosing.
MAX_CACHED_KEY_CHARS = 4096


def cacheable(c: Coordinator) -> bool:
    """Whether a coordinator may be kept in a cache once looked up (its key is not too long)."""
    return len(c.key) <= MAX_CACHED_KEY_CHARS


class AnyBroker:
    """Any live broker will do: the I/O layer picks one (and another when it fails)."""

    def __repr__(self) -> str:
        return "ANY_BROKER"


ANY_BROKER = AnyBroker()
Destination = int | Coordinator | AnyBroker


@dataclass(frozen=True, slots=True)
class SubRequest:
    """A request for one broker; the link adds api key/version and its own correlation id."""

    api_key: int
    api_version: int
    tail: Parts  # everything after the correlation id: client_id, header tags, body
    expect_response: bool


# --- a broker's answer ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Response:
    """A broker's response frame (without its size prefix)."""

    payload: bytes | memoryview


@dataclass(frozen=True, slots=True)
class Failed:
    """No usable answer: the link failed or timed out; ``code`` is what the client is told."""

    code: int


class NotYet:
    """A sub-fetch still in flight when its Fetch is answered: its partitions say "no data yet"."""

    def __repr__(self) -> str:
        return "NOT_YET"


NOT_YET = NotYet()
BrokerAnswer = Response | Failed | NotYet
Answers = Mapping[Destination, BrokerAnswer]

# A partition's offsets as its leader last reported them in a Fetch answer:
# high watermark, last stable offset, log start offset.
Watermarks = tuple[int, int, int]

# One producer's batches for one partition, which a broker must read in the producer's sequence order,
# and what orders them: the producer epoch and the first batch's base sequence.
ProducerPartition = tuple[int, TopicKey, int]  # producer id, topic, partition
ProducerBatch = tuple[int, int]  # producer epoch, base sequence


# --- what a merge asks of the I/O layer ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FoldMetadata:
    """A Metadata answer the topology should take in.

    ``described_only``: it came with a client's identity (``--broker-identity
    client``): only the topics it describes without error are taken in; its
    errors may be that client's alone (TOPIC_AUTHORIZATION_FAILED), so they
    remove or change nothing the topology holds for everyone.
    """

    metadata: Struct
    described_only: bool = False


@dataclass(frozen=True, slots=True)
class LearnCoordinators:
    coordinators: Mapping[Coordinator, int]


@dataclass(frozen=True, slots=True)
class ForgetCoordinators:
    """These coordinators moved or failed: look them up again next time."""

    coordinators: frozenset[Coordinator]


@dataclass(frozen=True, slots=True)
class RefreshTopology:
    """Leaders moved, topics changed, or a broker failed: refresh the topology soon."""


@dataclass(frozen=True, slots=True)
class RememberWatermarks:
    """The watermarks a Fetch's answers carried, for the connection's next Fetch."""

    watermarks: Mapping[TopicPartition, Watermarks]


@dataclass(frozen=True, slots=True)
class FetchAhead:
    """Sub-fetches to send now, ahead of the client's next Fetch (they stand in for its
    sub-fetches when it asks exactly this): per broker, the request and the key it is kept by."""

    subs: Mapping[int, tuple[SubRequest, Hashable]]


@dataclass(frozen=True, slots=True)
class LearnReadReplicas:
    """Leaders named these preferred read replicas (KIP-392): fetch those partitions from them."""

    replicas: Mapping[ReadReplicaKey, int]


@dataclass(frozen=True, slots=True)
class ForgetReadReplicas:
    """These preferences ended (the replica erred or failed, or can no longer be read from): back to the leader."""

    keys: frozenset[ReadReplicaKey]


@dataclass(frozen=True, slots=True)
class ProducerBatchesNotSent:
    """An idempotent producer's batches kfan answered itself, not written: the client sends them again, and its
    later batches for those partitions must not be written first (``backends.sequences``)."""

    batches: Mapping[ProducerPartition, ProducerBatch]


Effect = (
    FoldMetadata
    | LearnCoordinators
    | ForgetCoordinators
    | RefreshTopology
    | RememberWatermarks
    | FetchAhead
    | LearnReadReplicas
    | ForgetReadReplicas
    | KeepShareSession
    | ReopenShareSessions
    | ProducerBatchesNotSent
)


@dataclass(slots=True)
class Reply:
    """The client's response body, and what the I/O layer should do about it."""

    body: Parts
    effects: list[Effect] = field(default_factory=list)
    # (error code, broker id or -1) -> partitions or entries answering it, for metrics.
    errors: Counter[tuple[int, int]] = field(default_factory=Counter)
    # The one broker asked failed or answered undecodably: another may answer.
    broker_failed: bool = False
    # (broker id, locality: same-rack, cross-rack or unknown) -> bytes of records it sent (Fetch), for metrics.
    fetched: Counter[tuple[int, str]] = field(default_factory=Counter)


# --- what to do with a request ---------------------------------------------------------------


def _no_coordinator(c: Coordinator) -> int | None:
    return None


def _no_read_replica(key: ReadReplicaKey) -> int | None:
    return None


def _no_fetch_cap(client_id: str | None) -> int | None:
    return None


@dataclass(frozen=True, slots=True)
class Features:
    """The cluster's features (KIP-584) as ApiVersions v3+ reports them: what the brokers support, and the levels
    the controller finalized (``finalized_epoch`` -1: none known)."""

    supported: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    finalized_epoch: int = -1
    finalized: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # name -> (min level, max level)


NO_FEATURES = Features()


@dataclass(frozen=True, slots=True)
class Context:
    """What the core may know of the world when planning a request."""

    identity: Identity
    topology: Topology
    api_versions: Mapping[int, tuple[int, int]]  # what kfan advertises
    # The broker coordinating a group or transaction, when known (the I/O layer's cache).
    coordinator_of: Callable[[Coordinator], int | None] = _no_coordinator
    # The I/O layer has already looked up this request's unknown coordinators.
    coordinators_looked_up: bool = False
    # What this client connection last learned of partitions' watermarks (Fetch only).
    watermarks: Mapping[TopicPartition, Watermarks] = field(default_factory=dict)
    # Check a Produce's record batches before they reach a broker (--validate-records crc).
    validate_records: bool = True
    # Records this connection's sub-fetches sent ahead of its next Fetch may bring in (0: none are).
    fetch_ahead_bytes: int = 0
    # kfan's own rack (--rack; "" when unset): sub-fetches carry it unless the client names its own.
    rack: str = ""
    # The preferred read replica a leader named for this rack and partition, while it holds (the I/O layer's store).
    read_replica: Callable[[ReadReplicaKey], int | None] = _no_read_replica
    # The brokers see this connection as the client's own principal (--broker-identity client): what kfan's own
    # view lacks is asked of a broker as the client, never answered from that view (which the client may not see).
    client_identity: bool = False
    # This client connection's share sessions (KIP-932), by group and member id.
    share_sessions: Mapping[ShareKey, ShareSession] = field(default_factory=dict)
    # The cluster's features, for ApiVersions v3+ (as the brokers last reported them).
    features: Features = NO_FEATURES
    # The client and the ACLs that judge it (--authorizer acls); None: kfan authorizes nothing itself.
    access: Access | None = None
    # Partitions the ACLs refused (a leader split answers them in place, sent to no broker).
    refused: Mapping[TopicPartition, int] = field(default_factory=dict)
    # The APIs whose requests' resources are wanted (the audit log's), even with no ACLs to judge them by.
    record_resources: frozenset[int] = frozenset()
    # The brokers create the topics a Metadata request names (their auto.create.topics.enable).
    auto_create_topics: bool = True
    # The most bytes a Fetch of this client id may ask for (its fetch quota's window; None: no cap).
    fetch_quota_bytes: Callable[[str | None], int | None] = _no_fetch_cap


@dataclass(slots=True)
class LocalReply:
    """Answered by kfan without asking a broker."""

    header: RequestHeader
    expect_response: bool
    body: Parts
    errors: Counter[tuple[int, int]] = field(default_factory=Counter)
    unknown_topics: set[TopicKey] = field(default_factory=set)  # named but not in the topology
    cost: int = 0
    refused: dict[TopicPartition, Invalid] = field(default_factory=dict)  # records refused before any broker saw them
    # Applied once planned, before the connection plans its next request (a share session's next epochs).
    at_plan: list[Effect] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)  # what the ACLs decided about it (--authorizer acls)


@dataclass(slots=True)
class NeedCoordinators:
    """A batch naming coordinators kfan has not seen: look them up (in bulk), then plan again."""

    header: RequestHeader
    coordinators: set[Coordinator]
    cost: int = 0


@dataclass(slots=True)
class LeaderSplit:
    """A request split by partition leader (:mod:`.leader`): what the merge needs to answer every partition.

    Its destinations are brokers, always: a partition goes to its leader, or
    to a replica of it, never to a coordinator or any broker.
    """

    request: Struct  # as sent (a Fetch's is rewritten to be sessionless)
    request_layout: Layout
    response_layout: Layout
    by_leader: dict[int, Struct] = field(default_factory=dict)  # the sub-request bodies
    # Where each partition went: its leader, or the replica in ``replicas``.
    leader_of: dict[TopicPartition, int] = field(default_factory=dict)
    replicas: dict[TopicPartition, int] = field(default_factory=dict)  # sent to this replica rather than the leader
    unroutable: dict[TopicPartition, int] = field(default_factory=dict)  # -> the error it is answered with

    def unknown_topics(self) -> set[TopicKey]:
        """Topics the topology does not know (a refresh may find them), as opposed to leaderless ones."""
        return {tp[0] for tp, code in self.unroutable.items() if code in _UNKNOWN}

    def moved(self) -> bool:
        """Partitions went unrouted for want of a leader (not for what the client sent): refresh the topology."""
        return any(code in errors.LEADERSHIP for code in self.unroutable.values())


_UNKNOWN = frozenset({errors.UNKNOWN_TOPIC_OR_PARTITION, errors.UNKNOWN_TOPIC_ID})

S = TypeVar("S")  # what a planner found that its merge needs (Forward.state)
P = TypeVar("P", bound="Forward[Any]")  # the plan a merge takes
Merger = Callable[[P, Answers], Reply]  # a plan's merge: the brokers' answers to the client's response


@dataclass(slots=True)
class Forward(Generic[S]):
    """Sub-requests per destination, and the merge that answers the client from their answers."""

    header: RequestHeader
    expect_response: bool
    route: Route[Any]  # the row it was planned by
    ctx: Context
    request: Struct  # the decoded client request
    subs: dict[Destination, SubRequest]
    merge: Merger[Self]  # the route's merge, or the one its planner fell back to
    unknown_topics: set[TopicKey] = field(default_factory=set)
    broker_wait_ms: int = 0  # how long the request itself lets a broker take before answering
    cost: int = 0  # memory the request holds while in flight: its frame plus its decoded form (estimated)
    refused: dict[TopicPartition, Invalid] = field(default_factory=dict)  # records refused before any broker saw them
    at_plan: list[Effect] = field(default_factory=list)  # as LocalReply's
    decisions: list[Decision] = field(default_factory=list)  # as LocalReply's
    # What the merge needs beyond the request (its planner's findings); always named, as each policy's differs.
    state: S = field(kw_only=True)


@dataclass(slots=True)
class FetchForward(Forward[LeaderSplit]):
    """A Fetch: answered once ``min_bytes`` are in, or at max_wait, as a broker would."""

    min_bytes: int = 1
    keys: dict[Destination, Hashable] = field(default_factory=dict)  # per sub-fetch, what it asks, order aside
    partitions: dict[Destination, frozenset[TopicPartition]] = field(default_factory=dict)
    # Preferred read replicas found unusable while planning (gone from the cluster or the ISR): forget them.
    unusable_replicas: frozenset[ReadReplicaKey] = frozenset()


Plan = LocalReply | NeedCoordinators | Forward[Any]


# --- the facts a route row states about its API ---------------------------------------------


class FieldPath(NamedTuple):
    """Where partitions sit in a message: ``topics[].partitions[].index`` (index None: bare int32s)."""

    topics: str
    partitions: str
    index: str | None


class PartitionFields(NamedTuple):
    """A leader-split API's partitions, in its request and in its response."""

    request: FieldPath
    response: FieldPath


@dataclass(frozen=True, slots=True)
class Batch:
    """A request naming several groups or transactions, and where its answer lists them."""

    key_type: KeyType
    request_array: str
    request_key: str | None  # None: the array holds the keys themselves
    response_array: str
    response_key: str


@dataclass(frozen=True, slots=True)
class BrokerFailure:
    """The error a client is told for a sub-request whose broker failed before answering.

    ``written``: its bytes had started out, so the broker may have acted on it.
    """

    written: int = errors.NETWORK_EXCEPTION
    unwritten: int = errors.NETWORK_EXCEPTION

    def code(self, written: bool) -> int:
        return self.written if written else self.unwritten


# A route's planner; a local route's ``request`` is not decoded (empty): kfan answers from the header.
Side = Literal["request", "response"]


class Login(enum.Enum):
    """A login API's part in kfan's login exchange with a client (SASL)."""

    HANDSHAKE = "handshake"  # picks the mechanism (and, at v0, whether bare tokens follow)
    AUTHENTICATE = "authenticate"  # carries the mechanism's tokens


Planner = Callable[["Route[Any]", Context, RequestHeader, memoryview, Struct], Plan]
KeyOf = Callable[[Struct], Coordinator | None]  # the group or transaction a request belongs to; None: any broker
# An answer's identity rewrite: (what the core knows, kfan's identity among it; the client's request, the broker's
# answer, the answer's schema) -> the answer as kfan's, and the effects of what it said.
Rewriter = Callable[[Context, Struct, Struct, StructSpec], tuple[Struct, list[Effect]]]


@dataclass(frozen=True, slots=True)
class Route(Generic[P]):
    """Everything kfan knows about one API key: one row of :data:`proxy.core.routes.ROUTES`.

    Generic in the plan its merge takes (its planner's :class:`Forward`, or a subclass).
    """

    api: int
    plan: Planner
    merge: Merger[P] | None  # None: answered by kfan itself
    read_only: bool  # asking it again (retry, live replay) changes nothing on the cluster
    changes_topology: bool = False  # topics or partitions change: refresh the topology after it
    prefers_controller: bool = False  # ZooKeeper-era brokers serve it only on the controller
    layout: PartitionFields | None = None  # split by leader: where its partitions are
    batch: Batch | None = None  # its batched form, split by coordinator
    coordinator_key: KeyOf | None = None  # routed to the coordinator of this group or transaction
    rewrite: Rewriter | None = None  # the identity rewrite its answer needs
    broadcast_array: str | None = None  # asked of every broker: the answer's array they are concatenated by
    broker_configs: str | None = None  # the answer's array of config resources (BROKER ones name kfan)
    failure: BrokerFailure = BrokerFailure()
    versions: tuple[int, int] | None = None  # the versions kfan serves, where fewer than its schemas know
    records: Side | None = None  # the messages that carry record batches (Produce's request, Fetch's answers)
    # Its answers report partitions' watermarks, which a connection remembers for its next request (Fetch).
    watermarks: bool = False
    # A sub-request may be one sent ahead for an earlier request of the same partitions and offsets, reused (Fetch).
    sent_ahead: bool = False
    # When kfan authenticates its clients: may come before the client has logged in (ApiVersions, the login itself).
    before_login: bool = False
    # A login API (SASL): answered by the client connection's login exchange (:mod:`proxy.server.client_auth`), never
    # planned, and served and advertised only when kfan authenticates its clients.
    login: Login | None = None
    # Identical requests (the same version and body) from any clients, in flight at once, are sent once and share the
    # broker's answer: a read that depends on nothing but its body (Metadata, whose storms every client joins).
    shares_answers: bool = False
    # Share-session requests (KIP-932) travel on links of their own: they long-poll, and a broker ties a share
    # session to the connection it was opened on.
    share_session: bool = False
    # Client telemetry (KIP-714): answered by kfan's telemetry (:mod:`proxy.runtime.telemetry`) before any planning;
    # served and advertised only when kfan has telemetry subscriptions, as a broker only with a metrics plugin.
    telemetry: bool = False
    # Forwarded only when the brokers see the client as itself, else DELEGATION_TOKEN_REQUEST_NOT_ALLOWED: as kfan's
    # principal a client would get, or read, kfan's tokens (the delegation-token APIs).
    own_identity: bool = False
