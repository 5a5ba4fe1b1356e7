"""The trainer: GRPO / PPO with the decoupled (asynchronous) objective, prefix-tree packing, DeepSpeed.

Modules, none of which knows about Kafka:
  config         typed, validated configuration (`TrainerConfig`, `EngineConfig`, `AlgorithmConfig`)
  selection      which trajectories and groups a step trains on; the reward guard
  advantages     GRPO group-normalised rewards, GAE on a session tree
  losses         the decoupled PPO loss, critic loss, aggregation weights, staleness masking (plain torch)
  tree_pack      a session's prefix tree as one sequence with a tree attention mask; micro-batches by tokens
  micro_batches  a step's trees in micro-batches and updates, with their per-token tensors
  engine         a model under DeepSpeed (ZeRO 0/1/2, fp32/bf16; CPU with gloo or CUDA with nccl)
  critic         the PPO value model
  checkpoint     checkpoint directory layout, atomic commit, digests, progress file
  trainer        `Trainer`: train_step, save_checkpoint, load_checkpoint (what the service shell drives)
  step_result    what a step did (`StepResult`) and its TrainStepCompleted
  buffer, ledger what the service holds between steps and where a restart reads (the checkpointed state)
  planner        which assignments open a step, when a step runs and on which groups
  step_events    the events of a step and their ids (the same for every attempt)

The service shell (`python -m trainer_svc`, module `service`, settings `config.ServiceConfig`) is the only
part that knows about Kafka: it consumes trajectories and train assignments, decides through the ledger
and the planner, drives `Trainer`, and commits the ledger's state with each checkpoint.
"""
