"""The chapter tells one consistent story: every corrected claim of its prose held to zerolib, and
the shape of the chapter (order, links, definitions, no repeated figure or table) checked.

Each claim test reads a markdown cell by id, normalises its whitespace, and checks the phrases
that carry a number or a conclusion against values computed here with zerolib (the arithmetic in
the comments is worked by hand), so a change in the library that moves a number fails the
sentence until the text and the executed notebook follow.
"""
from __future__ import annotations

import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest
from PIL import Image

import zerolib as zl
from zerolib.chapter.explorers.base import STATIC_NOTE
from zerolib.core.memory.activations import layer_activation_terms
from zerolib.paths import CHAPTER

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
GB = 10**9
# The chapter's reading order: the main path, the optional notebooks, the appendix.
ORDER = list(CHAPTER)
PRESENT = [name for name in ORDER if (NOTEBOOKS / f"{name}.ipynb").is_file()]
SELECTIVE = zl.WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="selective")
FULL = zl.WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="full")
A100 = zl.get_device("a100-80gb")


def read(name: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)


def markdown(name: str) -> dict[str, str]:
    return {c.id: " ".join(c.source.split()) for c in read(name).cells if c.cell_type == "markdown"}


def says(text: str, *phrases: str):
    for phrase in phrases:
        assert phrase in text, f"expected {phrase!r} in: {text[:400]}..."


def gb(n_bytes, places=1) -> str:
    return f"{n_bytes / GB:,.{places}f}"


# --- 1. Model state is not the run: 70B on 64 A100s -----------------------------------------------

def test_no_room_to_spare_for_70b_on_64_gpus():
    text = markdown("03-memory-vs-model-size")
    assert not any("room to spare" in cell for cell in text.values())
    selective, full = (zl.peak("llama-2-70b", 64, 3, s) for s in (SELECTIVE, FULL))
    # 16 x 68,976,648,192 / 64 = 17.24 GB of model state; the activations of 80 layers at 4,096
    # tokens with selective recomputation are 108.9 GB of the 132.0 GB peak.
    assert selective.total > 130 * GB and zl.fewest_gpus_for_peak("llama-2-70b", 3, SELECTIVE,
                                                                   device=A100) is None
    assert full.total <= A100.capacity
    fewest_full = zl.fewest_gpus_for_peak("llama-2-70b", 3, FULL, device=A100)
    says(text["seventy-read"], f"{gb(selective.total)} GB per GPU at stage 3",
         f"activations alone are {gb(selective.working_set['activations'])} GB",
         "Its peak fits at no GPU count", f"full recomputation the peak falls to {gb(full.total)} GB",
         f"fits from {fewest_full} GPUs")
    says(text["summary"], f"{gb(selective.total)} GB with selective recomputation",
         f"{gb(full.total)} GB with full recomputation")


def test_the_older_cards_are_judged_on_the_peak_not_the_model_state():
    text = markdown("03-memory-vs-model-size")["seventy-read"]
    state = zl.model_state(zl.parameter_count("llama-2-70b"), 64, 3).total
    v100, rtx = zl.get_device("v100-32gb"), zl.get_device("rtx4090-24gb")
    assert state <= rtx.capacity <= v100.capacity                       # "would sit under" both
    full = zl.peak("llama-2-70b", 64, 3, FULL).total
    selective = zl.peak("llama-2-70b", 64, 3, SELECTIVE).total
    assert rtx.capacity < full <= v100.capacity and selective > v100.capacity
    says(text, f"{gb(full)} GB, fits the V100 32GB ({gb(v100.capacity)} GB) but not the RTX 4090 "
               f"24GB ({gb(rtx.capacity)} GB), and with selective recomputation neither")


# --- 2. "Model state fits" is named, and the will-it-fit section revisits it ------------------

@pytest.mark.parametrize("name", ["02-memory-vs-gpu-count", "03-memory-vs-model-size"])
def test_every_fit_judgement_says_what_it_judges(name):
    qualified = re.compile(r"model state|state|peak|the run|working set|Will it fit|fit\?", re.I)
    for cell_id, text in markdown(name).items():
        for sentence in re.split(r"(?<=[.;:])\s+(?=[A-Z(*-])", text):
            if re.search(r"\bfits?\b|\bfitting\b", sentence, re.I):
                assert qualified.search(sentence), f"{name} [{cell_id}]: {sentence}"


