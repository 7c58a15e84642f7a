"""One print, one stream output: ``zerolib notebooks`` merges the pieces a kernel's timed flush
splits a cell's stdout into, so a rerun writes the same notebook whatever the machine's load.

ipykernel sends buffered output on a timer; a ``print`` is two writes (the text, then the end of
line), and under load the timer can fire between them, so one line arrived as two outputs in one
run and one in the next (seen re-executing notebook 08 on a shared 2-core machine). nbval merges
adjacent streams before comparing (``nbval.plugin.coalesce_streams``); the re-execution did not.
"""
from __future__ import annotations

import copy

import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from zerolib.publish import notebooks


def _cell_with(*outputs):
    cell = new_code_cell("print('a')", execution_count=1)
    cell.outputs = list(outputs)
    return cell


def test_adjacent_pieces_of_one_stream_become_one_output():
    nb = new_notebook(cells=[_cell_with(
        new_output("stream", name="stdout", text="E = 8: 128 all-to-alls"),
        new_output("stream", name="stdout", text="\nE = 1: gathers\n"),
        new_output("stream", name="stderr", text="warning\n"),
        new_output("stream", name="stdout", text="after stderr\n"),
        new_output("execute_result", data={"text/plain": "1"}, execution_count=1),
        new_output("stream", name="stdout", text="after a result\n"))])
    before = copy.deepcopy(nb)
    out = notebooks.normalise(nb, "demo")
    assert [(o.output_type, o.get("name"), o.get("text")) for o in out.cells[0].outputs] == [
        ("stream", "stdout", "E = 8: 128 all-to-alls\nE = 1: gathers\n"),
        ("stream", "stderr", "warning\n"),              # another stream is not merged into it
        ("stream", "stdout", "after stderr\n"),
        ("execute_result", None, None),
        ("stream", "stdout", "after a result\n")]       # nor across another output
    assert nb == before                                 # the input is left as it was


@pytest.mark.slow
def test_a_flush_between_two_writes_is_one_output_after_reexecution(tmp_path):
    source = "import sys\nsys.stdout.write('one line')\nsys.stdout.flush()\nprint(', then the rest')"
    nb = new_notebook(cells=[new_code_cell(source)])
    executed = notebooks.execute(nb, tmp_path)
    assert [o.text for o in executed.cells[0].outputs] == ["one line", ", then the rest\n"]
    (output,) = notebooks.normalise(executed, "demo").cells[0].outputs
    assert (output.name, output.text) == ("stdout", "one line, then the rest\n")
