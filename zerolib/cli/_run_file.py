"""``--run FILE.toml`` and ``--save-run FILE.toml``: a run file in, the run an answer was for out.

A run file (:mod:`zerolib.core.run_file`, ``docs/run-file.md``) gives every flag it holds a
value, as if typed; a flag given beside it wins. So one command line reads a file, changes a
field, answers, and writes the changed run back: ``zerolib estimate --run base.toml
--micro-batch 2 --save-run mb2.toml``.
"""
from __future__ import annotations

import re
from pathlib import Path

from zerolib.core.run import FIELDS, Run

# flag dest -> the run field it sets (where the names differ) for the flags a run file fills
_DEST_OF = {"seq_len": "seq", "flash_attention": "flash", "reserve_bytes": "reserve",
            "ddp_gradient_as_bucket_view": "ddp_bucket_view", "stages": "stage"}
# flags whose dest takes a text value (the rest are switches)
_SWITCHES = ("sequence_parallel", "overlap_comm", "ddp_gradient_as_bucket_view",
             "partition_activations", "cpu_checkpointing", "hpz", "qwz", "qgz")


def flag_of(name: str) -> str:
    """The flag that sets run field ``name`` (a flat name of :data:`FIELDS`)."""
    return "--" + _DEST_OF.get(name, name).replace("_", "-")


# "parallel.sequence" -> "--sequence-parallel": a run's field named as the command line names it
_FLAG_OF_PATH = {".".join(path): flag_of(name) for name, path in FIELDS.items()}
_FLAG_OF_PATH.update({"cluster.gpus": "--gpus", "trainer.stages": "--stage"})
_PATH_WORD = re.compile(r"\b(cluster|parallel|trainer|batch)\.(buckets\.)?[a-z_]+\b")


def in_flags(message: str) -> str:
    """A run's message with each field (``parallel.tensor``) named by its flag."""
    return _PATH_WORD.sub(lambda m: _FLAG_OF_PATH.get(m.group(0), m.group(0)), message)


def add_arguments(parser, saved: str = "the run this answer was for") -> None:
    group = parser.add_argument_group(
        "run files", "A run written in TOML (docs/run-file.md): its fields stand in for the flags "
                     "they match; a flag given beside it wins.")
    group.add_argument("--run", metavar="FILE",
                       help="answer for the run in FILE (a model and every setting); flags "
                            "override its fields")
    group.add_argument("--save-run", metavar="FILE",
                       help=f"write {saved} to FILE (TOML), to share or to come back to")


def read(args) -> Run | None:
    """The run ``--run`` names (None without it)."""
    if getattr(args, "run", None) is None:
        return None
    from zerolib.core.run_file import read_run
    try:
        return read_run(args.run)
    except ValueError as error:
        raise ValueError(f"--run: {error}") from None


def fill_args(args, run: Run, renamed: dict | None = None) -> None:
    """Every flag ``run`` holds a value for (other than its default) and the command line left
    out, set as if typed; the model too, when no model flag was given. ``renamed``: a
    command's own flag names for fields (``{"link": "links"}``)."""
    default = Run(run.model)
    if not any(getattr(args, name, None) is not None
               for name in ("params", "model", "config", "megatron_args")):
        if run.config is None:
            args.params = str(run.model)
        else:
            args.run_model = run.config
    if getattr(args, "gpus", None) is None:
        args.gpus = str(run.cluster.gpus)
    for name, path in FIELDS.items():
        value, base = _get(run, path), _get(default, path)
        if value == base or value is None or name in ("gpus", "overlap"):
            continue
        dest = (renamed or {}).get(name, _DEST_OF.get(name, name))
        if not hasattr(args, dest) or _given(args, dest):
            continue
        if name == "layout":
            if getattr(args, "bytes", None) is None and getattr(args, "layout", None) is None:
                if isinstance(value, str) or value.name != "custom":
                    args.layout = value   # a preset, or a trainer's named layout, kept whole
                else:
                    args.bytes = ",".join(f"{sum(w for _, w in value.parts[c]):g}"
                                          for c in ("parameters", "gradients", "optimizer"))
            continue
        if name == "stages":
            if len(value) == 1:
                args.stage = str(value[0])
            else:
                args.run_stages = value
            continue
        if name == "flash_attention":
            args.flash = value
            continue
        setattr(args, dest, True if name in _SWITCHES else _text(value))


def _given(args, dest: str) -> bool:
    value = getattr(args, dest, None)
    return value is not None and value is not False


def _get(run: Run, path: tuple[str, ...]):
    value = getattr(run, path[0])
    for name in path[1:]:
        value = getattr(value, name)
    return value


def _text(value) -> str:
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple):   # pipeline_layers: FIRST,LAST as the flag takes it
        return ",".join(map(str, value))
    return str(value)


def save(args, run: Run | None) -> None:
    """``--save-run FILE``: the run, written atomically (None: nothing to write, said on
    stderr)."""
    if getattr(args, "save_run", None) is None:
        return
    if run is None:
        import sys
        print(f"--save-run: nothing fits, so no run was written to {args.save_run}", file=sys.stderr)
        return
    from zerolib._io import atomic_write
    path = Path(args.save_run)
    if not args.save_run.strip() or path.is_dir():
        raise ValueError(f"--save-run must name a file, got {args.save_run!r}")
    atomic_write(path, run.to_toml())
