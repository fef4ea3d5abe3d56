"""Jobs: their rows and state machine, the trainer model each owns, and their routes."""
