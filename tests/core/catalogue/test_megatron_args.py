"""Megatron-LM arguments -> the model Megatron-LM builds, reconciled with its own formula.

Hand counts follow Megatron Core's GPT layer (linear_qkv, linear_proj, linear_fc1, linear_fc2,
two norms, biases unless --disable-bias-linear); the reconciliation uses the project's
transcription of Megatron-LM's theoretical_memory_usage.py, whose dense count leaves out the
linear layers' biases and the learned position table (its docstring: ``no-linear-biases``).
"""
import pytest

from zerolib.core.catalogue.megatron_args import model_from_megatron_args
from zerolib.core.catalogue.models import MODELS, parameter_count
from zerolib.crosscheck.conventions.megatron_theoretical_memory import (
    ParallelFlags,
    args_for,
    parameters_on_most_loaded_shard,
)

GPT3 = ("--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 "
        "--max-position-embeddings 2048 --vocab-size 50257")
LLAMA3_8B = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention "
             "--num-query-groups 8 --ffn-hidden-size 14336 --swiglu --normalization RMSNorm "
             "--position-embedding-type rope --disable-bias-linear "
             "--untie-embeddings-and-output-weights --max-position-embeddings 8192 "
             "--vocab-size 128256 --seq-length 8192")


def _megatron_formula(config, t=1) -> int:
    value = parameters_on_most_loaded_shard(args_for(config, 2048, 1, ParallelFlags(t)))
    assert value.denominator == 1
    return int(value)


def test_gpt3_175b_by_hand():
    # Per layer two LayerNorms (2 x 2h), qkv 3h^2 + 3h, proj h^2 + h, fc1 4h^2 + 4h, fc2 4h^2 + h:
    # 12h^2 + 13h; vocabulary 50,257 padded to 50,304 (a multiple of 128); 2,048 learned
    # positions; the final LayerNorm; the output layer tied.
    h, L = 12288, 96
    config = model_from_megatron_args(GPT3)
    assert config.vocab == 50304
    assert parameter_count(config) == L * (12 * h * h + 13 * h) + 50304 * h + 2048 * h + 2 * h


def test_vocabulary_padding_follows_tensor_parallel_degree():
    # 50,257 up to a multiple of 128 x 8 = 1,024: 51,200; of 64 x 8: 50,688.
    assert model_from_megatron_args(GPT3 + " --tensor-model-parallel-size 8").vocab == 51200
    assert model_from_megatron_args(
        GPT3 + " --tensor-model-parallel-size 8 --make-vocab-size-divisible-by 64").vocab == 50688


def test_bias_free_rope_model_equals_megatrons_formula_and_the_preset():
    config = model_from_megatron_args(LLAMA3_8B)
    # 128,256 is already a multiple of 128: no padding, so the preset's published total.
    assert parameter_count(config) == parameter_count(MODELS["llama-3-8b"]) == 8_030_261_248
    assert _megatron_formula(config) == 8_030_261_248


def test_gpt3_differs_from_megatrons_formula_by_its_biases_and_position_table():
    # The formula's "no-linear-biases": per layer qkv 3h, proj h, fc1 4h, fc2 h; and the
    # 2,048 x h position table. Nothing else differs. (The formula is taken at t = 1, the whole
    # model: with --tensor-model-parallel-size 8 the vocabulary stays the 51,200 rows Megatron-LM
    # padded to, already a multiple of 128.)
    h, L = 12288, 96
    for t in (1, 8):
        config = model_from_megatron_args(GPT3 + f" --tensor-model-parallel-size {t}")
        assert parameter_count(config) - _megatron_formula(config) == L * 9 * h + 2048 * h


def test_swiglu_default_width_and_kv_channels():
    # --swiglu without --ffn-hidden-size: int(4h x 2/3 / 64) x 64 = 10,880 for h = 4,096.
    config = model_from_megatron_args("--num-layers 2 --hidden-size 4096 --num-attention-heads 32 "
                                      "--swiglu --max-position-embeddings 128 --vocab-size 1000 "
                                      "--kv-channels 256")
    assert config.ffn_hidden == 10880 and config.head_width == 256 and config.gated_mlp


def test_a_launch_script_file(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("# GPT-3 175B\n" + GPT3.replace(" --seq", " \\\n    --seq") +
                      " \\\n    --lr 6e-5 --bf16 --micro-batch-size 1  # training settings\n")
    assert parameter_count(model_from_megatron_args(script)) == parameter_count(
        model_from_megatron_args(GPT3))


@pytest.mark.parametrize("args, words", [
    ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --max-position-embeddings 8",
     "missing --vocab-size (Megatron-LM reads it from the tokenizer"),
    (GPT3 + " --num-experts 8", "--num-experts: a mixture of experts"),
    (GPT3 + " --multi-latent-attention", "--multi-latent-attention: multi-head latent attention"),
    (GPT3 + " --frobnicate 3", "--frobnicate is not a Megatron-LM argument zerolib knows"),
    (GPT3.replace("96 --hidden", "$NUM_LAYERS --hidden"), "--num-layers must be a whole number, got '$NUM_LAYERS'"),
    (GPT3 + " --group-query-attention --num-query-groups 5", "--num-query-groups (5) must divide"),
    (GPT3 + " --num-query-groups 8", "--num-query-groups needs --group-query-attention"),
    (GPT3 + " --normalization BatchNorm", "--normalization must be one of LayerNorm, RMSNorm"),
    ("no-such-file.sh", "no-such-file.sh: no such file"),
])
def test_bad_arguments_name_the_flag(args, words):
    with pytest.raises(ValueError) as error:
        model_from_megatron_args(args)
    assert words in str(error.value)


