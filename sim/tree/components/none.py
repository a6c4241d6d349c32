"""The null auxiliary component: ``HybridTree(NoComponent(), ...)`` is SGLang 0.5.23's
``UnifiedTreeCore`` with ``components=(FULL,)``, FULL alone.

SGLang's core loops over its components; with FULL alone every loop has only FULL's
turn. Here the core always calls its one auxiliary component's hooks, so FULL alone
is the component that holds nothing: no device or host values (every ``aux`` /
``aux_host`` slot stays False, every ``aux_lock`` 0), no locks, empty LRU lists, no
match constraint (every node is a valid boundary, so ``best_match_node`` is FULL's
own: full.py ``create_match_validator``), no branching seqlen, nothing to back up or
load, nothing to evict. Each hook below is the base's no-op or the value a component
that is absent contributes to the core's aggregate (core ``_match_post_processor``,
``inc_lock_ref``, ``_evict_components``, ...).

Two things the core reads of its component differ from SWA/Mamba:

* ``prev_at_boundary`` False: the core does not require an insert's
  ``prev_prefix_len`` to end on a node boundary. With FULL alone SGLang uses it only
  to pick which of the request's fresh device slots are duplicates to free
  (core ``_insert_overlap_step``: ``dup_start``), which is no tree state; SWA's
  window start reads it (swa.py ``update_component_on_insert_overlap``) and the
  hybrid traces' rule that it ends where the match ended stays theirs.
* ``lru_lists`` 0: ``reset()`` builds a device and a host ``UnifiedLRUList`` per
  component type (core ``reset``), none for a component that is not there, so the
  root is followed by FULL's four sentinels alone.
"""

from __future__ import annotations

from sim.tree.components.base import TreeComponent


class NoComponent(TreeComponent):
    """No auxiliary component: the FULL-only unified core (module docstring)."""

    __slots__ = ()

    name = "none"
    priority = 0
    prev_at_boundary = False
    lru_lists = 0
    holds_values = False

    def value_len(self, node) -> int:
        return 0

    def value_len_of(self, node) -> int:
        return 0

    def host_value_len(self, node) -> int:
        return 0

    def split(self, up, child) -> None:
        """Nothing of this component's to share out (FULL's part is the core's)."""

    def match_validator(self, device_only: bool = True):
        """None: every node is a valid boundary (the core then calls no validator)."""
        return None

    def acquire_lock(self, node):
        return None

    def release_lock(self, node, uuid) -> None:
        """Nothing was locked."""

    def evict_device(self, request: int, res) -> None:
        """No values: the component's walk finds nothing (its LRU is empty)."""

    def drive_host_eviction(self, n: int) -> int:
        return 0
