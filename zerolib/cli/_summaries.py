"""Each command's one-line summary, as `zerolib --help` lists it: read there without importing
the commands (their imports cost more than the listing), and by each command's own parser."""

# The commands in the order `zerolib --help` lists them.
SUMMARIES = {
    "estimate": "bytes per GPU under each ZeRO stage",
    "plan": "every (t, p, d, ZeRO, ...) configuration that fits, ranked by step time",
    "models": "list the model presets with parameter counts and sources",
    "figures": "write the published figures (PNG, SVG) and their data (CSV)",
    "notebooks": "re-execute the notebooks in place (or --check them)",
    "html": "export every notebook to a static HTML page",
    "lab": "start JupyterLab on a working copy of the chapter (127.0.0.1)",
    "app": "start the engineer's page: will my model train here, and how? (127.0.0.1)",
    "validate": "measure real PyTorch runs on the CPU against zerolib (needs torch)",
    "validate-communication": "count the bytes real runs hand to each collective, against zerolib (needs torch)",
    "validate-mechanisms": "measure trainers' memory mechanisms with real PyTorch code (needs torch)",
    "measure-deepspeed": "measure DeepSpeed's ZeRO stages per rank on the CPU (needs deepspeed)",
    "crosscheck": "Korthikanti et al.'s models and Megatron-LM's memory estimate beside zerolib",
}
