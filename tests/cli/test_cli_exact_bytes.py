"""Issue 24, item 5: ``--bytes`` is parsed exactly; what is not an exact allowed width is refused."""
from __future__ import annotations

import pytest
from cli_support import estimate_json, run


@pytest.mark.parametrize("text, says", [
    ("1e-400,2,12", "--bytes parameters width of 'parameters' must be a whole number of bits"),
    ("2,1e-40,12", "--bytes gradients width of 'gradients' must be a whole number of bits"),
    ("-1e-400,2,12", "--bytes parameters width of 'parameters' must be a finite, non-negative"),
    ("1_0,2,12", "--bytes must be three numbers PARAMETERS,GRADIENTS,OPTIMIZER like 2,2,12"),
    ("2,2,1_2", "--bytes must be three numbers PARAMETERS,GRADIENTS,OPTIMIZER like 2,2,12"),
    ("2,2,12.0000000000000000001", "--bytes optimizer width of 'optimizer state' must be a whole"),
    ("2,2,1e9999", "--bytes optimizer width of 'optimizer state' must be at most 64 bytes"),
])
def test_widths_that_are_not_exact_allowed_values_are_refused(capsys, text, says):
    status, out, err = run(capsys, "estimate", "--params", "7B", "--gpus", "8", "--bytes", text)
    assert (status, out) == (2, "")
    assert err.startswith(f"zerolib estimate: error: {says}"), err


def test_exact_spellings_of_allowed_widths_are_read_exactly(capsys):
    # 0.125 bytes is one bit; 1.5e1 is 15; 64 the largest width.
    result = estimate_json(capsys, "--params", "8", "--gpus", "1", "--stage", "0",
                           "--bytes", "0.125,1.5e1,64")
    assert result["layout"]["parameters"] == 0.125 and result["layout"]["gradients"] == 15
    # 8 parameters x (0.125 + 15 + 64) bytes = 1 + 120 + 512 bytes.
    assert result["stages"][0]["total"] == 633
