"""What one training step is costed on: the resolved scenario, the network, the calibration, the
fitted overheads and the host's per-kernel costs, built once per simulation and passed as one;
with them the training framework's profile."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from partita.simulator.calibration import Calibration
from partita.simulator.context import StepContext
from partita.simulator.frameworks import FrameworkProfile, framework_profile
from partita.simulator.host import HostCosts
from partita.simulator.network import Topology
from partita.simulator.overheads import Overheads


@dataclass(frozen=True, kw_only=True)
class StepEnv:
    """`ctx` the scenario resolved against the catalog; `topo` the network tiers of its system;
    `cal` the efficiency curves and memory reserve; `oh` the fitted overheads (sustained fractions,
    contention); `host` dispatch and launch time per kernel (default: none)."""

    ctx: StepContext
    topo: Topology
    cal: Calibration
    oh: Overheads
    host: HostCosts = HostCosts()

    @cached_property
    def framework(self) -> FrameworkProfile:
        """How `training.framework` runs what the cost model prices (data/frameworks.yaml); read
        once per StepEnv (one simulation) rather than on each of the cost model's many uses."""
        return framework_profile(self.ctx.training.framework)

    @property
    def recompute_early_stop(self) -> bool:
        """Whether full recompute stops at the block's last saved tensor: the scenario's
        `training.recompute_early_stop`, else the framework's (`compute.early_stop_skip`)."""
        own = self.ctx.training.recompute_early_stop
        return self.framework.recompute_early_stop if own is None else own
