"""A model from the arguments of a Megatron-LM launch, built as Megatron-LM builds it.

:func:`model_from_megatron_args` takes the command-line arguments of ``pretrain_gpt.py`` (a
string such as ``"--num-layers 96 --hidden-size 12288 ..."``, a list of them, or a file holding
them, as a launch script writes them) and returns the catalogue's
:class:`~zerolib.core.catalogue.models.TransformerConfig` of Megatron-LM's GPT model (Megatron
Core ``GPTModel``: ``megatron/core/models/gpt/gpt_model.py`` and the transformer layer spec),
with Megatron-LM's defaults from ``megatron/training/arguments.py`` (``validate_args``):

- the vocabulary is padded up to a multiple of ``--make-vocab-size-divisible-by`` (128) x
  ``--tensor-model-parallel-size`` (``_vocab_size_with_padding``): the embedding and the output
  layer hold the padded rows, so the count is what Megatron-LM allocates;
- ``--ffn-hidden-size`` defaults to 4h, or with ``--swiglu`` to int(4h x 2/3 / 64) x 64;
- ``--kv-channels`` to h / heads; ``--num-query-groups`` to the heads without
  ``--group-query-attention``;
- biases on every linear layer unless ``--disable-bias-linear`` (``add_bias_linear`` is True by
  default), on the QKV projection also with ``--add-qkv-bias``;
- ``--position-embedding-type learned_absolute`` (the default) is a ``--max-position-embeddings``
  x h table; ``rope`` and ``none`` have no parameters. The legacy ``--use-rotary-position-
  embeddings`` forces ``rope`` whatever ``--position-embedding-type`` says, and
  ``--no-position-embedding`` is refused unless the type is then ``rope``, both as
  ``validate_args`` has them (``megatron/training/arguments.py`` at d98e8a64, lines 1625-1634);
  the other switches ``validate_args`` refuses as no longer valid (``--batch-size``,
  ``--warmup``, ``--model-parallel-size``, ``--checkpoint-activations``, lines 590-604) are
  refused with its words;
- the output layer shares the embedding unless ``--untie-embeddings-and-output-weights``;
- ``--normalization`` LayerNorm (default; weight and bias) or RMSNorm (weight);
- QKV is one fused ``linear_qkv`` and, with ``--swiglu``, gate and up one ``linear_fc1``.

Flags that change no parameter (learning rates, batch sizes, parallel sizes other than the
tensor-parallel degree's padding, precision, checkpointing, data paths...) are read and left
out; a flag that changes the architecture in a way zerolib cannot express (experts, latent
attention, ...) is refused with one line naming it, and so is any flag zerolib does not know,
so that nothing is silently approximated. ``--vocab-size`` is needed: Megatron-LM reads the
vocabulary from its tokenizer, which is not here.

What is read is bounded: arguments (a string or a file, a regular one) of at most
:data:`MAX_ARGUMENT_BYTES` and :data:`MAX_ARGUMENTS` words; numbers in ASCII digits only (Python's
``int``, which argparse calls, would also read ``3_2`` and ``٣٢`` as 32: zerolib's one rule for
counts refuses both).
"""
from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from zerolib.core.catalogue.models import MAX_MODEL_SIZE, TransformerConfig
from zerolib.core.inputs import echo, read_small_file
from zerolib.core.intmath import ceil_div

MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128   # megatron/training/arguments.py default
# A launch script's arguments are a few kilobytes and a few hundred words. (shlex, which splits
# them as a shell would, slows down on long words: one word of 1 MB took 11 s, of 100 kB 0.1 s.)
MAX_ARGUMENT_BYTES = 100_000
MAX_ARGUMENTS = 4_096
_DIGITS = re.compile(r"[0-9]+")

# Flags taking a whole number that shape the model.
_WHOLE = {
    "--num-layers": "num_layers", "--hidden-size": "hidden_size",
    "--ffn-hidden-size": "ffn_hidden_size", "--num-attention-heads": "num_attention_heads",
    "--kv-channels": "kv_channels", "--num-query-groups": "num_query_groups",
    "--max-position-embeddings": "max_position_embeddings", "--seq-length": "seq_length",
    "--vocab-size": "vocab_size", "--make-vocab-size-divisible-by": "make_vocab_size_divisible_by",
    "--tensor-model-parallel-size": "tensor_model_parallel_size",
}
_SWITCHES = {
    "--swiglu": "swiglu", "--group-query-attention": "group_query_attention",
    "--untie-embeddings-and-output-weights": "untie", "--disable-bias-linear": "no_bias",
    "--add-qkv-bias": "qkv_bias", "--use-rotary-position-embeddings": "rotary",
}
_CHOICES = {"--normalization": ("LayerNorm", "RMSNorm"),
            "--position-embedding-type": ("learned_absolute", "rope", "none")}
