"""The catalogues: facts with sources. Model architectures, accelerators, links and nodes.

Add a preset here and every answer (estimate, plan, the figures and explorers) picks it up.
"""
