"""partita: plan, simulate and execute distributed deep-learning training."""
__version__ = "0.1.0"
