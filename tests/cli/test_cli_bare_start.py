"""`zerolib estimate --params 7B --gpus 64` answers from the model state's arithmetic alone: a
bare count has no architecture, link, experts or placement, so neither the working set, the
step's time nor the placement is imported, and the presets are not built (its start-up is timed
in benchmarks/bench_one_answer.py)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = ("import contextlib, io, json, sys\n"
         "from zerolib.cli import main\n"
         "with contextlib.redirect_stdout(io.StringIO()):\n"
         "    main({argv!r})\n"
         "print(json.dumps(sorted(m for m in sys.modules if m.startswith('zerolib.'))))")
# What only an architecture, a link or experts need.
LATER = ("zerolib.core.memory.working_set", "zerolib.core.memory.activations",
         "zerolib.core.memory.model_parallel", "zerolib.core.memory.expert_parallel",
         "zerolib.core.step.time", "zerolib.core.step.traffic", "zerolib.core.step.parallel",
         "zerolib.core.step.tables", "zerolib.core.memory.placement")


def imported(argv: list[str]) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)


def test_a_bare_count_imports_no_working_set_and_no_step_time():
    modules = imported(["estimate", "--params", "7B", "--gpus", "64"])
    assert "zerolib.core.estimate" in modules
    assert [m for m in LATER if m in modules] == []


@pytest.mark.parametrize("argv, needed", [
    (["estimate", "--model", "llama-2-7b", "--gpus", "8"], "zerolib.core.memory.working_set"),
    (["estimate", "--params", "7B", "--gpus", "64", "--link", "dgx-h100"], "zerolib.core.step.time"),
])
def test_an_architecture_or_a_link_imports_what_it_needs(argv, needed):
    assert needed in imported(argv)


def test_the_presets_are_built_when_first_named():
    probe = ("import json\n"
             "from zerolib.core.catalogue import models\n"
             "before = models._presets.cache_info().currsize\n"
             "from zerolib.core.catalogue.models import MODELS\n"
             "print(json.dumps([before, len(MODELS), models.MODELS is MODELS]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == [0, 11, True]
