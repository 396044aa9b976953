"""kfan's ACL decisions, rule by rule, as Kafka's StandardAuthorizer makes them (the differential test against the real
one is tests/test_authorization_differential.py); and the ACL file's document."""

from __future__ import annotations

import tomllib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.acls import CLUSTER_NAME, AclBinding, AclFileError, Acls, Operation, PatternType, Permission, ResourceType, parse_acls

T, G, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
ALLOW, DENY = Permission.ALLOW, Permission.DENY
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALICE, BOB = "User:alice", "User:bob"


def b(
    principal: str,
    op: Operation,
    name: str = "orders",
    pattern: PatternType = LIT,
    perm: Permission = ALLOW,
    t: ResourceType = T,
    host: str = "*",
) -> AclBinding:
    return AclBinding(principal, host, t, name, pattern, op, perm)


def test_no_binding_denies_unless_allow_if_no_acl() -> None:
    assert not Acls().allows(ALICE, "1.2.3.4", Operation.READ, T, "orders")
    assert Acls(allow_if_no_acl=True).allows(ALICE, "1.2.3.4", Operation.READ, T, "orders")


def test_any_binding_naming_the_resource_turns_allow_if_no_acl_off_for_everyone() -> None:
    acls = Acls([b(BOB, Operation.WRITE, host="10.0.0.1")], allow_if_no_acl=True)
    assert not acls.allows(ALICE, "1.2.3.4", Operation.READ, T, "orders")
    assert acls.allows(ALICE, "1.2.3.4", Operation.READ, T, "payments")  # named by nothing
    assert acls.allows(ALICE, "1.2.3.4", Operation.READ, G, "orders")  # another resource type


def test_super_users_are_allowed_despite_deny() -> None:
    acls = Acls([b("User:admin", Operation.ALL, perm=DENY)], super_users=["User:admin"])
    assert acls.allows("User:admin", "h", Operation.DELETE, T, "orders")


def test_literal_wildcard_and_prefixed_patterns() -> None:
    acls = Acls([b(ALICE, Operation.READ, "*"), b(BOB, Operation.READ, "pay", PRE)])
    assert acls.allows(ALICE, "h", Operation.READ, T, "anything")
    assert acls.allows(BOB, "h", Operation.READ, T, "payments")
    assert not acls.allows(BOB, "h", Operation.READ, T, "orders")
    assert not acls.allows(BOB, "h", Operation.READ, T, "pa")


def test_principal_and_host_wildcards() -> None:
    acls = Acls([b("User:*", Operation.READ), b(ALICE, Operation.WRITE, host="10.0.0.1")])
    assert acls.allows(BOB, "h", Operation.READ, T, "orders")
    assert acls.allows(ALICE, "10.0.0.1", Operation.WRITE, T, "orders")
    assert not acls.allows(ALICE, "10.0.0.2", Operation.WRITE, T, "orders")


@pytest.mark.parametrize("granted", [Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER, Operation.ALL])
def test_allowed_operations_imply_describe(granted: Operation) -> None:
    assert Acls([b(ALICE, granted)]).allows(ALICE, "h", Operation.DESCRIBE, T, "orders")


def test_alter_configs_implies_describe_configs_and_nothing_else_is_implied() -> None:
    acls = Acls([b(ALICE, Operation.ALTER_CONFIGS), b(BOB, Operation.CREATE)])
    assert acls.allows(ALICE, "h", Operation.DESCRIBE_CONFIGS, T, "orders")
    assert not acls.allows(ALICE, "h", Operation.DESCRIBE, T, "orders")
    assert not acls.allows(BOB, "h", Operation.DESCRIBE, T, "orders")
    assert not Acls([b(ALICE, Operation.DESCRIBE)]).allows(ALICE, "h", Operation.READ, T, "orders")


def test_deny_wins_and_implies_nothing_but_all() -> None:
    acls = Acls([b(ALICE, Operation.ALL), b(ALICE, Operation.READ, "ord", PRE, DENY)])
    assert not acls.allows(ALICE, "h", Operation.READ, T, "orders")
    assert acls.allows(ALICE, "h", Operation.DESCRIBE, T, "orders")  # DENY READ does not deny DESCRIBE
    deny_all = Acls([b(ALICE, Operation.READ), b(ALICE, Operation.ALL, "*", perm=DENY)])
    assert not deny_all.allows(ALICE, "h", Operation.DESCRIBE, T, "orders")
    deny_describe = Acls([b(ALICE, Operation.READ), b(ALICE, Operation.DESCRIBE, perm=DENY)])
    assert deny_describe.allows(ALICE, "h", Operation.READ, T, "orders")
    assert not deny_describe.allows(ALICE, "h", Operation.DESCRIBE, T, "orders")


