"""Write policies: when KV gets a host copy (sem §3.3, §3.5, §7), for every tree
(FULL-only and hybrid): SGLang's --hicache-write-policy
(unified_cache/storage_attachment.py ``_WRITE_POLICIES``). write_back acks each
backup before its eviction goes on; the write_through ones back nodes up at insert
time once their hit count reaches WRITE_THROUGH_THRESHOLD (unified_radix_cache.py
``__init__``)."""

from __future__ import annotations

from dataclasses import dataclass

from sim.constants import WRITE_THROUGH_THRESHOLD


@dataclass(frozen=True, slots=True)
class WritePolicy:
    """What a write policy changes in the tree's transitions.

    ``hit_threshold`` is None under write_back: inserts never count hits or back up,
    and a D-only eviction victim gets a blocking single-node backup instead of being
    deleted. Only write_back pins load-backs and reclaims host duplicates.
    """

    name: str
    write_back: bool
    hit_threshold: int | None

    @property
    def pins_load_back(self) -> bool:
        return self.write_back

    @property
    def reclaims_duplicates(self) -> bool:
        return self.write_back


WRITE_POLICIES = {
    "write_back": WritePolicy("write_back", True, None),
    "write_through": WritePolicy(
        "write_through", False, WRITE_THROUGH_THRESHOLD["write_through"]
    ),
    "write_through_selective": WritePolicy(
        "write_through_selective", False, WRITE_THROUGH_THRESHOLD["write_through_selective"]
    ),
}
