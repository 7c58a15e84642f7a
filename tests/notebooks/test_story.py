"""The chapter tells one consistent story: every corrected claim of its prose held to zerolib, and
the README's order and no repeated figure or table checked (the chapter's shape, its parts,
openings, summaries and the things said once, is tests/notebooks/test_chapter_shape.py).

Each claim test reads a markdown cell by id, normalises its whitespace, and checks the phrases
that carry a number or a conclusion against values computed here with zerolib (the arithmetic in
the comments is worked by hand), so a change in the library that moves a number fails the
sentence until the text and the executed notebook follow.
"""
from __future__ import annotations

from conftest import DOCUMENTATION

import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from prose_support import NOTEBOOKS, markdown_cells, read_notebook, says

import zerolib as zl
from zerolib.core.memory.activations import layer_activation_terms, layer_shape
from zerolib.paths import CHAPTER

REPO = Path(__file__).resolve().parents[2]
GB = 10**9
# The chapter's reading order: the main path, the optional notebooks, the appendix.
ORDER = list(CHAPTER)
PRESENT = [name for name in ORDER if (NOTEBOOKS / f"{name}.ipynb").is_file()]
SELECTIVE = zl.WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="selective")
FULL = zl.WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="full")
A100 = zl.get_device("a100-80gb")


def gb(n_bytes, places=1) -> str:
    return f"{n_bytes / GB:,.{places}f}"


# --- 1. Model state is not the run: 70B on 64 A100s -----------------------------------------------

def test_no_room_to_spare_for_70b_on_64_gpus():
    text = markdown_cells("03-memory-vs-model-size")
    assert not any("room to spare" in cell for cell in text.values())
    selective, full = (zl.peak("llama-2-70b", 64, 3, s) for s in (SELECTIVE, FULL))
    # 16 x 68,976,648,192 / 64 = 17.24 GB of model state; the activations of 80 layers at 4,096
    # tokens with selective recomputation are 108.9 GB of the 132.0 GB peak.
    assert selective.total > 130 * GB and zl.fewest_gpus_for_peak("llama-2-70b", 3, SELECTIVE,
                                                                   device=A100) is None
    assert full.total <= A100.capacity
    fewest_full = zl.fewest_gpus_for_peak("llama-2-70b", 3, FULL, device=A100)
    says(text["seventy-read"], f"Recomputing only the attention core, Llama-2-70B peaks at "
                               f"{gb(selective.total)} GB per GPU at stage 3",
         f"activations alone are {gb(selective.working_set['activations'])} GB",
         "Its peak fits at no GPU count", f"Recomputing every layer, the peak falls to {gb(full.total)} GB",
         f"fits from {fewest_full} GPUs")
    says(text["summary"], f"{gb(selective.total)} GB recomputing only the attention core and "
                          f"{gb(full.total)} GB recomputing every layer")


def test_the_older_cards_are_judged_on_the_peak_not_the_model_state():
    # Beside the table it reads, in appendix A's A.6; notebook 3 points there.
    says(markdown_cells("03-memory-vs-model-size")["seventy-read"], "The older 32 and 24 GB cards fare no better "
         "([appendix A](11-appendix-papers-and-other-systems.ipynb))")
    text = markdown_cells("11-appendix-papers-and-other-systems")["main-seventy-read"]
    state = zl.model_state(zl.parameter_count("llama-2-70b"), 64, 3).total
    v100, rtx = zl.get_device("v100-32gb"), zl.get_device("rtx4090-24gb")
    assert state <= rtx.capacity <= v100.capacity                       # "would sit under" both
    full = zl.peak("llama-2-70b", 64, 3, FULL).total
    selective = zl.peak("llama-2-70b", 64, 3, SELECTIVE).total
    assert rtx.capacity < full <= v100.capacity and selective > v100.capacity
    says(text, f"the peak recomputing every layer, {gb(full)} GB, fits the V100 32GB ({gb(v100.capacity)} GB) "
               f"but not the RTX 4090 24GB ({gb(rtx.capacity)} GB), and recomputing only the attention core neither")


