"""Tenants as the server knows them: who a request belongs to, and what that tenant may use.

A tenant comes from authentication only (an API key), never from a field the client fills in: the
tenant is the prefix cache's isolation boundary, so a client that could name another tenant could probe
that tenant's cached prefixes by timing. Without API keys the whole server is one tenant, as in vLLM
(everyone shares the cache; `cache_salt` still splits it); the request's `user` field may then group
requests for the "fair" policy, which is scheduling, not security.

`TenantPolicy` is one tenant's limits, from an API-key file (`--api-key-file`) or a deployment
manifest's `tenants:` section: its weight and running cap go to the engine's scheduler, its pending cap
and token budget are admission control in the API server (a 429, with `Retry-After` for the budget).

The key file maps each key to its tenant, optionally that tenant's `TenantPolicy` fields, and `"admin":
true` for an operator's key (which may reset every tenant's prefix cache):

    {"key-a": {"tenant": "acme", "weight": 3, "max_pending_requests": 16},
     "key-ops": {"tenant": "ops", "admin": true}}

A field in the key file wins over the manifest's value for the same tenant.

Lesson: lessons/06-architecture-map.md (the API server).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TenantPolicy:
    """One tenant's share and limits; None means "no limit of that kind"."""

    weight: float = 1.0  # the "fair" policy's share of the device
    max_num_seqs: int | None = None  # most of its requests running at once (engine)
    max_pending_requests: int | None = None  # most of its requests open in the server at once (429 past it)
    token_budget: int | None = None  # prompt + max_tokens it may send per window (429 + Retry-After past it)
    budget_window_s: float = 60.0  # the window `token_budget` counts over


POLICY_FIELDS = tuple(f.name for f in dataclasses.fields(TenantPolicy))


@dataclass(frozen=True)
class ApiKey:
    """What one API key grants: the tenant its requests run as; `admin` may reset every tenant's cache."""

    tenant: str
    admin: bool = False


@dataclass(frozen=True)
class KeyFile:
    """An `--api-key-file`: key -> `ApiKey`, and the `TenantPolicy` fields it sets, by tenant."""

    keys: dict[str, ApiKey]
    policy_fields: dict[str, dict[str, Any]]


def load_api_keys(path: str | Path) -> KeyFile:
    """Read a key file; a bad entry is a ValueError naming the key's position, the field and the fields
    accepted (the key itself is a secret, so it is never printed)."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON ({error})") from None
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{path}: expected a JSON object of key -> {{\"tenant\": ...}}")
    accepted = ", ".join(("tenant", "admin", *POLICY_FIELDS))
    keys: dict[str, ApiKey] = {}
    policy_fields: dict[str, dict[str, Any]] = {}
    for i, (key, entry) in enumerate(raw.items()):
        where = f"{path}: key #{i}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected an object with a \"tenant\"; fields: {accepted}")
        unknown = sorted(set(entry) - {"tenant", "admin", *POLICY_FIELDS})
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {unknown}; fields: {accepted}")
        tenant, admin = entry.get("tenant"), entry.get("admin", False)
        if not isinstance(tenant, str) or not tenant:
            raise ValueError(f"{where}: tenant must be a non-empty string, got {tenant!r}")
        if not isinstance(admin, bool):
            raise ValueError(f"{where}: admin must be true or false, got {admin!r}")
        fields = {name: entry[name] for name in POLICY_FIELDS if name in entry}
        check_policy(TenantPolicy(**fields), where)
        earlier = policy_fields.setdefault(tenant, {})
        clash = sorted(name for name in fields if name in earlier and earlier[name] != fields[name])
        if clash:
            raise ValueError(f"{where}: tenant {tenant!r} already has other {clash} from an earlier key")
        earlier.update(fields)
        keys[key] = ApiKey(tenant, admin)
    return KeyFile(keys, policy_fields)


def check_policy(policy: TenantPolicy, where: str) -> None:
    """A ValueError naming the field when a limit is not a positive number of its kind."""

    def positive_int(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1

    def positive(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")

    checks = {"weight": (positive, "a positive number"), "budget_window_s": (positive, "a positive number"),
              "max_num_seqs": (positive_int, "a positive integer or null"),
              "max_pending_requests": (positive_int, "a positive integer or null"),
              "token_budget": (positive_int, "a positive integer or null")}
    for name, (ok, accepted) in checks.items():
        value = getattr(policy, name)
        if not (value is None and accepted.endswith("or null")) and not ok(value):
            raise ValueError(f"{where}: {name} must be {accepted}, got {value!r}")


def tenant_policies(manifest: dict[str, TenantPolicy] | None, key_file: KeyFile | None) -> dict[str, TenantPolicy]:
    """Every tenant's policy: the manifest's (by tenant name), with the key file's fields written over it;
    a tenant only the key file names starts from the defaults."""
    policies = dict(manifest or {})
    for tenant, fields in (key_file.policy_fields if key_file else {}).items():
        policies[tenant] = dataclasses.replace(policies.get(tenant, TenantPolicy()), **fields)
    return policies


def tenant_knobs(policies: dict[str, TenantPolicy], scheduling_policy: str) -> dict[str, Any]:
    """The `EngineConfig` knobs the tenants set: running caps under every policy, weights only under
    "fair" (the one policy that shares the device by weight)."""
    knobs: dict[str, Any] = {}
    caps = {name: p.max_num_seqs for name, p in policies.items() if p.max_num_seqs is not None}
    if caps:
        knobs["tenant_max_num_seqs"] = caps
    if scheduling_policy == "fair" and policies:
        knobs["tenant_weights"] = {name: p.weight for name, p in policies.items()}
    return knobs
