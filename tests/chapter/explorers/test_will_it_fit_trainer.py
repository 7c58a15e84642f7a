"""The will-it-fit explorer takes the trainer (engine, recompute op-selective, fp8, compile) and
shows both peaks, named, with the one fits judges stated; each stage's numbers are estimate's for
the same run (a separate path: estimate builds the run's working set itself)."""
import pytest

import zerolib as zl
from zerolib.chapter.charts.will_it_fit import RECOMPUTE_WORDS
from zerolib.core.memory.activations import RECOMPUTE


def _estimate_rows(explorer):
    c = explorer.controls
    rows = {}
    for stage in (0, 1, 2, 3):
        fields = dict(device=c["device"].value, seq_len=c["seq_len"].value,
                      micro_batch=c["micro_batch"].value, recompute=c["recompute"].value,
                      flash_attention=c["flash_attention"].value, fp8=c["fp8"].value,
                      compile=c["compile"].value, stages=(stage,))
        if c["engine"].value == "torchtitan":
            fields.update(engine="torchtitan")
        else:    # the chapter's count at the explorer's own layout (estimate's paper engine)
            fields.update(engine="paper", layout=explorer.layout.name)
        if stage == 1 and c["engine"].value == "torchtitan":
            continue   # FSDP2 offers no stage 1 (estimate refuses it; the explorer shows it)
        (rows[stage],) = zl.estimate(c["model"].value, c["gpus"].value, **fields).stages
    return rows


@pytest.mark.parametrize("changes", [
    {"engine": "torchtitan"},
    {"engine": "torchtitan", "recompute": "op-selective", "fp8": True, "compile": True},
    {"recompute": "op-selective"},
    {"engine": "paper", "fp8": True, "micro_batch": 2},
])
def test_each_stage_shows_estimates_two_peaks_and_judges_as_it_does(changes):
    explorer = zl.WillItFitExplorer()
    for name, value in changes.items():
        explorer.controls[name].value = value
    assert explorer.status.value == ""
    from zerolib.chapter.explorers.will_it_fit import peak_rows
    shown = {row["stage"]: row for row in peak_rows(explorer.data, explorer.device)}
    for stage, found in _estimate_rows(explorer).items():
        row = shown[stage]
        assert (row["peak"], row["peak_reserved"], row["judges"]) == (
            found["peak"], found["peak_reserved"], found["fits_judges"]), stage
        assert row["fits"] == found["fits"], stage
    judged = "reserved peak" if changes.get("engine") == "torchtitan" else "peak"
    assert f"Fits? (the {judged})" in explorer.table.value
    assert "<th>Peak per GPU</th><th>Peak reserved</th>" in explorer.table.value
    assert f"Fits judges the {judged}" in explorer.summary.value


def test_the_reserved_peak_labels_the_bars_under_torchtitan():
    explorer = zl.WillItFitExplorer(engine="torchtitan")
    labels = [text.get_text() for text in explorer.artists.peak_labels.values()]
    assert all(label.endswith(" GB reserved") for label in labels)
    default = zl.WillItFitExplorer()
    assert not any("reserved" in text.get_text() for text in default.artists.peak_labels.values())


def test_every_recompute_the_toggle_offers_has_words():
    # op-selective was offered before it had words in the subtitle (a KeyError when chosen)
    assert set(RECOMPUTE_WORDS) == set(RECOMPUTE)
    explorer = zl.WillItFitExplorer(recompute="op-selective")
    assert "op-level selective recomputation" in explorer.summary.value


def test_the_layout_is_the_engines_unless_given():
    assert zl.WillItFitExplorer(engine="torchtitan").layout.name == "fp32-adam"
    assert zl.WillItFitExplorer().layout.name == "mixed-adam"
    assert zl.WillItFitExplorer(engine="torchtitan", layout="mixed-adam").layout.name == "mixed-adam"
    with pytest.raises(ValueError, match="engine"):
        zl.WillItFitExplorer(engine="colossal")
