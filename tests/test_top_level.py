"""The curated top level (`import zerolib as zl`): each name registered once, every name the
notebooks, the README and the benchmarks use present, and docs/api.md naming exactly these."""
from __future__ import annotations

import re
from collections import Counter

from conftest import DOCUMENTATION, REPO

import zerolib


def _registered(exports, modules) -> Counter:
    return Counter([name for _, names in exports for name in names] + [n for n, _ in modules])


def test_no_top_level_name_is_registered_twice():
    counts = _registered(zerolib._EXPORTS, zerolib._MODULE_ENTRIES)
    assert [name for name, n in counts.items() if n > 1] == []
    # The same check catches what the old dict-of-modules hid: traffic_frame twice.
    twice = (("zerolib.core.step.model_parallel_traffic", ("traffic_frame",)),
             ("zerolib.core.step.tables", ("traffic_frame",)))
    assert _registered(twice, ())["traffic_frame"] == 2


def test_each_module_is_listed_once():
    modules = [module for module, _ in zerolib._EXPORTS]
    assert len(modules) == len(set(modules))


def _used(text: str) -> set[str]:
    return set(re.findall(r"\bzl\.([A-Za-z_]\w*)", text))


def test_every_name_the_notebooks_readme_and_benchmarks_use_is_there():
    paths = [*sorted((REPO / "notebooks").glob("*.ipynb")), *DOCUMENTATION,
             *sorted((REPO / "benchmarks").glob("*.py")), *sorted((REPO / "tests").rglob("*.py"))]
    missing = {f"{path.name}: zl.{name}" for path in paths for name in _used(path.read_text())
               if name not in zerolib.__all__}
    assert missing == set()


def test_the_notebooks_use_most_of_it():
    # Curated: the top level is what the chapter needs plus a few entry points, not every helper.
    used = set().union(*(_used(p.read_text()) for p in (REPO / "notebooks").glob("*.ipynb")))
    # (the run's nouns are the door's; the shard explorer, frameworks; a trainer's files read as
    # runs; any decoder's config.json; one step's memory)
    assert len(zerolib.__all__) <= 113
    assert len(used & set(zerolib.__all__)) >= 0.8 * len(zerolib.__all__)


def test_docs_api_names_exactly_the_top_level():
    text = (REPO / "docs" / "api.md").read_text()
    documented = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            documented |= set(re.findall(r"`([A-Za-z_]\w*)`", first_cell))
    assert documented == set(zerolib.__all__)
    assert "docs/api.md" in (REPO / "README.md").read_text()
    assert "docs/api.md" in zerolib.__doc__


def test_every_name_resolves():
    for name in zerolib.__all__:
        assert getattr(zerolib, name) is not None, name
