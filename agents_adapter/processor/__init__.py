"""The trajectory processor (`python -m agents_adapter.processor`): a Faust program that rebuilds each
session from `llm.calls` into a prefix tree and publishes trajectories and group records.
"""
