"""An agent that compacts its own context every N turns (summary + the last turns): one fork per rewrite."""
