"""The page's settings survive the URL query both ways, and a query that cannot be read says
so, one line per value, without losing the rest."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from zerolib.app.settings import (
    DEFAULTS,
    FIELDS,
    PLANNED_DEVICES,
    Settings,
    compact_config,
    from_query,
    pack_config,
    to_query,
    unpack_config,
)
from zerolib.core.catalogue.models import MODELS
from zerolib.core.catalogue.nodes import NODES

MISTRAL = Path(__file__).resolve().parents[1] / "data" / "mistral-7b-v0.3.json"


def test_defaults_round_trip_and_every_field_is_written():
    query = to_query(DEFAULTS)
    assert [key for key, _ in parse_qsl(query, keep_blank_values=True)] == list(FIELDS)
    assert from_query(query) == (DEFAULTS, ())


def test_an_uploaded_config_travels_packed_and_comes_back_exact():
    text = compact_config(json.loads(MISTRAL.read_text()))
    chosen = Settings(config=text, config_name="mistral-7b-v0.3", gpus=16, tokens=15_600_000_000_000)
    query = to_query(chosen)
    assert '"' not in query and "{" not in query          # packed, not spelt out
    assert len(query) < len(text) * 1.5                   # zlib keeps the address short
    assert from_query("?" + query) == (chosen, ())


def test_pack_is_zlib_then_urlsafe_base64_without_padding():
    import base64
    import zlib
    packed = pack_config('{"a":1}')
    assert "=" not in packed
    assert zlib.decompress(base64.urlsafe_b64decode(packed + "=" * (-len(packed) % 4))) == b'{"a":1}'
    assert unpack_config(packed) == '{"a":1}'


def test_the_servers_token_is_ignored_and_missing_fields_keep_the_defaults():
    assert from_query("token=abc123&gpus=128") == (replace(DEFAULTS, gpus=128), ())


@pytest.mark.parametrize("query, says", [
    ("gpus=0", "gpus must be a positive whole number, got '0'"),
    ("gpus=lots", "gpus must be a whole number like 64"),
    ("tokens=2Q", "tokens must be a count like 2T"),
    ("device=tpu", "device must be one of"),
    ("model=gpt-5", "model must be one of"),
    ("links=fibre", "links must be one of"),
    ("config=not-packed!", "config in the address is not a packed config.json"),
    ("colour=blue", "the address names 'colour', which the page does not take"),
])
def test_a_value_that_cannot_be_read_is_one_line_and_the_rest_is_kept(query, says):
    settings, problems = from_query(query + "&seq_len=8192")
    assert settings == replace(DEFAULTS, seq_len=8192)
    assert len(problems) == 1 and says in problems[0] and "\n" not in problems[0]


def test_suffixed_counts_are_read_exactly():
    """As everywhere in zerolib, K, M, B and T are powers of ten (1K GPUs is 1,000)."""
    settings, problems = from_query("tokens=15.6T&gpus=1K")
    assert problems == () and settings.tokens == 15_600_000_000_000 and settings.gpus == 1000


@hypothesis_settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(list(MODELS)), device=st.sampled_from(PLANNED_DEVICES),
       gpus=st.integers(1, 65536), per_node=st.integers(1, 64),
       links=st.sampled_from(["", *NODES]), seq=st.integers(1, 131072),
       batch=st.integers(1, 10**6), micro=st.integers(1, 1024),
       tokens=st.integers(1, 10**16), name=st.text(max_size=40).filter(str.isprintable),
       config=st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=8), max_size=5))
def test_any_settings_round_trip(model, device, gpus, per_node, links, seq, batch, micro, tokens,
                                 name, config):
    chosen = Settings(model=model, config=compact_config(config) if config else "",
                      config_name=name if config else "", device=device, gpus=gpus,
                      gpus_per_node=per_node, links=links, seq_len=seq, global_batch=batch,
                      micro_batch=micro, tokens=tokens)
    assert from_query(to_query(chosen)) == (chosen, ())


def test_every_chapter_link_of_the_page_lands_on_a_heading():
    """Each answer's "where the chapter explains it" names a chapter notebook and one of its
    headings (as JupyterLab anchors it): a renamed notebook or heading breaks the page's links."""
    import nbformat

    from zerolib.app.answers import SECTIONS
    from zerolib.paths import CHAPTER, NOTEBOOK_DIR
    for part, (notebook, heading) in SECTIONS.items():
        assert notebook.removesuffix(".ipynb") in CHAPTER, part
        nb = nbformat.read(NOTEBOOK_DIR / notebook, as_version=4)
        headings = {line.lstrip("#").strip() for c in nb.cells if c.cell_type == "markdown"
                    for line in c.source.splitlines() if line.startswith("#")}
        assert heading in headings, (part, notebook, heading)


def test_chapter_links_point_at_the_static_chapter_served_beside_the_page():
    """Relative links to `zerolib html`'s pages, which `zerolib app` serves at /chapter/: they
    work with no JupyterLab running (tests/browser/test_app_page.py follows each one)."""
    from zerolib.app.answers import section_address, section_link
    assert section_address("model") == "chapter/09-size-your-own-model.html#What-zerolib-read"
    assert section_address("state") == (
        "chapter/04-will-it-fit.html#Layer-1:-persistent-model-state")
    assert "127.0.0.1:8888" not in section_link("plan") and "/lab/tree/" not in section_link("run")


def test_a_run_in_the_address_is_the_run_file():
    # The share link packs the run file the page offers for download; reading it back gives the
    # page's settings; a file the run's door refuses is one line, and the page keeps its own.
    from zerolib.app.answers import read_model
    from zerolib.app.settings import DEFAULTS, Settings, from_query, pack_config, run_of, to_query
    settings = Settings(model="llama-2-13b", gpus=16, device="a100-80gb", seq_len=2048,
                        global_batch=256, micro_batch=2, layout="bf16-fp32-grads", engine="fsdp2")
    run = run_of(settings, read_model(settings))
    query = to_query(settings, run)
    assert query.startswith("run=") and "&" not in query
    assert from_query(query) == (settings, ())
    bad = pack_config('[model]\npreset = "llama-2-13b"\n[trainer]\nrecompute = "most"\n')
    back, problems = from_query(f"run={bad}")
    assert back == DEFAULTS and len(problems) == 1
    assert problems[0].startswith("run in the address: trainer.recompute must be one of")
