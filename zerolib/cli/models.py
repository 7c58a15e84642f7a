"""``zerolib models``: the architecture presets, their exact parameter counts and sources."""
from __future__ import annotations

import json

from zerolib.cli._output import text_table
from zerolib.core.models import MODELS, largest_layer, parameter_count


def register(commands) -> None:
    parser = commands.add_parser(
        "models", help="list the model presets with parameter counts and sources",
        description="Model presets (decoder-only transformers from their published "
                    "configurations): exact parameter count, largest single module in elements "
                    "(DeepSpeed's largest_layer_params), shape, and where each number is published.")
    parser.add_argument("--format", default="table", choices=("table", "json"))
    parser.set_defaults(func=run)


def rows() -> list[dict]:
    """One dict per preset: its configuration plus the derived counts (elements, not bytes)."""
    return [{**config.as_dict(), "parameters": parameter_count(config),
             "largest_layer": largest_layer(config)} for config in MODELS.values()]


def run(args) -> int:
    print(render(rows(), args.format))
    return 0


def render(presets: list[dict], form: str) -> str:
    if form == "json":
        return json.dumps(presets, indent=2)
    headers = ["model", "parameters", "largest layer [params]", "layers", "hidden", "heads/kv",
               "ffn", "vocab", "tied"]
    table = [[p["name"], f"{p['parameters']:,}", f"{p['largest_layer']:,}", p["layers"], p["hidden"],
              f"{p['heads']}/{p['kv_heads']}", p["ffn_hidden"], p["vocab"],
              "yes" if p["tied_embeddings"] else "no"]
             for p in presets]
    sources = [f"{p['name']}: {p['source']}" for p in presets]
    return "\n".join([text_table(headers, table), "", "Sources:", *sources])
