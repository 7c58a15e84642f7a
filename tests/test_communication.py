"""Communication volume per step (ZeRO paper, Sec. VII): about 2 Psi for stages 0-2, 3 Psi for 3."""
import numpy as np

from zerolib.core.communication import volume


def test_small_case_by_hand():
    # 1000 parameters on 4 workers: each ring collective sends 3 chunks of 250 elements.
    v = volume(1000, 4, [0, 1, 2, 3])
    assert list(v.elements) == [1500, 1500, 1500, 2250]
    assert list(v.bytes) == [3000, 3000, 3000, 4500]  # fp16 parameters and gradients


def test_widths_follow_each_collective():
    # fp32 gradients (reduce-scatter, 750 x 4) + bf16 parameters (all-gather, 750 x 2).
    assert int(volume(1000, 4, 1, "bf16-fp32-grads").bytes) == 4500


def test_one_worker_sends_nothing():
    assert list(volume(10**9, 1, [0, 1, 2, 3]).elements) == [0, 0, 0, 0]


def test_large_clusters_approach_2_and_3_psi():
    ratio = volume(7 * 10**9, 1024, [0, 1, 2, 3]).elements / (7 * 10**9)
    assert np.allclose(ratio, [2, 2, 2, 3], rtol=1e-3)
    assert volume(7 * 10**9, 1024, 3).elements / volume(7 * 10**9, 1024, 0).elements == 1.5
