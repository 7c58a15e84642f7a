"""Issue 24 item 9: the helpers the top level exports check their inputs at their door, with a
ValueError/TypeError naming the argument, instead of an AttributeError, inf, -1 or 0 bytes."""
import math

import pytest

import zerolib as zl


@pytest.mark.parametrize("call, error, named", [
    (lambda: zl.bus_bandwidth("dgx-h100", 64), TypeError, "ic"),
    (lambda: zl.bubble_fraction(4, 0), ValueError, "micro_batches"),
    (lambda: zl.bubble_fraction(0, 4), ValueError, "pipeline_parallel"),
    (lambda: zl.bubble_fraction(4, 4, 0), ValueError, "chunks"),
    (lambda: zl.micro_batches_in_flight(-1, 0), ValueError, "pipeline_parallel"),
    (lambda: zl.micro_batches_in_flight(4, -1), ValueError, "pipeline_stage"),
    (lambda: zl.micro_batches_in_flight(4, 4), ValueError, "pipeline_stage"),
    (lambda: zl.micro_batches_in_flight(4, 0, micro_batches=0), ValueError, "micro_batches"),
    (lambda: zl.ring_volume("all_reduce", 7 * 10**9, 8, 2**63), ValueError, "bits"),
    (lambda: zl.ring_volume("all_reduce", 7 * 10**9, 8, 0), ValueError, "bits"),
])
def test_a_bad_argument_is_named(call, error, named):
    with pytest.raises(error, match=rf"^{named} must"):
        call()


def test_good_arguments_give_the_formulas():
    # (p - 1) / (v m), Narayanan et al. 2021: 3 / 8 for p 4, m 8; halved with two chunks.
    assert zl.bubble_fraction(4, 8) == 3 / 8
    assert zl.bubble_fraction(4, 8, 2) == 3 / 16
    # 1F1B: stage r of p keeps min(p - r, m) micro-batches in flight.
    assert int(zl.micro_batches_in_flight(4, 0)) == 4
    assert int(zl.micro_batches_in_flight(4, 3)) == 1
    assert int(zl.micro_batches_in_flight(4, 0, micro_batches=2)) == 2
    # An all-reduce of 8 elements of 16 bits on 4 GPUs sends 2 x 3 chunks of 2 elements = 24 bytes.
    assert int(zl.ring_volume("all_reduce", 8, 4, 16).sent) == 24
    ic = zl.interconnect("nvlink4")
    assert math.isfinite(float(zl.bus_bandwidth(ic, 8)))
