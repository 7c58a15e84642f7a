"""The will-it-fit explorer takes a model of one's own (zl.model_from_config) in one line."""
import pytest
from conftest import REPO

import zerolib as zl
from zerolib.core.memory.tables import peak_frame

CONFIG = REPO / "tests" / "data" / "qwen2-0.5b.json"


def test_own_model_heads_the_list_and_draws_its_peaks():
    model = zl.model_from_config(CONFIG)
    explorer = zl.WillItFitExplorer(model=model, gpus=2, seq_len=2048, device="a10-24gb")
    control = explorer.controls["model"]
    assert control.options[0] == ("qwen2-0.5b (494M)", model) and control.value is model
    assert len(control.options) == len(zl.MODELS) + 1
    expected = peak_frame(model, 2, [0, 1, 2, 3], explorer.settings)
    assert explorer.data["bytes"].tolist() == expected["bytes"].tolist()
    control.value = "gpt2"          # the presets stay, and back again
    control.value = model
    assert explorer.model is model


def test_a_preset_list_without_one_is_unchanged():
    explorer = zl.WillItFitExplorer(model="gpt2", gpus=2, seq_len=1024, device="a10-24gb")
    assert len(explorer.controls["model"].options) == len(zl.MODELS)
    with pytest.raises(ValueError, match="model must be one of"):
        zl.WillItFitExplorer(model="my-model")
