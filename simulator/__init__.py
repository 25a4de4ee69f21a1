"""partita.simulator: predicts one training step of a scenario, deterministically.

Entry point: `simulator.step.simulate(scenario, catalog) -> SimResult`.
"""
