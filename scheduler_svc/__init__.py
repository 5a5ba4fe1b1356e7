"""SeamlessFlow scheduler core: tag-driven resource scheduling, rollout manager and streaming loader.

Pure state machines, no Kafka and no HTTP: the service shell turns consumed events into
*observations*, calls the core, and publishes the returned *decisions* (frozen dataclasses in
`scheduler_svc.decisions`) as events. The core never reads a clock; every observation carries `t`.

Core API (what the shell calls)::

    sched = Scheduler(policy, SchedulerSettings(train_batch_groups=B, samples_per_task=n), tasks)
    decisions = sched.handle(observation)      # apply, decide, return decisions (already applied)
    sched.log                                  # observations and decisions, in order
    Scheduler.from_log(policy, settings, tasks, log)   # rebuild (event sourcing); equal snapshot()
    sched.apply(record) / sched.replay(records)         # re-apply without deciding
    sched.snapshot()                           # plain dict of the whole state, for comparison

Observations (inputs): ResourceRegistered(t, resource_id, device: DeviceSpec, loaded_version),
Heartbeat(t, resource_id), ResourceDown(t, resource_id, reason), Tick(t),
SampleCompleted(t, group_id, sample_index, n_tokens, token_versions), TrainStepCompleted(t, assignment_id, step,
version), WeightsLoaded(t, resource_id, version).

Decisions (outputs) and the topic each belongs to (docs/architecture.md, "Topics"):
    scheduler: TagTransition(resource_id, tag_kind, from_tags, to_tags, cause),
               Assignment(assignment_id, task_kind, resource_ids, cause, step, policy_version, work),
               Preemption(assignment_id, task_kind, resource_ids, cause, by_assignment_id, handed_back)
    resources: ResourceLost(resource_id, cause, last_heartbeat)
    control:   PauseRollout(resource_id, mode 'abort'|'in_place', cause),
               LoadWeights(resource_id, version, sync_id, cause), ResumeRollout(resource_id, version, cause)
    weights:   WeightSyncStarted / WeightSyncCompleted(sync_id, version, resource_ids)
    train:     TrainData(assignment_id, step, group_ids, group_versions, final, token_lags)  (Assignment
               of kind 'train' is the TrainStepStarted of that step)
    tasks:     TaskDispatched(task_id, group_id, n_samples, payload, policy_version, position, attempt),
               TaskCompleted(task_id, group_id, n_samples, policy_version, n_tokens),
               TaskAborted(task_id, group_id, n_samples, policy_version, cause, regenerate, attempt,
               n_tokens)  (only with a policy of straggler="abort")

Building blocks, each usable alone: `ResourcePool` (tags, queries, preemptive SPMD assignment,
failures), `TagPolicy` and the `colocated` / `disaggregated` / `spatiotemporal` presets (policies
as data), `RolloutManager` (interrupt and resume triggers, weight sync, staleness bound),
`StreamingDataLoader` and `TaskDataset` (JSONL / Parquet), `roofline` (device presets and
`train_priority`). The cluster simulator that drives the same core lives in `scheduler_svc.sim`
(`run_simulation(SimConfig(...))`, `main(argv)` for `sflow sim`).
"""

from scheduler_svc.decisions import (
    Assignment,
    Decision,
    Heartbeat,
    LoadWeights,
    Observation,
    PauseRollout,
    Preemption,
    Record,
    ResourceDown,
    ResourceLost,
    ResourceRegistered,
    ResumeRollout,
    SampleCompleted,
    TagTransition,
    TaskAborted,
    TaskCompleted,
    TaskDispatched,
    Tick,
    TrainData,
    TrainStepCompleted,
    WeightsLoaded,
    WeightSyncCompleted,
    WeightSyncStarted,
)
from scheduler_svc.errors import SchedulerError
from scheduler_svc.loader import StreamingDataLoader
from scheduler_svc.policies import TagGroup, TagPolicy, colocated, disaggregated, spatiotemporal
from scheduler_svc.pool import ResourcePool
from scheduler_svc.rollout_manager import RolloutManager
from scheduler_svc.roofline import DEVICE_PRESETS, DeviceSpec, device_preset, train_priority
from scheduler_svc.scheduler import Scheduler
from scheduler_svc.settings import SchedulerSettings
from scheduler_svc.tasks import Task, TaskDataset

__all__ = [
    "DEVICE_PRESETS",
    "Assignment",
    "Decision",
    "DeviceSpec",
    "Heartbeat",
    "LoadWeights",
    "Observation",
    "PauseRollout",
    "Preemption",
    "Record",
    "ResourceDown",
    "ResourceLost",
    "ResourcePool",
    "ResourceRegistered",
    "ResumeRollout",
    "RolloutManager",
    "SampleCompleted",
    "Scheduler",
    "SchedulerError",
    "SchedulerSettings",
    "StreamingDataLoader",
    "TagGroup",
    "TagPolicy",
    "TagTransition",
    "Task",
    "TaskAborted",
    "TaskCompleted",
    "TaskDataset",
    "TaskDispatched",
    "Tick",
    "TrainData",
    "TrainStepCompleted",
    "WeightSyncCompleted",
    "WeightSyncStarted",
    "WeightsLoaded",
    "colocated",
    "device_preset",
    "disaggregated",
    "spatiotemporal",
    "train_priority",
]
