"""The sans-IO core: from a client request to a routing plan, and from broker
answers to the client's response.

Nothing here touches sockets, clocks or trio: the same code runs in the
proxy, in unit and property tests, and in the Spark replay job. It imports
only :mod:`proxy.kafka` (and the standard library and kio).

- :mod:`.routes`: THE table, one row per API key; :func:`plan_request`.
- :mod:`.plan`: the values exchanged with the I/O layer (plans, answers, replies, effects).
- one module per policy: :mod:`.local`, :mod:`.leader` (with :mod:`.produce`
  and :mod:`.fetch`, and :mod:`.fetch_wait` for when a Fetch is answered),
  :mod:`.coordinator`, :mod:`.broadcast` (with :mod:`.log_dirs`), :mod:`.any_broker`;
  :mod:`.identity` rewrites broker identity in answers.
- :mod:`.topology`: the cluster snapshot routing works from; :mod:`.layout`:
  the generic split and merge of partition-keyed messages;
  :mod:`.read_replicas`: the preferred read replicas leaders named (KIP-392).
"""

from .plan import (
    ANY_BROKER,
    NO_FEATURES,
    NOT_YET,
    AnyBroker,
    BrokerAnswer,
    BrokerUnavailable,
    ClosesConnection,
    Context,
    Coordinator,
    Destination,
    Effect,
    Failed,
    Features,
    FetchAhead,
    FetchForward,
    FoldMetadata,
    ForgetCoordinators,
    ForgetReadReplicas,
    Forward,
    Identity,
    KeepShareSession,
    KeyType,
    LearnCoordinators,
    LearnReadReplicas,
    LocalReply,
    NeedCoordinators,
    Plan,
    ProducerBatchesNotSent,
    RefreshTopology,
    RememberWatermarks,
    ReopenShareSessions,
    Reply,
    Response,
    Route,
    ShareKey,
    ShareSession,
    SubRequest,
    Unsupported,
    Watermarks,
)
from .routes import ROUTES, advertised_versions, plan_request

__all__ = [
    "ANY_BROKER",
    "NOT_YET",
    "ROUTES",
    "AnyBroker",
    "BrokerAnswer",
    "BrokerUnavailable",
    "Context",
    "Coordinator",
    "Destination",
    "Effect",
    "Failed",
    "FetchAhead",
    "NO_FEATURES",
    "Features",
    "FetchForward",
    "FoldMetadata",
    "ForgetCoordinators",
    "ForgetReadReplicas",
    "Forward",
    "Identity",
    "KeyType",
    "LearnCoordinators",
    "KeepShareSession",
    "LearnReadReplicas",
    "LocalReply",
    "NeedCoordinators",
    "Plan",
    "ProducerBatchesNotSent",
    "RefreshTopology",
    "ReopenShareSessions",
    "RememberWatermarks",
    "Reply",
    "Response",
    "Route",
    "ShareKey",
    "ShareSession",
    "SubRequest",
    "Unsupported",
    "ClosesConnection",
    "Watermarks",
    "advertised_versions",
    "plan_request",
]
