"""The engineer's page in the kernel, without a browser: the query it opens with, an upload that
is read or refused in one line, a bad tokens entry, the preset menu, the share and CSV links, and
the engine wiring decided when answers are asked for."""
from __future__ import annotations

import base64
import datetime
import html
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from zerolib.app import answers as answering
from zerolib.app.answers import (
    answers,
    engine_choices,
    left_out_for,
    left_out_for_all,
    run_cost,
)
from zerolib.app.page import UPLOADED, EngineerPage, page_address, read_upload
from zerolib.app.settings import Settings
from zerolib.core.planner import PLAN_LEFT_OUT

MISTRAL = Path(__file__).resolve().parents[1] / "data" / "mistral-7b-v0.3.json"
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


def _file(name: str, content: bytes) -> tuple[dict, ...]:
    return ({"name": name, "type": "application/json", "size": len(content),
             "content": memoryview(content), "last_modified": NOW},)


@pytest.fixture(scope="module")
def page():
    return EngineerPage.from_environment({
        "QUERY_STRING": "gpus=16&token=secret", "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8866", "SCRIPT_NAME": "/"})


def test_the_query_sets_the_controls_and_the_share_link_keeps_them(page):
    assert page.controls["gpus"].value == 16 and page.settings.gpus == 16
    assert page.status.value == ""
    share = urlsplit(page.parts["share"].value.split("href='")[1].split("'")[0].replace("&amp;", "&"))
    assert (share.scheme, share.netloc, share.path) == ("http", "127.0.0.1:8866", "/")
    query = parse_qs(share.query, keep_blank_values=True)
    assert "token" not in query and set(query) == {"run"}
    # the link carries the run file the page offers for download: one file, two ways
    from zerolib.app.settings import from_query, unpack_config
    from zerolib.core.run_file import run_from_toml
    shared = run_from_toml(unpack_config(query["run"][0], "run"))
    assert shared == page.answers.asked and shared.cluster.gpus == 16
    download = page.parts["share"].value.split("href='data:application/toml;base64,")[1].split("'")[0]
    import base64
    assert run_from_toml(base64.b64decode(download).decode()) == shared
    # and reopens the page as it is
    assert from_query(share.query)[0] == page.settings


def test_an_uploaded_config_is_read_and_named(page):
    page.controls["upload"].value = _file("mistral-7b-v0.3.json", MISTRAL.read_bytes())
    assert page.controls["model"].value == UPLOADED
    assert page.settings.config_name == "mistral-7b-v0.3"
    assert "7,248,023,552 parameters" in page.parts["model"].value
    assert page.answers.errors == {}


@pytest.mark.parametrize("name, content, says", [
    ("broken.json", b'{"model_type": ', "broken.json: malformed JSON (line 1, column 16"),
    ("list.json", b"[1, 2]", "list.json: a config.json holds one JSON object, got list"),
    ("t5.json", b'{"model_type": "t5"}', "is an encoder or encoder-decoder"),
    ("big.json", b" " * 1_000_001, "big.json is 1,000,001 bytes"),
    ("latin.json", "{\"a\": \"\xe9\"}".encode("latin-1"), "latin.json cannot be read as JSON (it is not UTF-8"),
])
def test_a_config_that_cannot_be_read_is_one_line(name, content, says):
    page = EngineerPage()
    page.controls["upload"].value = _file(name, content)
    lines = page.status.value.split("</p>")[:-1]
    assert len(lines) == 1 and says in lines[0]
    assert lines[0].endswith("; the page still answers for llama-2-7b")
    assert page.answers.errors == {} and page.settings.config == ""   # the preset still answers
    assert page.controls["upload"].value == ()     # the file is not kept


def test_a_bad_tokens_entry_is_one_line_and_the_answers_stay():
    page = EngineerPage()
    before = page.answers
    page.controls["tokens"].value = "two trillion"
    assert "tokens must be a count like 2T" in page.status.value
    assert page.answers is before


def test_tokens_take_suffixes_and_a_preset_replaces_the_upload():
    page = EngineerPage()
    page.controls["upload"].value = _file("config.json", MISTRAL.read_bytes())
    assert page.controls["model"].options[0][0] == UPLOADED        # "config.json": no name
    assert page.settings.config_name == "config.json"              # not "mistral", its type
    page.controls["tokens"].value = "15.6T"
    assert page.settings.tokens == 15_600_000_000_000
    page.controls["model"].value = "llama-2-13b"
    assert page.settings.config == "" and page.settings.model == "llama-2-13b"
    assert [value for _, value in page.controls["model"].options][0] == "gpt2"


