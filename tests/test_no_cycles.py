"""No import circles between sibling modules, as import-linter's `acyclic_siblings` contract counts them:
every import, function-local and `if TYPE_CHECKING:` ones included, read statically by grimp.

A circle means neither module can be read (or changed) without the other. The three this suite guards were
the policy core's (config -> scheduler_registry -> scheduler -> config), the simulator's executor and its
speculation, and `bench serve`'s load generator and its prediction.
"""

from __future__ import annotations

import grimp
import pytest

ACYCLIC_PACKAGES = ("ref_engine.core", "sim")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("ref_engine", "sim", "serving_lab")


def cycle_breakers(graph: grimp.ImportGraph, package: str) -> dict[str, set[tuple[str, str]]]:
    """{package: the imports whose removal would leave its children acyclic}, for `package` and every
    package below it; empty when there is no circle."""
    found = {}
    if len(graph.find_children(package)) >= 2 and (breakers := graph.nominate_cycle_breakers(package)):
        found[package] = breakers
    for child in sorted(graph.find_children(package)):
        found.update(cycle_breakers(graph, child))
    return found


@pytest.mark.parametrize("package", ACYCLIC_PACKAGES)
def test_no_import_cycles_between_siblings(graph, package):
    assert cycle_breakers(graph, package) == {}


def test_bench_serve_and_its_prediction_depend_one_way(graph):
    """The load generator may call the prediction (`--simulate`); the prediction needs only the requests."""
    assert graph.find_shortest_chain("serving_lab.bench_serve", "serving_lab.bench_predict") is not None
    assert graph.find_shortest_chain("serving_lab.bench_predict", "serving_lab.bench_serve") is None


def test_a_cycle_is_found():
    """The check can fail: one import back from the scheduler's registry to the scheduler closes a circle."""
    graph = grimp.build_graph("ref_engine")
    graph.add_import(importer="ref_engine.core.scheduler_registry", imported="ref_engine.core.scheduler")
    assert set(cycle_breakers(graph, "ref_engine.core")) == {"ref_engine.core"}