@pytest.mark.parametrize("name", ["01-bytes-per-parameter", "02-memory-vs-gpu-count", "03-memory-vs-model-size"])
def test_terms_of_the_peak_wait_for_section_4(name):
    """Recomputation, the peak and the working set are defined in 04: before it the chapter names
    no recomputation scheme and points forward where it first speaks of the peak."""
    cells = [c for c in read_notebook(name).cells if c.cell_type == "markdown"]
    assert not any(re.search(r"selective|full recomputation", c.source, re.I) for c in cells), name
    first = next((c for c in cells if re.search(r"\bpeaks?\b|working set|recomput", c.source, re.I)), None)
    assert first is None or "(04-will-it-fit.ipynb" in first.source, f"{name} [{first.id}]"


# --- 2. "Model state fits" is named, and the will-it-fit section revisits it ------------------

@pytest.mark.parametrize("name", ["02-memory-vs-gpu-count", "03-memory-vs-model-size"])
def test_every_fit_judgement_says_what_it_judges(name):
    qualified = re.compile(r"model state|state|peak|the run|working set|Will it fit|fit\?", re.I)
    for cell_id, text in markdown_cells(name).items():
        for sentence in re.split(r"(?<=[.;:])\s+(?=[A-Z(*-])", text):
            if re.search(r"\bfits?\b|\bfitting\b", sentence, re.I):
                assert qualified.search(sentence), f"{name} [{cell_id}]: {sentence}"


def test_the_model_state_judgements_are_revisited_on_the_peak():
    text = markdown_cells("04-will-it-fit")["revisit-read"]
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
    # Even on 64 GPUs, notebook 3's setting: 16 x 68,976,648,192 / 64 = 17.2 GB of model state,
    # a 132.0 GB peak; full recomputation is what lets stage 3 fit, from 16 GPUs.
    on_64 = zl.peak("llama-2-70b", 64, 3, SELECTIVE)
    assert on_64.persistent["total"] == 16 * zl.parameter_count("llama-2-70b") // 64
    says(text, f"even on 64 GPUs, where its model state is {gb(on_64.persistent['total'])} GB, the peak is "
               f"{gb(on_64.total)} GB", f"With full recomputation it fits from "
               f"{zl.fewest_gpus_for_peak('llama-2-70b', 3, FULL, device=A100)} GPUs")
    assert zl.peak("llama-2-70b", 16, 3, FULL).total <= A100.capacity < zl.peak("llama-2-70b", 15, 3, FULL).total
    says(text, '"Model state fits" is necessary', "only the peak says whether the run fits")
    # Sections 2 and 3 still show those three model-state judgements.
    assert zl.fewest_gpus(7e9, 1, device=A100) == 2
    assert zl.model_state_fits(13e9, 64, 1, device=A100) and zl.fewest_gpus(70e9, 3, device=A100) == 14


# --- 3. 14 GPUs for 70B, and how far the answers move with the reading of "80GB" ---------------

def test_fourteen_gpus_for_70b_is_explained_by_thirteen():
    text = markdown_cells("02-memory-vs-gpu-count")["explorer-read"]
    state = 70e9 * 16
    assert state / 13 > A100.capacity >= state / 14      # 86.15 GB above 85.90, 80.0 below
    says(text, "on 13 each GPU would hold 1,120 GB / 13 = 86.2 GB, just above the 85.9 GB line",
         "on 14, 1,120 GB / 14 = 80.0 GB")
    decimal = zl.device_at("a100-80gb", "decimal")
    assert zl.fewest_gpus(70e9, 3, device=decimal) == 14 and decimal.capacity == 80 * GB == state / 14
    says(text, "the line drops to 80.0 GB and 14 GPUs still do")


