"""Cluster simulator: the scheduler core driven by a discrete-event model of engines, agents and a trainer.

Entry points: `run_simulation(SimConfig(...)) -> SimResult` and `main(argv)` (the `sflow sim` CLI).
"""

from scheduler_svc.sim.cli import main
from scheduler_svc.sim.cluster import ClusterSim, run_simulation
from scheduler_svc.sim.config import SimConfig
from scheduler_svc.sim.pipelines import PIPELINES, pipeline_policy
from scheduler_svc.sim.results import SimResult, draw_gantt, format_table

__all__ = [
    "PIPELINES",
    "ClusterSim",
    "SimConfig",
    "SimResult",
    "draw_gantt",
    "format_table",
    "main",
    "pipeline_policy",
    "run_simulation",
]