# Architecture flags zerolib cannot express: refused, never approximated.
_REFUSED = {
    "--num-experts": "a mixture of experts from Megatron-LM arguments",
    "--moe-ffn-hidden-size": "a mixture of experts from Megatron-LM arguments",
    "--multi-latent-attention": "multi-head latent attention",
    "--qk-layernorm": "query/key norms from Megatron-LM arguments",
    "--apply-residual-connection-post-layernorm": "post-norm residuals",
    "--mtp-num-layers": "multi-token prediction layers",
    "--num-layers-per-virtual-pipeline-stage": None,
}
# Switches validate_args refuses as no longer valid (megatron/training/arguments.py at d98e8a64,
# lines 590-604), with its words.
_NO_LONGER_VALID = {
    "--batch-size": "--batch-size argument is no longer valid, use --micro-batch-size instead",
    "--warmup": "--warmup argument is no longer valid, use --lr-warmup-fraction instead",
    "--model-parallel-size": "--model-parallel-size is no longer valid, use "
                             "--tensor-model-parallel-size instead",
    "--checkpoint-activations": "--checkpoint-activations is no longer valid, use "
                                "--recompute-activations, or, for more control, "
                                "--recompute-granularity and --recompute-method",
}
NO_POSITION_EMBEDDING = "--no-position-embedding is deprecated, use --position-embedding-type"
# Flags (taking a value) that change no parameter.
_NO_PARAMETER_VALUES = frozenset("""
    --micro-batch-size --global-batch-size --rampup-batch-size --train-iters --train-samples
    --lr --min-lr --lr-decay-style --lr-decay-iters --lr-decay-samples --lr-warmup-iters
    --lr-warmup-fraction --lr-warmup-samples --weight-decay --clip-grad --adam-beta1 --adam-beta2
    --adam-eps --init-method-std --attention-dropout --hidden-dropout --seed --split --data-path
    --vocab-file --merge-file --tokenizer-type --tokenizer-model --save --load --save-interval
    --eval-interval --eval-iters --log-interval --tensorboard-dir --wandb-project --wandb-exp-name
    --pipeline-model-parallel-size --context-parallel-size --expert-model-parallel-size
    --virtual-pipeline-model-parallel-size --num-workers --distributed-backend
    --recompute-granularity --recompute-method --recompute-num-layers --rotary-base
    --rotary-percent --rotary-scaling-factor --norm-epsilon --attention-backend --optimizer
    --loss-scale --initial-loss-scale --min-loss-scale --loss-scale-window --hysteresis
    --data-cache-path --exit-interval --exit-duration-in-mins --ckpt-format --transformer-impl
    --distributed-timeout-minutes --dataloader-type --timing-log-level
    --dist-ckpt-strictness
    --main-grads-dtype --main-params-dtype --exp-avg-dtype --exp-avg-sq-dtype
""".split())
_NO_PARAMETER_SWITCHES = frozenset("""
    --bf16 --fp16 --sequence-parallel --use-distributed-optimizer --overlap-grad-reduce
    --overlap-param-gather --use-flash-attn --no-masked-softmax-fusion --no-bias-gelu-fusion
    --no-bias-dropout-fusion --no-gradient-accumulation-fusion --no-async-tensor-model-parallel-allreduce
    --log-timers-to-tensorboard --log-validation-ppl-to-tensorboard --log-memory-to-tensorboard
    --log-params-norm --log-num-zeros-in-grad --log-theoretical-memory --no-load-optim
    --no-load-rng --use-checkpoint-args --mock-data --accumulate-allreduce-grads-in-fp32
    --attention-softmax-in-fp32 --no-rope-fusion --use-legacy-models
    --disable-vision-class-token --apply-query-key-layer-scaling --swap-attention --tp-comm-overlap
    --manual-gc --check-for-nan-in-loss-and-grad --deterministic-mode --bias-swiglu-fusion
    --log-throughput --use-mcore-models --async-save --use-persistent-ckpt-worker
""".split())


def _shown(text: str) -> str:
    """``text`` as it is when short and printable, else :func:`echo`'s cut repr."""
    return text if len(text) <= 40 and text.isprintable() else echo(text)


