"""What one move sends to the browser, in what order, and what it draws again.

A move's widget changes reach the browser as one message each, handled in order, and the
reader waits for the figure: the image goes first, then the texts, and a text whose HTML did not
change is not sent. Counted here through ipywidgets' own send (a kernel-less comm takes the
messages in plain pytest).
"""
import pytest
from ipywidgets import Widget
from matplotlib.backends.backend_agg import RendererAgg

import zerolib as zl
from zerolib.chapter import explorers

EXPLORERS = {
    "gpu_count": (explorers.GpuCountExplorer, "params", 13 * 10**9),
    "model_size": (explorers.ModelSizeExplorer, "gpus", 16),
    "will_it_fit": (explorers.WillItFitExplorer, "micro_batch", 2),
    "placement": (explorers.PlacementExplorer, "gpus", 128),
    "step_time": (explorers.StepTimeExplorer, "gpus", 128),
    "planner": (explorers.PlannerExplorer, "gpus", 128),
    "shards": (explorers.ShardExplorer, "gpus", 8),
}


@pytest.fixture
def sent(monkeypatch):
    """The widgets whose state one move sends, in order."""
    log = []
    send = Widget._send

    def recording(self, msg, buffers=None):
        log.append(self)
        return send(self, msg, buffers)
    monkeypatch.setattr(Widget, "_send", recording)
    return log


@pytest.mark.parametrize("kind", EXPLORERS)
def test_a_move_sends_the_image_first_then_each_changed_text_once(kind, sent):
    cls, name, value = EXPLORERS[kind]
    explorer = cls()
    texts = {id(explorer.summary): "summary", id(explorer.table): "table",
             id(explorer.status): "status", id(explorer.image): "image"}
    summary, table = explorer.summary.value, explorer.table.value
    sent.clear()                              # what building it sent
    explorer.controls[name].value = value
    order = [texts[id(w)] for w in sent if id(w) in texts]
    assert order[0] == "image", order
    assert order.count("image") == 1
    # Each text at most once, and only when its HTML changed; status stays empty (not re-sent).
    assert order.count("summary") == (explorer.summary.value != summary)
    assert order.count("table") == (explorer.table.value != table)
    assert "status" not in order


def test_returning_to_a_setting_rasterises_no_text_again(monkeypatch):
    # Micro-batch 1 -> 2 -> 1 -> 2: at the last move every text (data labels, verdicts, the
    # capacity tag, titles, ticks) draws as it did after the first, on the same pixels.
    explorer = zl.WillItFitExplorer()
    for value in (2, 1):
        explorer.controls["micro_batch"].value = value
    drawn = []
    draw_text = RendererAgg.draw_text
    monkeypatch.setattr(RendererAgg, "draw_text",
                        lambda self, gc, x, y, s, *a, **k: (drawn.append(s),
                                                            draw_text(self, gc, x, y, s, *a, **k)))
    explorer.controls["micro_batch"].value = 2
    assert drawn == []


def test_a_will_it_fit_search_runs_once_per_setting(monkeypatch):
    # The fewest-GPUs search depends on the micro-batch; moving back to one searched before
    # takes the remembered answer (the search is a pure function of its inputs).
    explorer = zl.WillItFitExplorer()
    calls = []
    search = explorers.will_it_fit.fewest_gpus_for_peak
    monkeypatch.setattr(explorers.will_it_fit, "fewest_gpus_for_peak",
                        lambda *args: (calls.append(args), search(*args))[1])
    for value in (2, 1, 2, 1):
        explorer.controls["micro_batch"].value = value
    assert len(calls) == 1                     # micro-batch 2; 1 was searched when built
    table = explorer.table.value
    explorer.controls["micro_batch"].value = 2
    explorer.controls["micro_batch"].value = 1
    assert explorer.table.value == table