def test_the_csv_link_holds_the_plan_csv(page):
    html = page.parts["csv"].value
    data = html.split("base64,")[1].split("'")[0]
    assert base64.b64decode(data).decode() == answering.plan_csv(page.answers.plan) + "\n"


def test_a_setting_the_planner_refuses_is_said_where_it_is_answered():
    page = EngineerPage()
    page.controls["gpus"].value = 12
    assert "gpus (12) must fill whole nodes of gpus_per_node (8)" in page.parts["plan"].value
    assert "fits" in page.parts["state"].value        # the earlier answers still answer


def test_an_engine_the_step_model_does_not_know_is_one_line_and_the_default_answers():
    page = EngineerPage.from_environment({"QUERY_STRING": "engine=warp-drive"})
    lines = page.status.value.split("</p>")[:-1]
    assert len(lines) == 1 and "engine &#x27;warp-drive&#x27; is not one this zerolib" in lines[0]
    assert page.answers.errors == {} and page.settings.engine == engine_choices()[0][1]


def test_page_address_without_voila_is_relative():
    assert page_address({}, "gpus=8") == "?gpus=8"


def test_read_upload_names_the_model_after_the_file():
    import json
    text, name = read_upload(_file("dir/my-model.json", MISTRAL.read_bytes()))
    assert name == "my-model" and json.loads(text) == json.loads(MISTRAL.read_text())


# --- answers: the run, what each configuration leaves out, the engines -------------------------

def test_run_cost_by_hand():
    """10^9 tokens at 1,000 a step: 1,000,000 steps of 2 s = 2,000,000 s; 8 GPUs: 4,444.4 h."""
    cost = run_cost(10**9, 1000, 2.0, 8)
    assert (cost.steps, cost.seconds) == (1_000_000, 2_000_000.0)
    assert cost.gpu_hours == pytest.approx(8 * 2_000_000 / 3600)
    assert run_cost(1001, 1000, 1.0, 1).steps == 2        # a partial last step is a step


def test_what_each_configuration_leaves_out():
    plain = {"tensor_parallel": 1, "pipeline_parallel": 1, "recompute": "none", "offload": "none"}
    assert left_out_for(plain) == ()
    piped = left_out_for({**plain, "pipeline_parallel": 4, "recompute": "selective"})
    # The bubbles (item 1) and the exposed tensor/pipeline traffic (item 3); kernel efficiency
    # (item 0) concerns every configuration alike.
    assert [PLAN_LEFT_OUT.index(item) for item in piped] == [1, 3]
    assert [PLAN_LEFT_OUT.index(item) for item in
            left_out_for({**plain, "tensor_parallel": 8})] == [3]
    # Every item is said once: either for every row or for the rows it concerns.
    assert set(left_out_for_all()) | set(piped) == set(PLAN_LEFT_OUT)


def test_engines_are_offered_default_first_and_handed_to_the_core():
    # DeepSpeed 0.19.8 at its defaults is estimate's and plan's default engine, offered first.
    assert [name for _, name in engine_choices()] == ["deepspeed", "paper", "fsdp2", "megatron", "torchtitan"]
    a = answers(Settings())
    assert a.engine == "deepspeed" and a.engine_label.startswith("deepspeed (DeepSpeed 0.19.8")
    assert a.plan.settings.engine.name == "deepspeed"
    # Megatron-LM's distributed optimizer offers stages 0 and 1 only: those are what it answers.
    m = answers(Settings(engine="megatron"))
    assert [row["stage"] for row in m.state.stages] == [0, 1]
    assert [row["stage"] for row in m.peak.stages] == [0, 1]
    assert m.plan.settings.engine.name == "megatron"
    assert set(m.plan.fits["stage"]) <= {0, 1}
    # An engine the core does not know is one line for every answer after the model.
    bad = answers(Settings(engine="horovod"))
    assert bad.errors["plan"] == ("engine must be one of paper, deepspeed, fsdp2, megatron, torchtitan, "
                                  "got 'horovod'")


# --- issue 35: a refused upload keeps the model before it; names from the file ------------------

# Qwen2.5-14B's config.json as the Hub publishes it (no _name_or_path: transformers writes that
# only when it saves a config itself).
QWEN25_14B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
    "intermediate_size": 13824, "max_position_embeddings": 131072, "max_window_layers": 48,
    "model_type": "qwen2", "num_attention_heads": 40, "num_hidden_layers": 48,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 152064}
# By hand: per layer q 5,120^2 + 5,120, k and v 5,120 x 1,024 + 1,024 each, o 5,120^2, the MLP
# 3 x 5,120 x 13,824, two norms; 48 layers, two untied 152,064 x 5,120 tables, the final norm.
QWEN25_14B_COUNT = 48 * (5120 * 5120 + 5120 + 2 * (5120 * 1024 + 1024) + 5120 * 5120
                         + 3 * 5120 * 13824 + 2 * 5120) + 2 * 152064 * 5120 + 5120


