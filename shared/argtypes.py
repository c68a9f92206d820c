"""The ranges an ``Args`` field declares on its type, read by ``shared.cli.parse_args``.

Guarantees
- ``Annotated[T, Range(...)]`` declares the values a field allows (bounds open or closed); ``parse_args`` refuses
  any other value with one line naming the flag, the range and the value, and exit 2.
- ``PositiveInt``, ``NonNegInt``, ``PositiveFloat``, ``NonNegFloat`` and ``Fraction`` ([0, 1]) are the common
  ones; tyro sees the plain ``int`` or ``float`` underneath.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

__all__ = ["Fraction", "NonNegFloat", "NonNegInt", "PositiveFloat", "PositiveInt", "Range"]


@dataclass(frozen=True)
class Range:
    """A field's allowed values, declared on its type: ``Annotated[float, Range(gt=0, lt=1)]``."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None

    def allows(self, v: float) -> bool:
        return (
            (self.gt is None or v > self.gt)
            and (self.ge is None or v >= self.ge)
            and (self.lt is None or v < self.lt)
            and (self.le is None or v <= self.le)
        )

    def __str__(self) -> str:
        if (self.gt, self.ge, self.lt, self.le) == (0, None, None, None):
            return "positive"
        if (self.gt, self.ge, self.lt, self.le) == (None, 0, None, None):
            return "non-negative"
        lo = f"({self.gt}" if self.gt is not None else f"[{self.ge}" if self.ge is not None else "(-inf"
        hi = f"{self.lt})" if self.lt is not None else f"{self.le}]" if self.le is not None else "inf)"
        return f"in {lo}, {hi}"


PositiveInt = Annotated[int, Range(gt=0)]
NonNegInt = Annotated[int, Range(ge=0)]
PositiveFloat = Annotated[float, Range(gt=0)]
NonNegFloat = Annotated[float, Range(ge=0)]
Fraction = Annotated[float, Range(ge=0, le=1)]  # [0, 1]: discounts, probabilities, exponents
