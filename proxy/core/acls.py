"""ACL bindings and the decisions they make, with the semantics of Kafka's ``StandardAuthorizer``.

A binding says that a principal, from a host, may (ALLOW) or may not (DENY)
perform an operation on resources of one type, named literally, by the
wildcard ``*``, or by a prefix. A decision for (principal, host, operation,
resource) follows Kafka's rules, in Kafka's order:

1. a super user is allowed everything;
2. a DENY binding matching the principal (or ``User:*``), the host (or
   ``*``), the operation (or ALL) and the resource denies;
3. an ALLOW binding matching likewise allows, where an ALLOW of READ, WRITE,
   DELETE or ALTER also allows DESCRIBE and an ALLOW of ALTER_CONFIGS also
   allows DESCRIBE_CONFIGS (implied operations: DENY never implies);
4. otherwise the resource is denied, unless no binding at all names it (for
   any principal) and ``allow_if_no_acl`` (Kafka's
   ``allow.everyone.if.no.acl.found``) is set.

:meth:`Acls.allows_any` is Kafka's ``authorizeByResourceType`` (may the
principal perform the operation on some resource of a type: KIP-679's
idempotent producers). Parsing the ACL file's document is here too (the file's
reading and re-reading is the server's). Pure: no I/O.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


class Operation(enum.IntEnum):
    """Kafka's AclOperation, with its protocol codes."""

    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15


class ResourceType(enum.IntEnum):
    """Kafka's ResourceType, with its protocol codes."""

    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    LITERAL = 3
    PREFIXED = 4


class Permission(enum.IntEnum):
    DENY = 2
    ALLOW = 3


WILDCARD = "*"
ANONYMOUS = "User:ANONYMOUS"  # a client no one authenticated, as a broker names it
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"  # the one CLUSTER resource's name

# An ALLOW of the key allows these too (Kafka's AclEntry.supportedOperations implications).
_IMPLIED_BY: Mapping[Operation, frozenset[Operation]] = {
    Operation.DESCRIBE: frozenset({Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER, Operation.ALL}),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS, Operation.ALL}),
}


def allowing(op: Operation) -> frozenset[Operation]:
    """The operations whose ALLOW allows ``op``."""
    return _IMPLIED_BY.get(op, frozenset({op, Operation.ALL}))


@dataclass(frozen=True, slots=True)
class AclBinding:
    principal: str  # "User:alice", or "User:*"
    host: str  # an address as the client's connection shows it, or "*"
    resource_type: ResourceType
    resource_name: str  # "*" with LITERAL: every resource of the type
    pattern_type: PatternType
    operation: Operation
    permission: Permission

    def names(self, name: str) -> bool:
        """Whether the binding's resource pattern covers a resource called ``name``."""
        if self.pattern_type is PatternType.PREFIXED:
            return name.startswith(self.resource_name)
        return self.resource_name in (WILDCARD, name)