def test_the_threshold_table_and_its_reading():
    # Moved from notebook 2 to notebook 9 (the main path's hour); 2's summary points there.
    text = markdown_cells("09-size-your-own-model")
    says(markdown_cells("02-memory-vs-gpu-count")["summary"],
         'reading of "80GB" moves the answer ([notebook 9](09-size-your-own-model.ipynb))')
    moved = {}
    for basis in ("nominal", "decimal", "reported"):
        device = zl.device_at("h100-80gb", basis)
        for params, stage in ((13e9, 1), (30e9, 2), (70e9, 3), (7e9, 1)):
            moved.setdefault((params, stage), []).append(zl.fewest_gpus(params, stage, device=device))
    assert moved[(13e9, 1)] == [5, 6, 5] and moved[(30e9, 2)] == [17, 22, 17]
    assert moved[(70e9, 3)] == [14, 14, 14] and moved[(7e9, 1)] == [2, 2, 2]
    # 22 hangs on 6 bytes: on 21 GPUs each holds 2 bytes x 30e9 of fp16 parameters plus 14 bytes
    # for each of its ceil(30e9 / 21) = 1,428,571,429 parameters' share: 80,000,000,006 bytes.
    on_21 = 2 * 30 * 10**9 + 14 * 1_428_571_429
    decimal = zl.device_at("h100-80gb", "decimal")
    assert int(zl.model_state(30e9, 21, 2).total) == on_21 == decimal.capacity + 6
    says(text["threshold-read"], "on 21 GPUs 30B's stage 2 holds 80,000,000,006 bytes, 6 bytes over the 80 GB line")
    # At 5 GPUs 13B's stage 1 holds 13 x (4 + 12/5) = 83.2 GB: under 85.9, over 80.
    assert int(zl.model_state(13e9, 5, 1).total) == 83_200_000_000
    says(text["threshold-read"], "13B's stage 1 needs 6 GPUs instead of 5", "83.2 GB",
         "30B's stage 2 needs 22 instead of 17", "nvidia-smi's 85.5 GB moves nothing")
    says(text["threshold-intro"], "81,559 MiB = 85.5 GB")
    assert round(zl.device_at("h100-80gb", "reported").capacity / GB, 1) == 85.5


def test_the_fewest_gpus_table_is_read_at_its_own_settings():
    text = markdown_cells("02-memory-vs-gpu-count")["fewest-read"]
    fewest = {(p, s): zl.fewest_gpus(p * 10**9, s, device=A100) for p in (7, 13, 30, 70) for s in zl.STAGES}
    # 7B: 112 GB replicated without ZeRO; with any stage 2 GPUs (70, 63, 56 GB).
    assert fewest[(7, 0)] is None and fewest[(7, 1)] == fewest[(7, 2)] == fewest[(7, 3)] == 2
    assert fewest[(13, 1)] == 5 and fewest[(30, 1)] is None and (fewest[(30, 2)], fewest[(30, 3)]) == (17, 6)
    assert fewest[(70, 2)] is None and fewest[(70, 3)] == 14
    says(text, "7B needs ZeRO (any stage, from 2 GPUs)", "13B's fits with stage 1 from 5 GPUs",
         "30B's needs stage 2 (17 GPUs) or stage 3 (6 GPUs)", "70B's needs stage 3 (14 GPUs)")
    nb = read_notebook("02-memory-vs-gpu-count")
    (cell,) = [c for c in nb.cells if c.id == "fewest"]
    assert "explorer" not in cell.source and nb.cells.index(cell) < [c.id for c in nb.cells].index("explorer")


