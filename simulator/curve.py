"""A curve y(x) through measured points, piecewise linear in log(x) (efficiency over size or time)."""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Curve:
    """y(x) piecewise linear in log(x) through the points, flat beyond the first and last."""
    xs: tuple[float, ...]
    ys: tuple[float, ...]

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, x)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * math.log(x / x0) / math.log(x1 / x0)

    def scaled(self, y_factor: float) -> "Curve":
        return Curve(self.xs, tuple(y * y_factor for y in self.ys))
