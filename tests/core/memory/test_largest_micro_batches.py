"""largest_micro_batches: every stage's largest fitting micro-batch from a few peaks, against a
scan of every micro-batch (the definition, with no search at all)."""
from dataclasses import replace

import pytest

from zerolib.core.catalogue.devices import get_device
from zerolib.core.memory import working_set
from zerolib.core.memory.working_set import WorkingSetSettings, largest_micro_batches, peak

STAGES = (0, 1, 2, 3)


def scanned(model, gpus, stage, settings, device, top):
    """The largest micro-batch up to ``top`` whose peak fits, by trying every one."""
    capacity = get_device(device).capacity
    fitting = [b for b in range(1, top + 1)
               if peak(model, gpus, stage, replace(settings, micro_batch=b)).total <= capacity]
    return max(fitting, default=0)


@pytest.mark.parametrize("model, gpus, settings, device", [
    ("llama-2-7b", 8, WorkingSetSettings(seq_len=4096, recompute="selective"), "h100-80gb"),
    ("llama-2-7b", 64, WorkingSetSettings(seq_len=2048, recompute="none",
                                          flash_attention=False), "a100-80gb"),
    ("llama-3-8b", 64, WorkingSetSettings(seq_len=2048, recompute="full"), "h100-80gb"),
    ("gpt2", 1, WorkingSetSettings(seq_len=1024), "v100-32gb"),
])
def test_matches_a_scan_of_every_micro_batch(model, gpus, settings, device):
    expected = tuple(scanned(model, gpus, stage, settings, device, 64) for stage in STAGES)
    assert largest_micro_batches(model, gpus, STAGES, settings, device=device,
                                 max_micro_batch=64) == expected


def test_nothing_fits_and_the_cap():
    # 7B on one A100 under plain DP: 16 bytes per parameter alone are over 80 GB.
    assert largest_micro_batches("llama-2-7b", 1, (0,), device="a100-80gb") == (0,)
    assert largest_micro_batches("gpt2", 1024, (3,), WorkingSetSettings(seq_len=128),
                                 device="h200-141gb", max_micro_batch=7) == (7,)
    assert largest_micro_batches("gpt2", 1024, (3,), WorkingSetSettings(seq_len=128),
                                 device="h200-141gb", max_micro_batch=1) == (1,)


def test_a_peak_that_does_not_grow_evenly_falls_back_to_bisection(monkeypatch):
    # A stand-in peak growing with the square of the micro-batch: the guess from 1 and 2 is
    # wrong, the answer must not be. 10 + b*b <= 410 up to b = 20.
    class Total:
        def __init__(self, total):
            self.total = total

    def fake_peaks(config, gpus, stages, settings, layout):
        return tuple(Total(10 + settings.micro_batch ** 2 * (1 + s)) for s in stages)

    monkeypatch.setattr(working_set, "peaks", fake_peaks)
    monkeypatch.setattr(working_set, "get_device", lambda device: type("D", (), {"capacity": 410}))
    # stage s: 10 + b*b*(1+s) <= 410  ->  b <= sqrt(400 / (1+s)): 20, 14, 11, 10
    assert largest_micro_batches("gpt2", 8, STAGES, max_micro_batch=64) == (20, 14, 11, 10)


def test_refuses_what_largest_micro_batch_refuses():
    with pytest.raises(ValueError, match="max_micro_batch"):
        largest_micro_batches("gpt2", 8, STAGES, max_micro_batch=0)
