"""A device added to the catalogue alone is estimated and planned everywhere: the CLI's
``--device``, the planner with no links given (the node its entry names) and the planner's
explorer, with no edit anywhere else."""
import sys
from dataclasses import replace
from types import MappingProxyType

import pytest
from cli_support import estimate_json, run

import zerolib.chapter.explorers.planner  # noqa: F401  (loaded, so its names are patched too)
import zerolib.cli  # noqa: F401
from zerolib.core.catalogue import devices
from zerolib.core.catalogue.nodes import NODES
from zerolib.core.planner import plan

GiB = 2**30
# A made-up part: the H100's peak and node, 120 GiB. 7B parameters on 8 GPUs under stage 0 hold
# 16 x 7e9 = 112e9 bytes, under the 128.85e9 bytes of 120 GiB but over the A100's 80 GiB.
NEW = replace(devices.DEVICES["h100-80gb"], name="x900-120gb", label="X900 120GB",
              capacity=120 * GiB, source="a made-up part", node="dgx-h100")


@pytest.fixture
def catalogue(monkeypatch):
    """The catalogue with the new entry, wherever a module holds it (as editing the literal
    would give)."""
    old = devices.DEVICES
    new = MappingProxyType({**old, NEW.name: NEW})
    for module in list(sys.modules.values()):
        if getattr(module, "DEVICES", None) is old:
            monkeypatch.setattr(module, "DEVICES", new)
    return new


def test_every_device_names_a_catalogued_node_or_none():
    for device in devices.DEVICES.values():
        assert device.node is None or device.node in NODES, device.name


def test_the_new_device_is_estimated(catalogue, capsys):
    out = estimate_json(capsys, "--params", "7B", "--gpus", "8", "--device", NEW.name)
    assert out["device"] == {"name": NEW.name, "capacity": 128_849_018_880}
    rows = out["stages"]
    # Per GPU: stage 0 112e9, stage 1 28e9 + 84e9/8 = 38.5e9, stage 2 14e9 + 98e9/8 = 26.25e9,
    # stage 3 112e9/8 = 14e9 bytes: all within 128,849,018,880.
    assert [row["fits"] for row in rows] == [True, True, True, True]
    assert [row["total"] for row in rows] == [112 * 10**9, 38_500_000_000,
                                                         26_250_000_000, 14 * 10**9]


def test_the_new_device_is_planned_on_the_node_its_entry_names(catalogue, capsys):
    result = plan("llama-2-7b", 16, 8, NEW.name, 4096, 64)
    assert result.settings.interconnect.name == "dgx-h100"
    assert result.settings.device.capacity == 120 * GiB
    assert result.counts()["fit"] > 0
    status, out, err = run(capsys, "plan", "--model", "llama-2-7b", "--gpus", "16",
                           "--gpus-per-node", "8", "--device", NEW.name, "--seq", "4096",
                           "--global-batch", "64", "--top", "1")
    assert (status, err) == (0, "")
    assert NEW.label in out


def test_the_planner_explorer_offers_the_new_device(catalogue):
    from zerolib.chapter.explorers.planner import PlannerExplorer
    explorer = PlannerExplorer(model="llama-2-7b", gpus=16, device=NEW.name, global_batch=64)
    assert (NEW.label, NEW.name) in list(explorer.controls["device"].options)
    assert explorer.plan.settings.interconnect.name == "dgx-h100"