def test_the_model_state_judgements_are_revisited_on_the_peak():
    text = markdown("04-will-it-fit")["revisit-read"]
    cases = {("llama-2-7b", 2, 1): None, ("llama-2-13b", 64, 1): None, ("llama-2-70b", 14, 3): None}
    for model, gpus, stage in cases:
        result = zl.peak(model, gpus, stage, SELECTIVE)
        assert result.persistent["total"] <= A100.capacity < result.total   # state fits, run does not
    seven = zl.peak("llama-2-7b", 2, 1, SELECTIVE)
    says(text, "None of the three runs fits", f"stage 1 peaks at {gb(seven.total)} GB on 2 GPUs and "
               f"needs {zl.fewest_gpus_for_peak('llama-2-7b', 1, SELECTIVE, device=A100)}")
    # 13B at stage 1: 4 x 13,015,864,320 = 52.1 GB replicated + a 35.6 GB working set = 87.6 GB,
    # above 85.9 GB on any number of GPUs.
    thirteen = zl.peak("llama-2-13b", 64, 1, SELECTIVE)
    replicated = 4 * zl.parameter_count("llama-2-13b")
    assert replicated + thirteen.working_set_total > A100.capacity
    assert zl.fewest_gpus_for_peak("llama-2-13b", 1, SELECTIVE, device=A100) is None
    says(text, f"({gb(replicated)} GB) and its working set ({gb(thirteen.working_set_total)} GB) come "
               f"to {gb(replicated + thirteen.working_set_total)} GB")
    seventy = zl.peak("llama-2-70b", 14, 3, SELECTIVE)
    assert zl.fewest_gpus_for_peak("llama-2-70b", 3, SELECTIVE, device=A100) is None
    says(text, f"stage 3 peaks at {gb(seventy.total)} GB on 14 GPUs and never fits")
    # Sections 2 and 3 still show those three model-state judgements.
    assert zl.fewest_gpus(7e9, 1, device=A100) == 2
    assert zl.model_state_fits(13e9, 64, 1, device=A100) and zl.fewest_gpus(70e9, 3, device=A100) == 14


# --- 3. 14 GPUs for 70B, and how far the answers move with the reading of "80GB" ---------------

def test_fourteen_gpus_for_70b_is_explained_by_thirteen():
    text = markdown("02-memory-vs-gpu-count")["explorer-read"]
    state = 70e9 * 16
    assert state / 13 > A100.capacity >= state / 14      # 86.15 GB above 85.90, 80.0 below
    says(text, "on 13 each GPU would hold 1,120 GB / 13 = 86.2 GB, just above the 85.9 GB line",
         "on 14, 1,120 GB / 14 = 80.0 GB")
    decimal = zl.device_at("a100-80gb", "decimal")
    assert zl.fewest_gpus(70e9, 3, device=decimal) == 14 and decimal.capacity == 80 * GB == state / 14
    says(text, "the line drops to 80.0 GB and 14 GPUs still do")


def test_the_threshold_table_and_its_reading():
    text = markdown("02-memory-vs-gpu-count")
    moved = {}
    for basis in ("nominal", "decimal", "reported"):
        device = zl.device_at("h100-80gb", basis)
        for params, stage in ((13e9, 1), (30e9, 2), (70e9, 3), (7e9, 1)):
            moved.setdefault((params, stage), []).append(zl.fewest_gpus(params, stage, device=device))
    assert moved[(13e9, 1)] == [5, 6, 5] and moved[(30e9, 2)] == [17, 22, 17]
    assert moved[(70e9, 3)] == [14, 14, 14] and moved[(7e9, 1)] == [2, 2, 2]
    # At 5 GPUs 13B's stage 1 holds 13 x (4 + 12/5) = 83.2 GB: under 85.9, over 80.
    assert int(zl.model_state(13e9, 5, 1).total) == 83_200_000_000
    says(text["threshold-read"], "13B's stage 1 needs 6 GPUs instead of 5", "83.2 GB",
         "30B's stage 2 needs 22 instead of 17", "nvidia-smi's 85.5 GB moves nothing")
    says(text["threshold-intro"], "81,559 MiB = 85.5 GB")
    assert round(zl.device_at("h100-80gb", "reported").capacity / GB, 1) == 85.5
    says(text["summary"], "13B's stage 1 needs 6 GPUs instead of 5 and 30B's stage 2 22 instead of 17")


