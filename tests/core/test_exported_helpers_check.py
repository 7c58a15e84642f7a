"""Issue 24 item 9: the helpers the top level exports check their inputs at their door, with a
ValueError/TypeError naming the argument, instead of an AttributeError, inf, -1 or 0 bytes."""
import math

import pytest

import zerolib as zl
from zerolib.core.catalogue.nodes import bus_bandwidth
from zerolib.core.memory.pipeline_schedule import micro_batches_in_flight
from zerolib.core.step.collectives import ring_volume
from zerolib.core.step.parallel import bubble_fraction


@pytest.mark.parametrize("call, error, named", [
    (lambda: bus_bandwidth("dgx-h100", 64), TypeError, "ic"),
    (lambda: bubble_fraction(4, 0), ValueError, "micro_batches"),
    (lambda: bubble_fraction(0, 4), ValueError, "pipeline_parallel"),
    (lambda: bubble_fraction(4, 4, 0), ValueError, "chunks"),
    (lambda: micro_batches_in_flight(-1, 0), ValueError, "pipeline_parallel"),
    (lambda: micro_batches_in_flight(4, -1), ValueError, "pipeline_stage"),
    (lambda: micro_batches_in_flight(4, 4), ValueError, "pipeline_stage"),
    (lambda: micro_batches_in_flight(4, 0, micro_batches=0), ValueError, "micro_batches"),
    (lambda: ring_volume("all_reduce", 7 * 10**9, 8, 2**63), ValueError, "bits"),
    (lambda: ring_volume("all_reduce", 7 * 10**9, 8, 0), ValueError, "bits"),
])
def test_a_bad_argument_is_named(call, error, named):
    with pytest.raises(error, match=rf"^{named} must"):
        call()


def test_good_arguments_give_the_formulas():
    # (p - 1) / (v m), Narayanan et al. 2021: 3 / 8 for p 4, m 8; halved with two chunks.
    assert bubble_fraction(4, 8) == 3 / 8
    assert bubble_fraction(4, 8, 2) == 3 / 16
    # 1F1B: stage r of p keeps min(p - r, m) micro-batches in flight.
    assert int(micro_batches_in_flight(4, 0)) == 4
    assert int(micro_batches_in_flight(4, 3)) == 1
    assert int(micro_batches_in_flight(4, 0, micro_batches=2)) == 2
    # An all-reduce of 8 elements of 16 bits on 4 GPUs sends 2 x 3 chunks of 2 elements = 24 bytes.
    assert int(ring_volume("all_reduce", 8, 4, 16).sent) == 24
    ic = zl.interconnect("nvlink4")
    assert math.isfinite(float(bus_bandwidth(ic, 8)))