def _bounded(tokens: list[str], where: str) -> list[str]:
    if len(tokens) > MAX_ARGUMENTS:
        raise ValueError(f"{where}: {len(tokens):,} words; Megatron-LM arguments are read up to "
                         f"{MAX_ARGUMENTS:,}")
    if sum(len(token) for token in tokens) > MAX_ARGUMENT_BYTES:
        raise ValueError(f"{where}: more than {MAX_ARGUMENT_BYTES:,} characters of arguments")
    return tokens


def argument_tokens(source) -> tuple[list[str], str]:
    """(the arguments, where they come from) of a string, a list or a file holding them."""
    if isinstance(source, (list, tuple)):
        if not all(isinstance(item, str) for item in source):
            raise TypeError("megatron_args as a list must hold strings")
        return _bounded(list(source), "megatron-args"), "megatron-args"
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"megatron_args must be a string of arguments, a list of them or a file "
                        f"holding them, got {type(source).__name__}")
    text, where = os.fspath(source), "megatron-args"
    if len(text) > MAX_ARGUMENT_BYTES:
        raise ValueError(f"{where}: {len(text):,} characters; Megatron-LM arguments are read up "
                         f"to {MAX_ARGUMENT_BYTES:,} bytes")
    if not text.lstrip().startswith("-") and "\n" not in text:
        path = Path(text).expanduser()
        if not path.exists():
            raise ValueError(f"{_shown(text)}: no such file (give Megatron-LM arguments such as "
                             f"'--num-layers 32 ...', or a file holding them)")
        text = read_small_file(path, "a file of Megatron-LM arguments", MAX_ARGUMENT_BYTES)
        where = str(path)
    # A launch script's lines: comments dropped, backslash line continuations joined.
    lines = [line.split("#", 1)[0] for line in text.replace("\\\n", " ").splitlines()]
    try:
        tokens = shlex.split(" ".join(lines))
    except ValueError as error:
        raise ValueError(f"{where}: cannot split the arguments ({error})") from None
    return _bounded(tokens, where), where


def _value(tokens: list[str], index: int, flag: str, inline: str, where: str) -> tuple[str, int]:
    """(the flag's value, the index of the last token read): ``--flag=value`` or ``--flag value``."""
    if inline:
        return inline, index
    if index + 1 >= len(tokens) or tokens[index + 1].startswith("--"):
        raise ValueError(f"{where}: {flag} needs a value")
    return tokens[index + 1], index + 1


def _parse(tokens: list[str], where: str) -> dict:
    found: dict = {}
    index = 0
    while index < len(tokens):
        token = tokens[index]
        flag, _, inline = token.partition("=")
        if not flag.startswith("--"):
            raise ValueError(f"{where}: {token!r} is not a --flag (Megatron-LM arguments are "
                             f"--name value pairs and --switches)")
        flag = flag.replace("_", "-")
        takes_value = (flag in _WHOLE or flag in _CHOICES or flag in _NO_PARAMETER_VALUES
                       or (flag in _REFUSED and _REFUSED[flag] is None))
        text = None
        if flag in _REFUSED and _REFUSED[flag] is not None:
            raise ValueError(f"{where}: {flag}: {_REFUSED[flag]}; zerolib cannot express it")
        if flag in _NO_LONGER_VALID:
            raise ValueError(f"{where}: {_NO_LONGER_VALID[flag]} (Megatron-LM's validate_args "
                             f"refuses it)")
        if takes_value:
            text, index = _value(tokens, index, flag, inline, where)
        if flag in _WHOLE:
            # ASCII digits only: int() would read "3_2" and "٣٢" as 32.
            if not _DIGITS.fullmatch(text.strip()):
                raise ValueError(f"{where}: {flag} must be a whole number, got {echo(text)} "
                                 f"(digits 0-9 only)")
            number = int(text.strip()) if len(text.strip()) <= 20 else MAX_MODEL_SIZE + 1
            if not 1 <= number <= MAX_MODEL_SIZE:
                raise ValueError(f"{where}: {flag} must be from 1 to {MAX_MODEL_SIZE:,}, got "
                                 f"{echo(text.strip())}")
            found[_WHOLE[flag]] = number
        elif flag in _SWITCHES:
            found[_SWITCHES[flag]] = True
        elif flag == "--no-position-embedding":
            found["no_position_embedding"] = True
        elif flag in _CHOICES:
            if text not in _CHOICES[flag]:
                raise ValueError(f"{where}: {flag} must be one of {', '.join(_CHOICES[flag])}, "
                                 f"got {echo(text)}")
            found[flag[2:].replace("-", "_")] = text
        elif not takes_value and flag not in _NO_PARAMETER_SWITCHES:
            raise ValueError(f"{where}: {_shown(flag)} is not a Megatron-LM argument zerolib knows; "
                             f"if it changes no parameter, leave it out")
        index += 1
    return found


