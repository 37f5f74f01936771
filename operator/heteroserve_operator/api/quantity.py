"""Kubernetes resource quantities ("1.5Gi", "1536Mi", "500m", "1e3") as exact numbers.

The apiserver stores a quantity in its canonical form (`1.5Gi` comes back as `1536Mi`), so two
quantities are equal when their values are, not their spellings.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
           "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
           "P": Decimal("1e15"), "E": Decimal("1e18")}
# The apiserver's grammar: a signed decimal number, then a binary or decimal SI suffix or a
# decimal exponent (e/E followed by a signed integer).
_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(\d+\.?\d*|\.\d+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?|[eE][+-]?\d+)$")


class QuantityError(ValueError):
    """Not a Kubernetes quantity."""


def parse_quantity(text: str) -> Decimal:
    """"1.5Gi" -> Decimal(1610612736); raises QuantityError for anything the apiserver would not
    take as a quantity."""
    match = _QUANTITY.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise QuantityError(f"not a Kubernetes quantity: {text!r}")
    try:
        number = Decimal(match["number"])
    except InvalidOperation:  # pragma: no cover - the pattern admits only decimals
        raise QuantityError(f"not a Kubernetes quantity: {text!r}") from None
    suffix = match["suffix"]
    if suffix in BINARY:
        return number * BINARY[suffix]
    if suffix in DECIMAL:
        return number * DECIMAL[suffix]
    return number.scaleb(int(suffix[1:]))


def same_quantity(one: object, other: object) -> bool:
    """True when both are quantities of the same value (or, failing to parse, equal)."""
    if one == other:
        return True
    if not (isinstance(one, str | int | float) and isinstance(other, str | int | float)):
        return False
    try:
        return parse_quantity(str(one)) == parse_quantity(str(other))
    except QuantityError:
        return False