def test_the_explorers_readings_hold_at_their_settings():
    """The static readings beside the two explorers, at the settings each explorer starts with."""
    two = markdown_cells("02-memory-vs-gpu-count")["explorer-read"]
    # 70B: stage 1 keeps 4 bytes x 70e9 = 280 GB on every GPU, stage 2 keeps 2 x 70e9 = 140 GB.
    assert zl.fewest_gpus(70e9, 1, device=A100) is None and zl.fewest_gpus(70e9, 2, device=A100) is None
    says(two, "stage 1 keeps 280 GB of fp16 parameters and gradients on every GPU, stage 2 still 140 GB")
    three = markdown_cells("03-memory-vs-model-size")
    # 64 GPUs: 7B x 4.1875 = 29.3 GB, 13B 54.4 GB at stage 1; 30B x 2.21875 = 66.6 GB at stage 2.
    per_gpu = {(p, s): int(zl.model_state(p * 10**9, 64, s).total) for p, s in ((7, 1), (13, 1), (30, 2), (70, 3))}
    says(three["fits-read"], f"7B and 13B ({gb(per_gpu[(7, 1)])} and {gb(per_gpu[(13, 1)])} GB)",
         f"adds 30B ({gb(per_gpu[(30, 2)])} GB)", f"takes 70B ({gb(per_gpu[(70, 3)])} GB)")
    # 8 GPUs: 70B at stage 3 is 1,120 / 8 = 140 GB, 30B at stage 3 480 / 8 = 60 GB, at stage 2
    # 60 + 420 / 8 = 112.5 GB: only stage 3 holds 30B.
    assert int(zl.model_state(70e9, 8, 3).total) == 140 * GB and int(zl.model_state(30e9, 8, 3).total) == 60 * GB
    assert not zl.model_state_fits(30e9, 8, 2, device=A100) and zl.model_state_fits(30e9, 8, 3, device=A100)
    # 1T at stage 3: 16,000 GB / 186 = 86.02 GB is over 85.90, / 187 = 85.56 GB under it.
    assert zl.fewest_gpus(10**12, 3, device=A100) == 187
    says(three["explorer-read"], "(1,120 GB / 8 = 140 GB per GPU), and 30B's needs stage 3 (60 GB)",
         "70B's model state fits with stage 3 from 14 GPUs", "from 187 GPUs on (16,000 GB / 187 = 85.6 GB")


def test_the_papers_table_2_is_one_sentence_with_its_result():
    text = markdown_cells("03-memory-vs-model-size")["paper-intro"]
    # 64 GPUs of 32 x 10^9 bytes: 32e9 / 16 = 2.0B, / (4 + 12/64) = 7.64B, / (2 + 14/64) = 14.42B,
    # / (16/64) = 128.0B parameters.
    largest = [round(zl.largest_model(64, s, "mixed-adam", zl.paper.PAPER_V100) / 1e9, 1) for s in zl.STAGES]
    assert largest == [2.0, 7.6, 14.4, 128.0]
    says(text, "the same search gives the 2B, 7.6B, 14.4B and 128B of its Table 2",
         "(11-appendix-papers-and-other-systems.ipynb)")


# --- 4. Engines, terms and one citation ---------------------------------------------------------

def test_the_comparison_names_its_engines_and_the_amp_gradients():
    cells = markdown_cells("04-will-it-fit")
    says(cells["working-intro"], "stage 0 is PyTorch's DDP, stages 1–3 are DeepSpeed's ZeRO")
    model = zl.get_model("llama-2-7b")
    ours = zl.peak(model, 8, 0, SELECTIVE)
    amp = zl.peak(model, 8, 0, SELECTIVE, layout="fp32-adam")
    # fp32 gradients: the bucket copy is 4 x 6,738,415,616 = 26.95 GB instead of 13.48.
    assert amp.working_set["ddp_buckets"] == 4 * zl.parameter_count(model) == 2 * ours.working_set["ddp_buckets"]
    says(cells["peak-read"], f"doubles to {gb(amp.working_set['ddp_buckets'], 2)} GB",
         f"from {gb(ours.total, 2)} to {gb(amp.total, 2)} GB")


