"""``zerolib crosscheck``: Korthikanti et al.'s models and Megatron-LM's theoretical memory
estimate beside zerolib's, the values worked out here by hand."""
import json

from cli_support import run


def test_the_tables_name_both_checks(capsys):
    status, out, err = run(capsys, "crosscheck")
    assert (status, err) == (0, "")
    assert out.startswith("Korthikanti et al., MLSys 2023, arXiv 2205.05198: Table 3's models through zerolib")
    assert "Megatron-LM theoretical_memory_usage.py (commit d98e8a64ddf3)" in out
    # 22B, tensor parallel alone: sbh(10 + 24/t + 5as/(ht)) = 50,331,648 x 26 1/3 bytes
    # = 1,325,400,064 = 1.23 GiB, the baseline itself.
    assert any(line.split()[:3] == ["22B", "tensor", "parallel"] and line.split()[3:5] == ["1.23", "100.0%"]
               for line in out.splitlines())


def test_json_holds_the_exact_bytes(capsys):
    status, out, err = run(capsys, "crosscheck", "--format", "json")
    assert (status, err) == (0, "")
    data = json.loads(out)
    # 22B: Narayanan et al.'s Eq. 2, 12 L h^2 + 13 L h + (V + s) h with L = 48, h = 6144,
    # V = 51,200, s = 2,048; zerolib counts the final LayerNorm (2h) too.
    sizes = {r["model"]: r for r in data["korthikanti_parameters"]}
    h, L = 6144, 48
    eq2 = 12 * L * h * h + 13 * L * h + (51_200 + 2048) * h
    assert sizes["22B"]["narayanan_eq2"] == eq2 == 22_074_261_504
    assert sizes["22B"]["parameters"] == eq2 + 2 * h
    baseline = next(r for r in data["korthikanti"]
                    if r["model"] == "22B" and r["technique"] == "tensor parallel")
    assert baseline["layer_bytes"] == 2048 * 4 * 6144 * 79 // 3 == 1_325_400_064
    assert baseline["share_of_baseline"] == "1"
    assert set(data["korthikanti_printed"]) >= {"selective saving, 175B", "deallocation, 530B"}
    rows = {(r["model"], r["item"]): r for r in data["megatron_theoretical_memory"]}
    # 175B, t = 8, p = 8 (first stage): Megatron-LM charges (12 h^2 L / p + V h) / t
    # + (4 h L + 2 h) / p parameters, 18 bytes each.
    h, L, V = 12_288, 96, 51_200
    megatron = 18 * ((12 * h * h * L // 8 + V * h) / 8 + (4 * h * L + 2 * h) / 8)
    assert rows[("175B", "weights and optimizer")]["megatron_bytes"] == int(megatron)
    # 22B, t = 8, p = 1: zerolib adds what Megatron-LM leaves out, 48 layers' biases (QKV 3h and
    # fc1 4h split 8 ways, two row-parallel h whole) and the learned positions (s h), 18 bytes each.
    h, L = 6144, 48
    assert rows[("22B", "weights and optimizer")]["difference_bytes"] == 18 * (
        L * (7 * h // 8 + 2 * h) + 2048 * h) == 241_754_112
    assert rows[("22B", "weights and optimizer")]["differs_by"] == "no-linear-biases"
    # Every difference is positive: zerolib counts what the estimate leaves out.
    assert all(r["difference_bytes"] > 0 for r in rows.values())


def test_a_bad_option_is_one_line(capsys):
    status, out, err = run(capsys, "crosscheck", "--format", "xml")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