# --- 4. Static renders: the chapter never leaves a reader moving a dead slider ------------------

@pytest.mark.parametrize("name", PRESENT)
def test_no_claim_that_static_viewers_show_no_widgets(name):
    for text in markdown(name).values():
        assert "static viewers show no" not in text.lower()


def _has_explorer(name: str) -> bool:
    return any("application/vnd.jupyter.widget-view+json" in output.get("data", {})
               for cell in read(name).cells for output in cell.get("outputs", ()))


# The notebooks that show an explorer (06 shows the planner's figure and links to 08's explorer).
@pytest.mark.parametrize("name", [n for n in PRESENT if _has_explorer(n)])
def test_every_saved_explorer_says_it_needs_a_kernel(name):
    nb = read(name)
    states = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    values = [m["state"].get("value", "") for m in states.get("state", {}).values()
              if m.get("model_name") == "HTMLModel"]
    assert STATIC_NOTE in values, f"{name}: the saved explorer does not carry its static note"
    text = " ".join(markdown(name).values())
    says(text, "GitHub shows no widgets", "move")


# --- 5. Engines, terms and one citation ---------------------------------------------------------

def test_the_comparison_names_its_engines_and_the_amp_gradients():
    cells = markdown("04-will-it-fit")
    says(cells["working-intro"], "stage 0 is PyTorch's DDP, stages 1–3 are DeepSpeed's ZeRO")
    model = zl.get_model("llama-2-7b")
    ours = zl.peak(model, 8, 0, SELECTIVE)
    amp = zl.peak(model, 8, 0, SELECTIVE, layout="fp32-adam")
    # fp32 gradients: the bucket copy is 4 x 6,738,415,616 = 26.95 GB instead of 13.48.
    assert amp.working_set["ddp_buckets"] == 4 * zl.parameter_count(model) == 2 * ours.working_set["ddp_buckets"]
    says(cells["ddp-amp-read"], f"doubles to {gb(amp.working_set['ddp_buckets'], 2)} GB",
         f"from {gb(ours.total, 2)} to {gb(amp.total, 2)} GB")


def test_the_5as_over_h_term_is_named_for_what_it_is():
    text = markdown("04-will-it-fit")["working-intro"]
    assert "attention scores, their softmax" not in text
    says(text, "the softmax output (2 bytes an element), its dropout mask (1 byte) and the dropout's output (2 bytes)")
    # The same three tensors are 5as/h x sbh bytes in zerolib's Table 2 terms (a=4, s=64, b=2).
    terms = layer_activation_terms(64, 2, 64, 4)
    three = terms["softmax_output"] + terms["attention_dropout_mask"] + terms["attention_dropout_output"]
    assert three == 5 * 4 * 64 * 64 * 2


def test_one_form_of_the_korthikanti_citation_everywhere():
    texts = [p.read_text(encoding="utf-8") for p in [*NOTEBOOKS.glob("*.ipynb"), *REPO.glob("data/*.md"),
                                                     REPO / "README.md", *REPO.glob("zerolib/**/*.py")]]
    assert not any(re.search(r"Korthikanti et al\.?,? \(?2022", text) for text in texts)


def test_the_three_lessons_are_in_the_main_text():
    text = markdown("04-will-it-fit")["lessons-read"]
    sharded, buffers = zl.report.load_sharded(), zl.report.load_deepspeed_buffers()
    lessons = zl.report.sizing_lessons(sharded, buffers)
    assert lessons["measured"].iloc[0].startswith("1,000,000,000 B")
    assert "2.3x" in lessons["lesson"].iloc[1]
    assert "(-42.8%)" in lessons["lesson"].iloc[2] and "(+14.3%)" in lessons["lesson"].iloc[2]
    says(text, "1,000,000,000 bytes", "2.3 times its even share", "42.8% below", "14.3% above")


