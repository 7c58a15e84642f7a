"""``zerolib models``: the architecture presets, their exact parameter counts and sources.

``active_parameters`` is what one token's forward pass uses (a mixture of experts skips the
experts a token is not routed to; embedding and output projection are counted), see
:func:`zerolib.core.catalogue.models.active_parameter_count`; ``parameters`` is the total, which sets the
memory of model state.
"""
from __future__ import annotations

from zerolib.cli import _own_model as own_model_cli
from zerolib.cli._output import json_text, text_table
from zerolib.cli._summaries import SUMMARIES
from zerolib.core.catalogue.models import (
    MODELS,
    active_parameter_count,
    largest_layer,
    modules,
    parameter_count,
)


def register(commands) -> None:
    parser = commands.add_parser(
        "models", help=SUMMARIES["models"],
        description="Model presets (decoder-only transformers from their published "
                    "configurations): exact parameter count, active parameters per token "
                    "(all but the experts a token is not routed to; the total for dense models), "
                    "largest single module in elements (DeepSpeed's largest_layer_params), shape, "
                    "and where each number is published.")
    parser.add_argument("--format", default="table", choices=("table", "json"))
    own_model_cli.add_arguments(parser.add_mutually_exclusive_group())
    parser.set_defaults(func=run)


def row(config) -> dict:
    """A model's configuration plus the derived counts (elements, not bytes)."""
    return {**config.as_dict(), "head_dim": config.head_width, "parameters": parameter_count(config),
            "active_parameters": active_parameter_count(config), "largest_layer": largest_layer(config)}


def rows() -> list[dict]:
    """One dict per preset."""
    return [row(config) for config in MODELS.values()]


def run(args) -> int:
    config = own_model_cli.model_from(args)
    if config is None:
        print(render(rows(), args.format))
        return 0
    found = row(config)
    # The module behind largest_layer, by name (the first in model order when two are as large).
    found["largest_module"] = next(m.name for m in modules(config)
                                   if m.elements == found["largest_layer"])
    print(json_text(found) if args.format == "json" else render_one(found))
    return 0


def render_one(model: dict) -> str:
    """One model read from a file: the architecture read, its exact counts, its largest module."""
    shape = [f"{model['layers']} layers", f"hidden {model['hidden']:,}",
             f"{model['heads']} heads ({model['kv_heads']} key/value) of {model['head_dim']}",
             f"{'gated ' if model['gated_mlp'] else ''}MLP {model['ffn_hidden']:,}",
             f"vocabulary {model['vocab']:,} ({'tied' if model['tied_embeddings'] else 'untied'})",
             model["norm"], f"{model['position_embedding']} positions"]
    if model["experts"]:
        shape.append(f"{model['experts_per_token']} of {model['experts']} experts per token")
    if model["shared_expert_ffn"]:
        shape.append(f"a shared expert of {model['shared_expert_ffn']:,}"
                     + (" with its gate" if model["shared_expert_gate"] else ""))
    if model["kv_lora_rank"]:
        shape.append(f"latent attention (key/value latent {model['kv_lora_rank']:,}, query latent "
                     f"{model['q_lora_rank'] or 'none'}, values of {model['v_head_dim']})")
    if model["dense_layers"]:
        shape.append(f"the first {model['dense_layers']} layers dense (MLP {model['dense_ffn_hidden']:,})")
    if model["qk_norm"] != "none":
        shape.append(f"query/key norms ({model['qk_norm']})")
    if model["embedding_norm"]:
        shape.append("a norm after the embedding")
    if model["shared_norm"]:
        shape.append("one norm before attention and MLP side by side")
    return "\n".join([
        f"{model['name']}: {', '.join(shape)}",
        f"parameters: {model['parameters']:,}",
        f"active per token: {model['active_parameters']:,}",
        f"largest module: {model['largest_module']} ({model['largest_layer']:,} parameters)",
        f"source: {model['source']}"])


def render(presets: list[dict], form: str) -> str:
    if form == "json":
        return json_text(presets)
    headers = ["model", "parameters", "active [params]", "largest layer [params]", "layers", "hidden",
               "heads/kv x dim", "ffn", "experts", "vocab", "tied"]
    table = [[p["name"], f"{p['parameters']:,}", f"{p['active_parameters']:,}", f"{p['largest_layer']:,}",
              p["layers"], p["hidden"], f"{p['heads']}/{p['kv_heads']} x {p['head_dim']}", p["ffn_hidden"],
              f"{p['experts_per_token']} of {p['experts']}" if p["experts"] else "-", p["vocab"],
              "yes" if p["tied_embeddings"] else "no"]
             for p in presets]
    sources = [f"{p['name']}: {p['source']}" for p in presets]
    note = ("active: parameters one token's forward pass uses (embedding, attention, norms, the whole "
            "router, the experts it is routed to, output projection); model-state memory follows the "
            "total, since every expert has gradients and optimizer state.")
    return "\n".join([text_table(headers, table), "", note, "", "Sources:", *sources])