def test_the_5as_over_h_term_is_named_for_what_it_is():
    # Notebook 4 names Table 2 and links appendix A, whose activation table the derivation explains.
    says(markdown_cells("04-will-it-fit")["working-intro"], "Sec. 4 and Table 2, counted tensor by tensor in "
         "[appendix A](11-appendix-papers-and-other-systems.ipynb)")
    text = markdown_cells("11-appendix-papers-and-other-systems")["main-activations-intro"]
    assert "attention scores, their softmax" not in text
    says(text, "the softmax output (2 bytes an element), its dropout mask (1 byte) and the dropout's output (2 bytes)")
    # The same three tensors are 5as/h x sbh bytes in zerolib's Table 2 terms (a=4, s=64, b=2).
    terms = layer_activation_terms(layer_shape(64, 4), 64, 2)
    three = terms["softmax_output"] + terms["attention_dropout_mask"] + terms["attention_dropout_output"]
    assert three == 5 * 4 * 64 * 64 * 2


def test_one_form_of_the_korthikanti_citation_everywhere():
    texts = [p.read_text(encoding="utf-8") for p in [*NOTEBOOKS.glob("*.ipynb"), *REPO.glob("data/*.md"),
                                                     *DOCUMENTATION, *REPO.glob("zerolib/**/*.py")]]
    assert not any(re.search(r"Korthikanti et al\.?,? \(?2022", text) for text in texts)


