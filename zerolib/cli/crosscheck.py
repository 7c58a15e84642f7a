"""``zerolib crosscheck``: the named checks that need no data file and no PyTorch, printed.

- Korthikanti et al. (MLSys 2023): their four GPTs (Table 3) through zerolib: the parameters
  (beside Narayanan et al.'s Eq. 2) and on the most-loaded GPU; one layer per technique
  (Table 2) as a share of the tensor-parallel baseline (Figure 7's measure) and the first
  pipeline stage's activations, beside what the paper prints
  (:mod:`zerolib.crosscheck.korthikanti`);
- Megatron-LM's ``theoretical_memory_usage.py`` for the same runs beside zerolib's, each
  difference named (:mod:`zerolib.crosscheck.conventions.megatron_theoretical_memory`).

The tables are in GiB (2^30 bytes); ``--format json`` gives the exact bytes.
"""
from __future__ import annotations

from zerolib.cli._output import json_text, text_table
from zerolib.cli._summaries import SUMMARIES
from zerolib.core.units import GiB


def register(commands) -> None:
    parser = commands.add_parser(
        "crosscheck", help=SUMMARIES["crosscheck"],
        description="Korthikanti et al.'s (MLSys 2023) four GPTs through zerolib's activation "
                    "arithmetic, each technique's share of the tensor-parallel baseline beside "
                    "what the paper prints; and Megatron-LM's theoretical_memory_usage.py for "
                    "the same runs beside zerolib's, every difference named.")
    parser.add_argument("--format", default="table", choices=("table", "json"))
    parser.set_defaults(func=run)


def run(args) -> int:
    # The cross-checks import pandas and the model-parallel arithmetic: only when asked.
    from zerolib.crosscheck import korthikanti
    from zerolib.crosscheck.conventions import megatron_theoretical_memory as megatron

    techniques, theoretical = korthikanti.technique_table(), megatron.comparison()
    parameters = korthikanti.parameter_table()
    if args.format == "json":
        print(json_text({
            "korthikanti_parameters": parameters.to_dict("records"),
            "korthikanti": [{**row, "share_of_baseline": str(row["share_of_baseline"])}
                            for row in techniques.to_dict("records")],
            "korthikanti_printed": {key: {"where": where, "value": value}
                                    for key, (where, value) in korthikanti.PRINTED.items()},
            "megatron_theoretical_memory": theoretical.to_dict("records")}))
        return 0
    print(render(korthikanti, megatron, parameters, techniques, theoretical))
    return 0


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / GiB:,.2f}"


def render(korthikanti, megatron, parameters, techniques, theoretical) -> str:
    """The two checks' tables (``korthikanti`` and ``megatron`` are their modules)."""
    sizes = text_table(
        ["model", "parameters", "Narayanan et al. Eq. 2", "on the most-loaded GPU"],
        [[row.model, f"{row.parameters:,}", f"{row.narayanan_eq2:,}", f"{row.per_gpu:,}"]
         for row in parameters.itertuples()])
    layers = text_table(
        ["model", "technique", "one layer [GiB]", "of baseline", "first stage [GiB]"],
        [[row.model, row.technique, _gib(row.layer_bytes), f"{row.share_float:.1%}",
          _gib(row.first_stage_bytes)] for row in techniques.itertuples()])
    printed = [f"  {key}: {where}" for key, (where, _value) in korthikanti.PRINTED.items()]
    estimate = text_table(
        ["model", "per GPU, first stage", "Megatron-LM [GiB]", "zerolib [GiB]", "zerolib - Megatron [GiB]",
         "differs by"],
        [[row.model, row.item, _gib(row.megatron_bytes), _gib(row.zerolib_bytes),
          _gib(row.difference_bytes), row.differs_by] for row in theoretical.itertuples()])
    return "\n".join([
        f"{korthikanti.SOURCE}: Table 3's models through zerolib (s = {korthikanti.SEQ_LEN})",
        "", sizes, "(Eq. 2 leaves out the final LayerNorm: 2h fewer)", "", layers, "",
        "The paper prints:", *printed, "",
        "Megatron-LM theoretical_memory_usage.py (commit "
        f"{megatron.COMMIT[:12]}), sequence parallel, selective recomputation, as Table 3 ran them",
        "", estimate, "",
        "Each name under 'differs by' is a convention described in "
        "zerolib/crosscheck/conventions/megatron_theoretical_memory.py."])

