"""Pluggable cache policies, each resolved by name through a registry.

- ``write``: what device eviction and inserts do with the host tier
  (``write_back``, ``write_through``, ``write_through_selective``).
- ``host``: how host pressure is relieved (``duplicate_first`` = SGLang PR #33777,
  ``lru``, ``duplicate_first_single_pass``, ``duplicate_first_by_id``).
- ``eviction``: the heap priority of device and host leaves (``lru``, ``lfu``, ...).
"""

from sim.errors import UserError


def resolve(registry: dict, name: str, what: str, where: str | None = None):
    """Look ``name`` up in ``registry``; a miss is a one-line error listing the names."""
    try:
        return registry[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(registry))
        raise UserError(f"unknown {what} {name!r}; expected one of: {known}", where=where) from None