def test_the_three_lessons_are_in_the_appendix():
    text = markdown_cells("12-appendix-real-runs")["lessons-read"]
    sharded, buffers = zl.report.load_sharded(), zl.report.load_deepspeed_buffers()
    lessons = zl.report.sizing_lessons(sharded, buffers)
    assert lessons["measured"].iloc[0].startswith("1,000,000,000 B")
    assert "2.3x" in lessons["lesson"].iloc[1]
    assert "(-42.8%)" in lessons["lesson"].iloc[2] and "(+14.3%)" in lessons["lesson"].iloc[2]
    says(text, "1,000,000,000 bytes", "2.3 times its even share", "42.8% below", "14.3% above")
    # The bucket against the measured model's state: 1,838,337 parameters on 4 ranks, stage 1
    # keeps 4 x P + 12 x ceil(P / 4) = 7,353,348 + 5,515,020 = 12,868,368 bytes; 10^9 over that
    # is 77.7 (stage 3's 16 x ceil(P / 4) = 7,353,360 gives 136), not "more than a hundred".
    measured = zl.report.load_deepspeed()
    params = set(measured.loc[(measured["model"] == "uneven") & (measured["workers"] == 4), "params"])
    assert params == {1_838_337}
    state = 4 * 1_838_337 + 12 * -(-1_838_337 // 4)
    assert state == 12_868_368 == zl.model_state(1_838_337, 4, 1).total
    says(text, f"{round(10**9 / state)} times the stage-1 model state of the 1.8M-parameter model measured on 4 ranks")
    assert "more than a hundred" not in text


# --- order and no repeats (the rest of the shape: tests/notebooks/test_chapter_shape.py) ---------------

def test_the_readme_table_lists_every_notebook_in_order():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    positions = [readme.find(f"(notebooks/{name}.ipynb)") for name in PRESENT]
    assert all(p >= 0 for p in positions) and positions == sorted(positions)


TERMS = {"all-gather": r"all-gathers?\b", "reduce-scatter": r"reduce-scatters?\b",
         "all-reduce": r"all-reduces?\b", "bucket": r"\bbuckets?\b", "prefetch": r"\bprefetch",
         "overlap": r"\boverlap"}


# The collectives are defined once, in 05's "The words"; the other notebooks link to its anchor,
# 05-the-price-of-zero.ipynb#The-words (JupyterLab's anchor of the heading "## The words").
DEFINER = "05-the-price-of-zero"


@pytest.mark.parametrize("term", TERMS)
def test_every_communication_term_is_defined_in_05s_words(term):
    cells = [c for c in read_notebook(DEFINER).cells if c.cell_type == "markdown"]
    (words,) = [i for i, c in enumerate(cells) if c.id == "words"]
    assert cells[words].source.startswith("## The words\n")
    assert re.search(r"\*\*" + TERMS[term].replace(r"\b", "") + r"\w*\*\*", cells[words].source, re.I), (
        f"{term} is not defined (in bold) in {DEFINER}'s The words")
    # Terms before use: no cell of 05 before The words uses the term.
    for cell in cells[:words]:
        assert not re.search(TERMS[term], cell.source, re.I), f"{DEFINER} uses {term} before The words"


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
    thumbnails = _images(read_notebook(name))
    for i, a in enumerate(thumbnails):
        for b in thumbnails[i + 1:]:
            assert np.abs(a - b).mean() > 1.0, f"{name} shows the same figure twice"


@pytest.mark.parametrize("name", PRESENT)
def test_no_table_is_printed_twice(name):
    tables = [output["data"]["text/html"] for cell in read_notebook(name).cells for output in cell.get("outputs", ())
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
    assert f"```bash\n{setup}\n```" in read_notebook("00-index").cells[1].source


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


# --- sentences corrected after an expert read (the units, the runs, the round sizes) -------------

def test_vendors_label_a_binary_capacity_gb():
    said = markdown_cells("01-bytes-per-parameter")["units-intro"]
    # An "80GB" A100 is 80 GiB = 80 x 2^30 = 85,899,345,920 bytes = 81,920 MiB.
    assert A100.capacity == 80 * 2**30 == 81_920 * 2**20
    says(said, 'GPU vendors label a binary capacity "GB" too', 'an "80GB" A100 holds 80 GiB',
         "the 81,920 MiB `nvidia-smi` reports, which is 85.9 GB")
    assert gb(A100.capacity) == "85.9"


def test_hbm_stacks_come_in_binary_sizes():
    said = markdown_cells("09-size-your-own-model")["threshold-intro"]
    # Five HBM stacks of 16 GiB each (A100 80GB: HBM2e; H100 SXM 80GB: HBM3).
    for name in ("a100-80gb", "h100-80gb"):
        assert zl.get_device(name).capacity == 5 * 16 * 2**30
    says(said, "HBM stacks come in binary sizes", "five stacks of 16 GiB")


def test_a_round_70b_beside_llama_2_70b():
    said = markdown_cells("03-memory-vs-model-size")["fits-read"]
    # 70 x 10^9 x 16 / 64 = 17.5 GB; 68,976,648,192 x 16 / 64 = 17.24 GB.
    assert zl.parameter_count("llama-2-70b") == 68_976_648_192
    says(said, f"Llama-2-70B's {gb(zl.parameter_count('llama-2-70b') * 16 // 64, 2)} GB "
               f"(17.5 for a round 70B) is model state only")


def test_ddp_buckets_are_resident_at_the_peak():
    said = markdown_cells("04-will-it-fit")["left-out"]
    # Stage 0 counts DDP's buckets (the gradients' bytes, 2 x 6,738,415,616 = 13.48 GB) in its
    # peak; stages 1-3 count DeepSpeed's buckets instead.
    stage0 = zl.peak("llama-2-7b", 8, 0, zl.WorkingSetSettings(seq_len=4096, micro_batch=1))
    assert stage0.working_set["ddp_buckets"] == 2 * zl.parameter_count("llama-2-7b")
    says(said, "DDP's buckets are allocated when the model is wrapped and stay resident",
         "so they are live at the peak", "not a guaranteed upper bound")
    assert "the buckets fill while activations are freed" not in said


def test_llama_2_7b_beside_the_round_7b():
    said = markdown_cells("05-the-price-of-zero")["timeline-intro"]
    # Stages 0-2 send 2 x 2 bytes x P x 63/64 per GPU: 26.53 GB for 6,738,415,616, 27.56 GB for 7B.
    sent = zl.traffic_frame(zl.parameter_count("llama-2-7b"), 64, [0, 1, 2]).groupby("stage")["sent_bytes"].sum()
    assert set(sent) == {6_738_415_616 * 4 * 63 // 64}
    round_7b = zl.traffic_frame(7_000_000_000, 64, [0]).groupby("stage")["sent_bytes"].sum()[0]
    says(said, f"Llama-2-7B ({zl.parameter_count('llama-2-7b') / 1e9:.2f} billion parameters: "
               f"{gb(sent[0], 2)} GB sent at stages 0-2, not the round 7B's {gb(round_7b, 2)} GB)")


def test_zero_in_your_framework_and_its_rule_of_thumb():
    cells = markdown_cells("05-the-price-of-zero")
    said = cells["frameworks-read"]
    sent = zl.traffic_frame(7_000_000_000, 64, [0, 1, 3]).groupby("stage")["sent_bytes"].sum()
    # 2 x 2 x 7e9 x 63/64 = 27.5625 GB; stage 3: 3/2 of it, 41.34 GB.
    assert sent[0] == sent[1] == 27_562_500_000 and sent[3] * 2 == sent[1] * 3
    paper = zl.ENGINES["paper"]
    assert 2 not in paper.pipeline_stages and 2 in paper.every_micro_batch
    says(said, "**Start at stage 1**", "1/N of the optimizer's 12 bytes per parameter",
         f"(the paper's schedule: {gb(sent[1], 2)} GB per step, 7B on 64 GPUs)", "does not run beside a pipeline",
         f"it sends 1.5x ({gb(sent[3], 2)} GB)", "no stage helps")
    assert "`zl.framework_table()`" in cells["frameworks-intro"]


def test_activations_with_and_without_the_logits():
    # The numbers per split moved from 06 to 08 with the main path's hour.
    said = markdown_cells("08-zero-beside-model-parallelism")["divide-read"]
    options = zl.WorkingSetSettings(recompute="selective", flash_attention=True).activation_options
    with_logits = zl.activation_bytes_per_gpu("llama-2-70b", 4096, 1, 1, 1, pipeline_stage=0, options=options)
    layers = zl.peak("llama-2-70b", 64, 3, SELECTIVE).working_set
    # One stage holds every layer and the logits: 108.85 GB of layers + 0.79 GB (4,096 x 32,000 x 6 B).
    assert with_logits - layers["activations"] == layers["logits_loss"] == 4096 * 32000 * 6
    says(said, "with the logits, which notebook 6's peak table kept apart",
         f"only from {gb(with_logits, 2)} to")


def test_why_nodes_of_16_for_zeropp():
    said = markdown_cells("07-shard-groups-and-offload")["zeropp-traffic-read"]
    says(said, "4 nodes of 16 (the nodes of 16 V100 GPUs of DeepSpeed's ZeRO++ tutorial)")


def test_who_holds_what_in_notebook_1():
    cells = markdown_cells("01-bytes-per-parameter")
    table = zl.memory_table(10**9, 4)
    # Across 4 workers: 4 x 16 = 64 GB; stage 1 4 x (2 + 2) + 12 = 28; stage 2 4 x 2 + 14 = 22;
    # stage 3 the 16 GB once.
    assert table["cluster_total"].tolist() == [64 * GB, 28 * GB, 22 * GB, 16 * GB]
    says(cells["cluster-read"], "four copies, 64 GB in all", "(28 GB in all)", "(22 GB)",
         "only stage 3 reaches the 16 GB floor")
    assert '`zl.published_figure("shards-by-stage")`' in cells["cluster-intro"]
    intro = markdown_cells("05-the-price-of-zero")["shards-step-intro"]
    assert "one layer of Llama-2-7B on 4 GPUs" in intro


def test_one_step_moment_by_moment():
    said = markdown_cells("04-will-it-fit")["step-memory-read"]
    settings = zl.WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="selective", flash_attention=True)
    frame = zl.step_memory_frame("llama-2-7b", 8, [3], settings)
    moments = frame.groupby("moment")["bytes"].sum()
    peak = zl.peak("llama-2-7b", 8, 3, settings).total
    # The optimizer step: 16 x ceil(P / 8) + 2 GiB + 10^9 = 13,476,831,232 + 2,147,483,648 + 10^9.
    assert moments.iloc[-1] == 16_624_314_880 and moments.max() == peak
    says(said, "Each stage's highest moment is the backward's first, and it is the peak above",
         f"at stage 3, {gb(peak)} GB, against {gb(moments.iloc[-1])} GB at the optimizer step")
    from zerolib.crosscheck.measured_peaks import measured_peaks, predicted_frame
    predicted = predicted_frame()
    within = int((abs(predicted["ratio"] - 1) <= 0.1).sum())
    assert within == 28
    says(said, f"against {len(measured_peaks())} published measured peaks, {within} of them within 10 %")


# --- the main path's hour: what moved out of 01-06 is pointed to where it now lives --------------

APPENDIX_A, APPENDIX_B = "11-appendix-papers-and-other-systems", "12-appendix-real-runs"
BESIDE, OWN = "08-zero-beside-model-parallelism", "09-size-your-own-model"
# (notebook it left, the cell that points on, where it lives now): the cells that moved there.
MOVED = {
    ("01-bytes-per-parameter", "worksheet-read", OWN): ("fp32-grads-intro", "fp32-grads", "fp32-grads-read"),
    ("02-memory-vs-gpu-count", "shapes-read", APPENDIX_A): ("main-gpus",),
    ("03-memory-vs-model-size", "fits-read", APPENDIX_A): ("main-fits", "main-seventy"),
    ("03-memory-vs-model-size", "seventy-read", APPENDIX_A): ("main-seventy-read",),
    ("05-the-price-of-zero", "overlap", APPENDIX_A): ("main-compute",),
    ("04-will-it-fit", "persistent-intro", APPENDIX_A): ("main-persistent",),
    ("04-will-it-fit", "working-intro", APPENDIX_A): ("main-activations", "main-working-set"),
    ("04-will-it-fit", "limits-intro", APPENDIX_A): ("main-limits",),
    ("05-the-price-of-zero", "schedule-read", APPENDIX_B): ("schedule",),
    ("05-the-price-of-zero", "traffic-read", APPENDIX_A): ("main-traffic", "limit", "limit-read"),
    ("05-the-price-of-zero", "links-intro", BESIDE): ("compare", "compare-read"),
    ("05-the-price-of-zero", "frameworks-read", BESIDE): ("accumulation-traffic-intro", "accumulation-traffic",
                                                          "accumulation-traffic-read"),
    ("06-when-zero-is-not-enough", "divide-intro", BESIDE): ("divide", "divide-read"),
    ("06-when-zero-is-not-enough", "fewest-read", APPENDIX_A): ("main-fewest-70b",),
}


@pytest.mark.parametrize("left, pointer, now", list(MOVED), ids=lambda v: str(v))
def test_what_moved_for_the_hour_is_pointed_to_where_it_lives(left, pointer, now):
    moved = MOVED[(left, pointer, now)]
    says(markdown_cells(left)[pointer], f"]({now}.ipynb")
    there = [c.id for c in read_notebook(now).cells]
    assert all(cell_id in there for cell_id in moved), f"{now} lacks {moved}"
    # Moved, not copied: no code cell of the notebook it left computes the same thing.
    sources = {c.source for c in read_notebook(left).cells if c.cell_type == "code"}
    for cell in read_notebook(now).cells:
        if cell.id in moved and cell.cell_type == "code":
            assert cell.source not in sources
