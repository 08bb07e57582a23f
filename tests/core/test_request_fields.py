"""Every `Request` field says, where it is declared, whether it is what the request is (`given`: carried to
another replica) or how far a replica has served it (`served`: started afresh there), so a field added
later cannot cross disaggregation (sim/cluster.py) by accident."""

from __future__ import annotations

from dataclasses import dataclass, fields

from core.request import SERVING_STATE, Request, given, served


def classification(cls: type) -> dict[str, bool | None]:
    """{field: True for served, False for given, None for a field declared neither way}."""
    return {f.name: f.metadata.get("serving_state") for f in fields(cls)}


def test_every_field_is_given_or_served():
    unclassified = [name for name, serving in classification(Request).items() if serving is None]
    assert unclassified == [], "declare these Request fields with given() or served()"


def test_the_serving_state_is_the_progress_of_one_replica():
    assert SERVING_STATE == {"output_token_ids", "num_computed_tokens", "status", "num_preemptions",
                             "num_cached_tokens", "block_hashes", "first_scheduled_time", "first_token_time",
                             "token_times", "finish_time", "spec_token_ids"}
    assert {"request_id", "prompt_token_ids", "max_tokens", "tenant", "cache_salt", "user"}.isdisjoint(SERVING_STATE)


def test_a_plain_field_is_found_unclassified():
    @dataclass
    class Extended:
        request_id: str = given()
        progress: int = served(default=0)
        forgotten: int = 0

    assert classification(Extended) == {"request_id": False, "progress": True, "forgotten": None}
