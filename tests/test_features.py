"""The cluster's features (KIP-584) in kfan's own ApiVersions answer: merged from what each broker reports
(:func:`proxy.core.local.merged_features`), and sent from v3 on as a broker sends them."""

from __future__ import annotations

from proxy.core import Context, Features, LocalReply, plan_request
from proxy.core.local import merged_features
from proxy.core.topology import Topology
from proxy.kafka import apis
from tests.support import oracle
from tests.support.core_inputs import IDENTITY
from tests.support.golden import decode_reply, request_payload

BROKER_1 = Features(
    {"metadata.version": (7, 27), "transaction.version": (0, 2), "share.version": (0, 1)}, 12, {"transaction.version": (2, 2)}
)
# Mid-upgrade: an older broker supports less, and has not seen the newest finalized levels yet.
BROKER_2 = Features({"metadata.version": (7, 25), "transaction.version": (0, 2)}, 10, {"transaction.version": (1, 1)})


def test_a_feature_is_supported_where_every_broker_supports_it_and_finalized_as_of_the_newest_epoch() -> None:
    merged = merged_features([BROKER_1, BROKER_2])
    assert merged.supported == {"metadata.version": (7, 25), "transaction.version": (0, 2)}
    assert (merged.finalized_epoch, merged.finalized) == (12, {"transaction.version": (2, 2)})


def test_brokers_that_report_no_features_leave_them_out() -> None:
    assert merged_features([]) == Features()
    assert merged_features([Features(), BROKER_2]) == BROKER_2


def _answer(version: int, features: Features) -> dict:
    ctx = Context(IDENTITY, Topology(), {apis.API_VERSIONS: (0, 4)}, features=features)
    body = {"client_software_name": "t", "client_software_version": "1"} if version >= 3 else {}
    plan = plan_request(ctx, request_payload(apis.API_VERSIONS, version, body))
    assert isinstance(plan, LocalReply)
    body = b"".join(plan.body)
    assert oracle.read_back(apis.API_VERSIONS, version, "response", body) == body  # Kafka's schema reads it whole
    return decode_reply(apis.API_VERSIONS, version, body)


def test_api_versions_v3_and_later_carry_the_features_as_a_broker_sends_them() -> None:
    v4 = _answer(4, BROKER_1)
    assert {f["name"]: (f["min_version"], f["max_version"]) for f in v4["supported_features"]} == dict(BROKER_1.supported)
    assert v4["finalized_features_epoch"] == 12
    assert {f["name"]: (f["min_version_level"], f["max_version_level"]) for f in v4["finalized_features"]} == {
        "transaction.version": (2, 2)
    }
    v3 = _answer(3, BROKER_1)  # a broker leaves out the features whose lowest version is 0 before v4 (KIP-1022)
    assert [f["name"] for f in v3["supported_features"]] == ["metadata.version"]
    assert v3["finalized_features"] == v4["finalized_features"]
    v3 = _answer(3, BROKER_1)  # a broker leaves out the features whose lowest version is 0 before v4 (KIP-1022)
    assert [f["name"] for f in v3["supported_features"]] == ["metadata.version"]
    assert v3["finalized_features"] == v4["finalized_features"]
    v2 = _answer(2, BROKER_1)
    assert "supported_features" not in v2 and [a["api_key"] for a in v2["api_keys"]] == [apis.API_VERSIONS]


def test_without_features_the_answer_is_the_one_a_broker_without_them_sends() -> None:
    """A broker writes a tagged field only when it is not its default: librdkafka 2.0 (kcat) cannot read
    ApiVersions v3 with the three feature fields present but empty."""
    ctx = Context(IDENTITY, Topology(), {apis.API_VERSIONS: (0, 4)})
    body = {"client_software_name": "t", "client_software_version": "1"}
    plan = plan_request(ctx, request_payload(apis.API_VERSIONS, 3, body))
    assert isinstance(plan, LocalReply)
    answer = b"".join(plan.body)
    assert oracle.read_back(apis.API_VERSIONS, 3, "response", answer) == answer
    assert answer.endswith(b"\x00\x00\x00\x00\x00")  # throttle_time 0, then no tagged field at all
