"""The trainer: GRPO / PPO with the decoupled (asynchronous) objective, prefix-tree packing, DeepSpeed.

Modules, none of which knows about Kafka:
  config      typed, validated configuration (`TrainerConfig`, `EngineConfig`, `AlgorithmConfig`)
  losses      advantages (GRPO, GAE), the decoupled PPO loss, critic loss, staleness masking (plain torch)
  tree_pack   a session's prefix tree as one sequence with a tree attention mask; micro-batches by tokens
  engine      a model under DeepSpeed (ZeRO 0/1/2, fp32/bf16; CPU with gloo or CUDA with nccl)
  critic      the PPO value model
  checkpoint  checkpoint directory layout, atomic commit, digests, progress file
  trainer     `Trainer`: train_step, save_checkpoint, load_checkpoint (what the service shell drives)

The service shell (`python -m trainer_svc`, module `service`, settings `config.ServiceConfig`) is the only
part that knows about Kafka: it consumes trajectories and train assignments, drives `Trainer`, and
commits the consumed offsets with each checkpoint.
"""
