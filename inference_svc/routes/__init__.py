"""The inference app's routes, one router per concern: generation, control (behind the control key), info."""
