"""Training-time building blocks: deterministic random numbers, learning-rate tables, optimizers."""