def _json(data) -> bytes:
    import json
    return json.dumps(data).encode()


@pytest.mark.parametrize("file_name, extra, name", [
    ("config.json", {}, "config.json"),
    ("Qwen2.5-14B.json", {}, "Qwen2.5-14B"),
    ("config.json", {"_name_or_path": "Qwen/Qwen2.5-14B"}, "Qwen/Qwen2.5-14B"),
    ("config.json", {"_name_or_path": "/home/me/models/Qwen2.5-14B/"}, "models/Qwen2.5-14B"),
])
def test_an_uploaded_model_is_named_after_its_file_not_its_type(file_name, extra, name):
    page = EngineerPage()
    page.controls["upload"].value = _file(file_name, _json({**QWEN25_14B, **extra}))
    assert page.settings.config_name == name and page.answers.model.name == name
    assert f"<b>{name}</b>: {QWEN25_14B_COUNT:,} parameters" in page.parts["model"].value
    assert QWEN25_14B_COUNT == 14_770_033_664     # the 14.7B Qwen2.5's report gives
    assert "qwen2 on" not in page.parts["plan"].value


@pytest.mark.parametrize("content, says", [
    (_json({"model_type": "bert"}), "bad.json: field model_type: 'bert' is an encoder"),
    (b"[" * 100_000 + b"]" * 100_000, "bad.json: the text nests more than 32 levels deep"),
    (b" " * 20_000_000, "bad.json is 20,000,000 bytes"),
    (_json({**QWEN25_14B, "hidden_size": "5120"}), "bad.json: field hidden_size must be a whole"),
])
def test_a_bad_second_upload_keeps_the_good_first_and_says_so(content, says):
    page = EngineerPage()
    page.controls["upload"].value = _file("Qwen2.5-14B.json", _json(QWEN25_14B))
    first = page.settings
    page.controls["upload"].value = _file("bad.json", content)
    lines = [html.unescape(line) for line in page.status.value.split("</p>")[:-1]]
    assert len(lines) == 1 and says in lines[0], lines
    assert lines[0].endswith("; the page still answers for Qwen2.5-14B")
    assert page.settings == first and page.answers.model.name == "Qwen2.5-14B"
    assert page.controls["model"].value == UPLOADED
    assert f"{QWEN25_14B_COUNT:,} parameters" in page.parts["model"].value


def test_a_shared_link_with_a_config_the_reader_refuses_answers_for_the_preset_and_says_so():
    from zerolib.app.settings import pack_config
    deep = pack_config("[" * 100_000 + "]" * 100_000)
    assert len(deep) < 400                      # a short link carries it
    page = EngineerPage.from_environment({"QUERY_STRING": f"config={deep}&gpus=8"})
    lines = page.status.value.split("</p>")[:-1]
    assert len(lines) == 1 and "config in the address: the text nests more than 32" in lines[0]
    assert page.settings.config == "" and page.settings.gpus == 8 and page.answers.errors == {}


def test_the_idle_time_is_said_on_the_page_only_when_the_server_sets_one():
    from zerolib.app.page import IDLE_VARIABLE, idle_words
    assert idle_words({}) == ""
    assert "stops after 5 minutes without a change" in idle_words({IDLE_VARIABLE: "300"})
    assert "after 90 seconds" in idle_words({IDLE_VARIABLE: "90"})
    page = EngineerPage.from_environment({IDLE_VARIABLE: "60"})
    assert "stops after 1 minute without a change" in page.widget.children[0].value


def test_the_peak_answer_shows_both_peaks_and_what_the_verdict_judges():
    a = answers(Settings())
    text = answering.peak_html(a)
    assert "<th>Peak</th><th>Peak reserved</th>" in text and "the verdict judges the peak" in text
    t = answers(Settings(engine="torchtitan"))
    assert "the verdict judges the reserved peak" in answering.peak_html(t)
    # the plan takes the trainer too: both peaks per configuration, the reserved one judged
    assert "plan" not in t.errors and len(t.plan.fits)
    plan_text = answering.plan_html(t)
    assert "<th>Peak per GPU</th><th>Peak reserved</th><th>Headroom</th>" in plan_text
    assert "fit</b>: the reserved peak per GPU at most" in plan_text
    best = t.plan.fits.iloc[0]
    assert best["headroom_bytes"] == t.plan.settings.device.capacity - best["peak_reserved_bytes"]
    assert "fit</b>: the peak per GPU at most" in answering.plan_html(a)