def test_by_resource_type_as_kafkas_tests_state() -> None:
    """Cases of Kafka's BaseAuthorizerTest for authorizeByResourceType (prefix domination, wildcards)."""
    w = Operation.WRITE

    def any_write(*bindings: AclBinding) -> bool:
        return Acls(bindings).allows_any(ALICE, "h", w, T)

    assert not any_write()
    assert any_write(b(ALICE, w, "abcde"))
    assert not any_write(b(ALICE, w, "abcde"), b(ALICE, w, "abcd", PRE, DENY))
    assert any_write(b(ALICE, w, "abc", PRE), b(ALICE, w, "abc", perm=DENY))  # a literal DENY leaves "abcx" writable
    assert not any_write(b(ALICE, w, "abc", PRE), b(ALICE, w, "ab", PRE, DENY))
    assert not any_write(b(ALICE, w, "*"), b(ALICE, w, "*", perm=DENY))
    assert any_write(b(ALICE, w, "*"), b(ALICE, w, "abc", perm=DENY))
    assert not any_write(b(ALICE, Operation.READ, "abc"))  # no implied operations: READ is not WRITE
    assert any_write(b(ALICE, Operation.ALL, "abc"))
    assert any_write(b("User:*", w, "abc"))
    assert not any_write(b(BOB, w, "abc"))
    assert any_write(b(ALICE, w, "abc"), b(BOB, w, "*", perm=DENY))  # others' DENY is not alice's
    # The pre-check on a resource named "hardcode": a prefix of it allows, even with a DENY elsewhere.
    assert any_write(b(ALICE, w, "hard", PRE), b(ALICE, w, "abc", PRE, DENY))
    assert Acls(super_users=[ALICE]).allows_any(ALICE, "h", w, T)
    assert Acls(allow_if_no_acl=True).allows_any(ALICE, "h", w, T)


names = st.sampled_from(["orders", "ord", "o", "payments", "*"])


@given(
    st.lists(
        st.builds(
            AclBinding,
            st.sampled_from([ALICE, BOB, "User:*"]),
            st.sampled_from(["*", "h"]),
            st.just(T),
            names,
            st.sampled_from(list(PatternType)),
            st.sampled_from([Operation.READ, Operation.WRITE, Operation.DESCRIBE, Operation.ALL]),
            st.sampled_from(list(Permission)),
        ),
        max_size=6,
    ),
    st.sampled_from(["orders", "payments", "o"]),
)
def test_a_deny_for_the_principal_always_wins(bindings: list[AclBinding], name: str) -> None:
    acls = Acls(bindings)
    for op in (Operation.READ, Operation.WRITE, Operation.DESCRIBE):
        denied = any(
            x.permission is DENY and x.principal in (ALICE, "User:*") and x.operation in (op, Operation.ALL) and x.names(name)
            for x in bindings
        )
        if denied:
            assert not acls.allows(ALICE, "h", op, T, name)
        elif acls.allows(ALICE, "h", op, T, name):
            assert any(x.permission is ALLOW and x.names(name) for x in bindings)


FILE = """
super_users = ["User:admin"]

[[acls]]
principal = "User:alice"
resource_type = "topic"
resource_name = "orders-"
pattern_type = "prefixed"
operations = ["Read", "Describe", "IdempotentWrite"]

[[acls]]
principals = ["User:bob", "User:carol"]
hosts = ["10.0.0.1", "10.0.0.2"]
resource_type = "CLUSTER"
operation = "DESCRIBE_CONFIGS"
permission = "DENY"
"""


def test_the_file_document() -> None:
    acls = parse_acls(tomllib.loads(FILE))
    assert acls.super_users == {"User:admin"}
    assert not acls.allow_if_no_acl
    assert len(acls) == 3 + 2 * 2
    assert AclBinding("User:alice", "*", T, "orders-", PRE, Operation.IDEMPOTENT_WRITE, ALLOW) in acls.bindings
    assert AclBinding("User:carol", "10.0.0.2", C, CLUSTER_NAME, LIT, Operation.DESCRIBE_CONFIGS, DENY) in acls.bindings
    assert acls.allows("User:alice", "h", Operation.READ, T, "orders-eu")


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"acl": []}, "unknown keys"),
        ({"acls": [{"principal": "User:a", "resource_name": "x", "operation": "READ"}]}, "resource_type is required"),
        ({"acls": [{"principal": "alice", "resource_type": "TOPIC", "resource_name": "x", "operation": "READ"}]}, "not TYPE:NAME"),
        ({"acls": [{"principal": "User:a", "resource_type": "TOPIC", "resource_name": "x", "operation": "READS"}]}, "unknown Operation"),
        ({"acls": [{"principal": "User:a", "resource_type": "TOPIC", "operation": "READ"}]}, "resource_name is required"),
        ({"acls": [{"principal": "User:a", "resource_type": "CLUSTER", "resource_name": "c", "operation": "ALTER"}]}, "kafka-cluster"),
        ({"acls": [{"principal": "User:a", "resource_type": "TOPIC", "resource_name": "x", "operations": []}]}, "non-empty"),
        (
            {"acls": [{"principal": "User:a", "resource_type": "TOPIC", "resource_name": "x", "operation": "READ", "colour": 1}]},
            "unknown keys",
        ),
        ({"allow_if_no_acl": "yes"}, "true or false"),
    ],
)
def test_an_invalid_document_says_where(document: dict[str, object], problem: str) -> None:
    with pytest.raises(AclFileError, match=problem):
        parse_acls(document)
