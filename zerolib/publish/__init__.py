"""Publishing the chapter: deterministic notebook re-execution and static HTML export."""