class Acls:
    """A set of bindings, indexed for decisions (immutable once built: a new file builds a new one)."""

    def __init__(self, bindings: Iterable[AclBinding] = (), super_users: Iterable[str] = (), allow_if_no_acl: bool = False) -> None:
        self.bindings = tuple(dict.fromkeys(bindings))
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_if_no_acl
        literal: dict[tuple[ResourceType, str], list[AclBinding]] = defaultdict(list)
        prefixed: dict[ResourceType, list[AclBinding]] = defaultdict(list)
        for b in self.bindings:
            if b.pattern_type is PatternType.PREFIXED:
                prefixed[b.resource_type].append(b)
            else:
                literal[(b.resource_type, b.resource_name)].append(b)
        self._literal = dict(literal)
        self._prefixed = dict(prefixed)
        self._by_type: dict[ResourceType, tuple[AclBinding, ...]] = {
            t: tuple(b for b in self.bindings if b.resource_type is t) for t in ResourceType
        }

    def __len__(self) -> int:
        return len(self.bindings)

    def _naming(self, resource_type: ResourceType, name: str) -> list[AclBinding]:
        found = list(self._literal.get((resource_type, name), ()))
        if name != WILDCARD:
            found.extend(self._literal.get((resource_type, WILDCARD), ()))
        found.extend(b for b in self._prefixed.get(resource_type, ()) if name.startswith(b.resource_name))
        return found

    def allows(self, principal: str, host: str, op: Operation, resource_type: ResourceType, name: str) -> bool:
        """Kafka's decision for one operation on one resource."""
        if principal in self.super_users:
            return True
        naming = self._naming(resource_type, name)
        if not naming:
            return self.allow_if_no_acl
        allowed = False
        allow_ops = allowing(op)
        for b in naming:
            if b.principal not in (principal, WILDCARD_PRINCIPAL) or b.host not in (host, WILDCARD):
                continue
            if b.permission is Permission.DENY:
                if b.operation in (op, Operation.ALL):
                    return False
            elif b.operation in allow_ops:
                allowed = True
        return allowed

    def allows_any(self, principal: str, host: str, op: Operation, resource_type: ResourceType) -> bool:
        """Kafka's ``authorizeByResourceType``: may the principal perform ``op`` on some resource of the type?

        Kafka's default implementation, which StandardAuthorizer keeps: first an ordinary decision for a resource
        named ``hardcode`` (so super users, ALLOWs covering that name, and ``allow_if_no_acl`` with no binding
        naming it pass); then, over the principal's bindings of the exact operation or ALL (no implied ones), a
        DENY of the literal ``*`` denies, an ALLOW of the literal ``*`` allows, and any other ALLOW allows unless a
        DENY dominates it (a literal by the same literal or a prefix of it; a prefix by a prefix of it).
        """
        if self.allows(principal, host, op, resource_type, "hardcode"):
            return True
        deny_literal: set[str] = set()
        deny_prefixes: list[str] = []
        allow_literal: list[str] = []
        allow_prefixes: list[str] = []
        wildcard_allow = False
        for b in self._by_type.get(resource_type, ()):
            if b.host not in (host, WILDCARD) or b.principal not in (principal, WILDCARD_PRINCIPAL):
                continue
            if b.operation not in (op, Operation.ALL):
                continue
            literal = b.pattern_type is PatternType.LITERAL
            if b.permission is Permission.DENY:
                if literal and b.resource_name == WILDCARD:
                    return False
                (deny_literal.add if literal else deny_prefixes.append)(b.resource_name)
            elif literal and b.resource_name == WILDCARD:
                wildcard_allow = True
            else:
                (allow_literal if literal else allow_prefixes).append(b.resource_name)
        if wildcard_allow:
            return True
        if any(name not in deny_literal and not _under(name, deny_prefixes) for name in allow_literal):
            return True
        return any(not _under(prefix, deny_prefixes) for prefix in allow_prefixes)


def _under(name: str, prefixes: Iterable[str]) -> bool:
    return any(name.startswith(p) for p in prefixes)


def user_principal(name: str | None) -> str:
    """A client's principal as Kafka names it: ``User:<login or certificate subject>``, else ``User:ANONYMOUS``."""
    return f"User:{name}" if name else ANONYMOUS


@dataclass(frozen=True, slots=True)
class Access:
    """Who a client is at kfan and from where, and the ACLs that judge it."""

    acls: Acls
    principal: str  # "User:alice"
    host: str  # the client's address, as ACL hosts name it


@dataclass(frozen=True, slots=True)
class Decision:
    """One decision made about a request: may the client perform the operation on the resource?"""

    operation: Operation
    resource_type: ResourceType
    name: str
    allowed: bool


# --- the ACL file's document ---------------------------------------------------------------------


class AclFileError(ValueError):
    """The ACL document is not valid (the message says where)."""


