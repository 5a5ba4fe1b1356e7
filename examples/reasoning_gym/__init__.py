"""A second example, from a task set nobody here wrote: an unmodified openai-agents agent with a calculator
tool, trained on reasoning-gym tasks (`reasoning_gym.create_dataset`), scored by reasoning-gym's own
`score_answer`. Its parts: `tasks`, `agent`, `reward`, `warmup`; `config.yaml` names them (README.md).
"""