def position_embedding_type(found: dict, where: str) -> str:
    """The position embedding Megatron-LM builds, by ``validate_args``'s rules as written
    (megatron/training/arguments.py at d98e8a64, lines 1625-1634): the legacy
    ``--use-rotary-position-embeddings`` sets ``rope`` over any ``--position-embedding-type``;
    ``--no-position-embedding`` (add_position_embedding False) with any type but ``rope`` is a
    RuntimeError there, a ValueError here."""
    position = found.get("position_embedding_type", "learned_absolute")
    if found.get("rotary"):
        position = "rope"
    if found.get("no_position_embedding") and position != "rope":
        raise ValueError(f"{where}: {NO_POSITION_EMBEDDING} (Megatron-LM's validate_args refuses "
                         f"it unless the type is rope)")
    return position


def padded_vocabulary(vocab: int, tensor_parallel: int = 1,
                      divisible_by: int = MAKE_VOCAB_SIZE_DIVISIBLE_BY) -> int:
    """Megatron-LM's ``_vocab_size_with_padding``: up to a multiple of divisible_by x t."""
    multiple = divisible_by * tensor_parallel
    return ceil_div(vocab, multiple) * multiple


def model_from_megatron_args(source, *, name: str = "megatron-gpt") -> TransformerConfig:
    """The GPT model Megatron-LM builds from these arguments (see the module doc)."""
    tokens, where = argument_tokens(source)
    a = _parse(tokens, where)
    for key, flag in (("num_layers", "--num-layers"), ("hidden_size", "--hidden-size"),
                      ("num_attention_heads", "--num-attention-heads"),
                      ("max_position_embeddings", "--max-position-embeddings"),
                      ("vocab_size", "--vocab-size")):
        if key not in a:
            extra = (" (Megatron-LM reads it from the tokenizer; give its size)"
                     if key == "vocab_size" else "")
            raise ValueError(f"{where}: missing {flag}{extra}")
    h, heads = a["hidden_size"], a["num_attention_heads"]
    swiglu = a.get("swiglu", False)
    ffn = a.get("ffn_hidden_size", int((4 * h * 2 / 3) / 64) * 64 if swiglu else 4 * h)
    if "kv_channels" not in a and h % heads:
        raise ValueError(f"{where}: --hidden-size {h} is not a multiple of --num-attention-heads "
                         f"{heads} and no --kv-channels is given")
    kv_channels = a.get("kv_channels", h // heads)
    if "num_query_groups" in a and not a.get("group_query_attention"):
        raise ValueError(f"{where}: --num-query-groups needs --group-query-attention")
    groups = a.get("num_query_groups", 1) if a.get("group_query_attention") else heads
    if heads % groups:
        raise ValueError(f"{where}: --num-query-groups ({groups}) must divide "
                         f"--num-attention-heads ({heads})")
    position = position_embedding_type(a, where)
    t = a.get("tensor_model_parallel_size", 1)
    vocab = padded_vocabulary(a["vocab_size"], t,
                              a.get("make_vocab_size_divisible_by", MAKE_VOCAB_SIZE_DIVISIBLE_BY))
    bias = not a.get("no_bias", False)
    try:
        return TransformerConfig(
            name, hidden=h, layers=a["num_layers"], heads=heads, kv_heads=groups, ffn_hidden=ffn,
            vocab=vocab, max_positions=a["max_position_embeddings"],
            tied_embeddings=not a.get("untie", False), gated_mlp=swiglu,
            norm="rmsnorm" if a.get("normalization") == "RMSNorm" else "layernorm",
            position_embedding={"learned_absolute": "learned", "rope": "rotary",
                                "none": "none"}[position],
            qkv_bias=bias or a.get("qkv_bias", False), output_bias=bias, mlp_bias=bias,
            fused_qkv=True, fused_gate_up=swiglu,
            head_dim=None if kv_channels * heads == h else kv_channels,
            source=f"Megatron-LM arguments from {where}: vocabulary {a['vocab_size']:,} padded to "
                   f"{vocab:,} (a multiple of "
                   f"{a.get('make_vocab_size_divisible_by', MAKE_VOCAB_SIZE_DIVISIBLE_BY)} x {t}); "
                   f"position embedding {position}")
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: {error}") from None