def _enum_value(kind: type[enum.IntEnum], text: Any, where: str) -> Any:
    """A name as Kafka's tools spell it, any case, with or without underscores ("IdempotentWrite")."""
    wanted = str(text).replace("_", "").replace("-", "").lower()
    for member in kind:
        if member.name.replace("_", "").lower() == wanted:
            return member
    names = ", ".join(m.name for m in kind)
    raise AclFileError(f"{where}: unknown {kind.__name__} {text!r} (one of {names})")


_BINDING_KEYS = frozenset(
    {"principal", "principals", "host", "hosts", "resource_type", "resource_name", "pattern_type", "operation", "operations", "permission"}
)


def _strings(entry: Mapping[str, Any], one: str, many: str, where: str, default: str | None = None) -> list[str]:
    if one in entry and many in entry:
        raise AclFileError(f"{where}: give {one} or {many}, not both")
    values = entry.get(many, [entry[one]] if one in entry else [] if default is None else [default])
    if not isinstance(values, list) or not values or not all(isinstance(v, str) and v for v in values):
        raise AclFileError(f"{where}: {many if many in entry else one} must be a non-empty string (or list of them)")
    return list(values)


def _principal(text: str, where: str) -> str:
    kind, sep, name = text.partition(":")
    if not sep or not kind or not name:
        raise AclFileError(f"{where}: principal {text!r} is not TYPE:NAME (User:alice, User:*)")
    return text


def parse_acls(document: Mapping[str, Any]) -> Acls:
    """The ACLs a parsed ACL file (TOML) states; raises :class:`AclFileError` naming the first problem."""
    unknown = set(document) - {"super_users", "allow_if_no_acl", "acls"}
    if unknown:
        raise AclFileError(f"unknown keys {sorted(unknown)} (expected super_users, allow_if_no_acl, acls)")
    super_users = document.get("super_users", [])
    if not isinstance(super_users, list) or not all(isinstance(u, str) for u in super_users):
        raise AclFileError('super_users must be a list of principals ("User:admin")')
    allow_if_no_acl = document.get("allow_if_no_acl", False)
    if not isinstance(allow_if_no_acl, bool):
        raise AclFileError("allow_if_no_acl must be true or false")
    entries = document.get("acls", [])
    if not isinstance(entries, list):
        raise AclFileError("acls must be an array of tables ([[acls]])")
    bindings: list[AclBinding] = []
    for i, entry in enumerate(entries, 1):
        where = f"acls #{i}"
        if not isinstance(entry, dict):
            raise AclFileError(f"{where}: not a table")
        if extra := set(entry) - _BINDING_KEYS:
            raise AclFileError(f"{where}: unknown keys {sorted(extra)}")
        if "resource_type" not in entry:
            raise AclFileError(f"{where}: resource_type is required")
        resource_type = _enum_value(ResourceType, entry["resource_type"], where)
        name = entry.get("resource_name", CLUSTER_NAME if resource_type is ResourceType.CLUSTER else None)
        if not isinstance(name, str) or not name:
            raise AclFileError(f'{where}: resource_name is required (a name, a prefix, or "*")')
        pattern = _enum_value(PatternType, entry.get("pattern_type", "LITERAL"), where)
        if resource_type is ResourceType.CLUSTER and (name != CLUSTER_NAME or pattern is not PatternType.LITERAL):
            raise AclFileError(f"{where}: a CLUSTER resource is the literal {CLUSTER_NAME!r}")
        permission = _enum_value(Permission, entry.get("permission", "ALLOW"), where)
        operations = [_enum_value(Operation, op, where) for op in _strings(entry, "operation", "operations", where)]
        principals = [_principal(p, where) for p in _strings(entry, "principal", "principals", where)]
        hosts = _strings(entry, "host", "hosts", where, default=WILDCARD)
        for principal in principals:
            for host in hosts:
                for op in operations:
                    bindings.append(AclBinding(principal, host, resource_type, name, pattern, op, permission))
    for user in super_users:
        _principal(user, "super_users")
    return Acls(bindings, super_users, allow_if_no_acl)


EVERYONE = Acls(allow_if_no_acl=True)  # no bindings, and everyone allowed everything
