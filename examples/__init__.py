"""What SeamlessFlow trains: each example is a tasks source, an agent and a reward that a run config
names by module path (`examples/calculator/README.md` shows how to write one).

The framework never imports these packages: only `infra/` (the run configs and the demo) and tests do.
"""