# --- shape: order, links, definitions, no repeats -----------------------------------------------

def test_the_index_lists_every_section_in_order():
    text = " ".join(markdown("00-index").values())
    positions = [text.find(f"]({name}.ipynb)") for name in PRESENT[1:]]
    assert all(p >= 0 for p in positions) and positions == sorted(positions)


def test_the_readme_table_lists_every_notebook_in_order():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    positions = [readme.find(f"(notebooks/{name}.ipynb)") for name in PRESENT]
    assert all(p >= 0 for p in positions) and positions == sorted(positions)


@pytest.mark.parametrize("name", PRESENT[1:])
def test_every_section_ends_with_previous_and_next(name):
    last = [c for c in read(name).cells if c.cell_type == "markdown"][-1].source
    previous, following = ORDER[ORDER.index(name) - 1], (ORDER + ["00-index"])[ORDER.index(name) + 1]
    assert "Previous:" in last and "Next:" in last, f"{name}: its last cell links neither way"
    assert f"({previous}.ipynb)" in last and f"({following}.ipynb)" in last, name


TERMS = {"all-gather": r"all-gathers?\b", "reduce-scatter": r"reduce-scatters?\b",
         "all-reduce": r"all-reduces?\b", "bucket": r"\bbuckets?\b", "prefetch": r"\bprefetch",
         "overlap": r"\boverlap"}


@pytest.mark.parametrize("term", TERMS)
def test_every_communication_term_is_defined_where_first_used(term):
    for name in PRESENT[1:]:                      # the index summarises; it defines nothing
        text = " ".join(markdown(name).values())
        if re.search(TERMS[term], text, re.I):
            assert re.search(r"\*\*" + TERMS[term].replace(r"\b", "") + r"\w*\*\*", text, re.I), (
                f"{term} is first used in {name} but not defined (in bold) there")
            return
    pytest.fail(f"{term} is never used")


def _images(nb) -> list[np.ndarray]:
    thumbnails = []
    for cell in nb.cells:
        for output in cell.get("outputs", ()):
            png = output.get("data", {}).get("image/png")
            if png:
                import base64
                image = Image.open(io.BytesIO(base64.b64decode(png))).convert("L").resize((96, 64))
                thumbnails.append(np.asarray(image, dtype=float))
    return thumbnails


@pytest.mark.parametrize("name", PRESENT)
def test_no_figure_is_shown_twice(name):
    thumbnails = _images(read(name))
    for i, a in enumerate(thumbnails):
        for b in thumbnails[i + 1:]:
            assert np.abs(a - b).mean() > 1.0, f"{name} shows the same figure twice"


@pytest.mark.parametrize("name", PRESENT)
def test_no_table_is_printed_twice(name):
    tables = [output["data"]["text/html"] for cell in read(name).cells for output in cell.get("outputs", ())
              if "text/html" in output.get("data", {})]
    assert len(tables) == len(set(tables)), f"{name} prints a table twice"


# --- the README's commands run as written -------------------------------------------------------

def _readme_commands() -> tuple[str, list[str]]:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```(?:bash|console)\n(.*?)```", readme, re.S)
    setup = blocks[0].strip().splitlines()[0]
    examples = [line[2:] for block in blocks[1:] for line in block.splitlines() if line.startswith("$ ")]
    return setup, examples


def test_the_index_install_command_is_the_readme_command():
    setup, _ = _readme_commands()
    assert f"```bash\n{setup}\n```" in read("00-index").cells[1].source


def test_readme_examples_run_as_written(tmp_path):
    _, examples = _readme_commands()
    assert examples, "the README shows no example"
    venv_bin = Path(sys.executable).parent
    for command in examples:
        argv = shlex.split(command)
        assert argv[0].startswith(".venv/bin/"), f"not runnable right after set-up: {command}"
        argv[0] = str(venv_bin / argv[0].removeprefix(".venv/bin/"))
        result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"{command}: {result.stderr[-500:]}"
