"""The demo's example: a multi-turn agent that solves arithmetic with a calculator tool.

Its parts, each in one module: the tool (`tool`), the tasks (`tasks`), the verifier (`verifier`), the
shaped reward (`reward`), the agent (`agent`, `python -m examples.calculator.agent`) and the
supervised warm-up's demonstrations (`warmup`). `infra/configs/demo.yaml` names them.
"""