# --- Megatron-LM's own argument rules, where they change the count ------------------------------
# megatron/training/arguments.py at d98e8a64 (NVIDIA/Megatron-LM, 2026-08-22), validate_args.

def _validate_position_args(args):
    """Lines 1625-1634 of validate_args, as written there (the apply_rope_fusion line is kept:
    it changes no parameter)."""
    # Legacy RoPE arguments
    if args.use_rotary_position_embeddings:
        args.position_embedding_type = 'rope'
    if args.position_embedding_type != 'rope':
        args.apply_rope_fusion = False

    # Would just need to add 'NoPE' as a position_embedding_type to support this, but for now
    # don't allow it to keep things simple
    if not args.add_position_embedding and args.position_embedding_type != 'rope':
        raise RuntimeError('--no-position-embedding is deprecated, use --position-embedding-type')


SMALL = ("--num-layers 2 --hidden-size 4096 --num-attention-heads 32 --max-position-embeddings 4096 "
         "--vocab-size 32000")


@pytest.mark.parametrize("legacy_rope", [False, True])
@pytest.mark.parametrize("kind", [None, "learned_absolute", "rope", "none"])
@pytest.mark.parametrize("no_position", [False, True])
def test_position_embeddings_follow_validate_args(legacy_rope, kind, no_position):
    from types import SimpleNamespace
    # argparse's defaults (lines 2397, 2415, 2437-2440): learned_absolute, False, True.
    args = SimpleNamespace(use_rotary_position_embeddings=legacy_rope,
                           position_embedding_type=kind or "learned_absolute",
                           add_position_embedding=not no_position, apply_rope_fusion=True)
    flags = (SMALL + (" --use-rotary-position-embeddings" if legacy_rope else "")
             + (f" --position-embedding-type {kind}" if kind else "")
             + (" --no-position-embedding" if no_position else ""))
    try:
        _validate_position_args(args)
    except RuntimeError as refused:
        with pytest.raises(ValueError) as error:
            model_from_megatron_args(flags)
        assert str(refused) in str(error.value)
        return
    config = model_from_megatron_args(flags)
    built = {"learned_absolute": "learned", "rope": "rotary", "none": "none"}
    assert config.position_embedding == built[args.position_embedding_type]


def test_the_legacy_rope_flag_drops_the_learned_table():
    # Megatron-LM builds no position table under --use-rotary-position-embeddings, whatever
    # --position-embedding-type says: 4,096 positions x 4,096 = 16,777,216 parameters fewer.
    learned = model_from_megatron_args(SMALL + " --position-embedding-type learned_absolute")
    legacy = model_from_megatron_args(SMALL + " --use-rotary-position-embeddings "
                                              "--position-embedding-type learned_absolute")
    assert parameter_count(learned) - parameter_count(legacy) == 4096 * 4096 == 16_777_216
    assert parameter_count(legacy) == parameter_count(
        model_from_megatron_args(SMALL + " --position-embedding-type rope"))


@pytest.mark.parametrize("flag, words", [
    # validate_args, lines 590-604, as written there.
    ("--batch-size 8", "--batch-size argument is no longer valid, use --micro-batch-size instead"),
    ("--warmup 100", "--warmup argument is no longer valid, use --lr-warmup-fraction instead"),
    ("--model-parallel-size 8", "--model-parallel-size is no longer valid, use "
                                "--tensor-model-parallel-size instead"),
    ("--checkpoint-activations", "--checkpoint-activations is no longer valid, use "
                                 "--recompute-activations, or, for more control, "
                                 "--recompute-granularity and --recompute-method"),
])
def test_switches_megatron_no_longer_takes_are_refused_with_its_words(flag, words):
    with pytest.raises(ValueError) as error:
        model_from_megatron_args(f"{SMALL} {flag}")
    assert words in str(error.value) and str(error.value).startswith("megatron-args: ")


@pytest.mark.parametrize("value", ["٣٢", "3_2", "32.0", "0x20", "+32", "3 2", "", "९"])
def test_numbers_are_ascii_digits(value):
    # Python's int() reads "3_2" and "٣٢" as 32; zerolib's one rule for counts refuses them.
    with pytest.raises(ValueError, match="--num-layers must be a whole number"):
        model_from_megatron_args(["--num-layers", value, *SMALL.split()[2:]])
