"""The node of the hybrid tree (``sim/tree/hybrid.py``), SGLang 0.5.23's
``UnifiedTreeNode`` with FULL's and one auxiliary component's values (SWA or Mamba,
``sim/tree/components/``) as slots, not ``component_data`` dicts: the core and
every component read the same node fields directly."""

from __future__ import annotations


class HNode:
    """A radix node: FULL's device value (always, with HiCache off) and host value;
    the auxiliary component's device and host values maybe.

    ``lock``: FULL ``lock_ref``; ``aux``/``aux_lock``: the auxiliary component's value
    present / ``lock_ref``; ``uuid``: SWA's window-lock boundary mark
    (``metadata["uuid"]``); ``lp``/``ln``: links in the auxiliary device LRU list
    (``lru_prev``/``lru_next``), ``lp is None`` when not in it. Host tier (HiCache
    on): ``dev``/``host``: FULL's device / host value present; ``host_lock``: FULL
    ``host_lock_ref``, ``host_tops``: the host locks whose boundary (FULL's
    ``metadata["host_uuid"]``) sits here; ``aux_host``/``aux_host_lock``: the
    auxiliary host value / ``host_lock_ref``; ``hlp``/``hln``: links in its host LRU;
    ``lb``: the anchor of the load-back pinning this node (``load_back_pending_id``);
    write_through: ``hit_count`` and ``wp`` (``write_through_pending_id``); ``priority``:
    SGLang's insert priority, 0 on every node here (the engine inserts a hybrid
    request at priority 0), read only by the ``priority`` eviction policy."""

    __slots__ = ("id", "parent", "children", "key", "lock", "aux", "aux_lock", "uuid",
                 "last_access", "creation", "lp", "ln")
    # The host tier's fields, at their HiCache-off values: class attributes, so a
    # device-only node stays as small and as quick to build as before;
    # ``HostHNode`` holds them per node.
    dev = True
    host = False
    host_lock = 0
    host_tops = None
    aux_host = False
    aux_host_lock = 0
    hlp = None
    hln = None
    lb = None
    hit_count = 0
    priority = 0
    wp = None
    huuid = None

    def __init__(self, nid: int, key: list, parent, t_access: float, t_create: float):
        self.id = nid
        self.parent = parent
        self.children: dict = {}
        self.key = key
        self.lock = 0
        self.aux = False
        self.aux_lock = 0
        self.uuid = None
        self.last_access = t_access
        self.creation = t_create
        self.lp = None
        self.ln = None

    def __copy__(self) -> "HNode":
        """A shallow copy, slot by slot (``copy.copy``'s generic path for a slotted
        class goes through ``__reduce_ex__`` at about ten times the cost, and a fork
        copies every node of the tree)."""
        y = object.__new__(type(self))
        self._copy_slots(y)
        return y

    def _copy_slots(self, y) -> None:
        y.id, y.parent, y.children, y.key = self.id, self.parent, self.children, self.key
        y.lock, y.aux, y.aux_lock, y.uuid = self.lock, self.aux, self.aux_lock, self.uuid
        y.last_access, y.creation, y.lp, y.ln = (self.last_access, self.creation,
                                                 self.lp, self.ln)

    def __repr__(self) -> str:
        return f"HNode({self.id}, {len(self.key)}p{', aux' if self.aux else ''})"


class HostHNode(HNode):
    """A node of a tree with the host tier (HiCache on): the host fields per node."""

    __slots__ = ("dev", "host", "host_lock", "host_tops", "aux_host", "aux_host_lock",
                 "hlp", "hln", "lb", "hit_count", "wp", "huuid", "priority")

    def __init__(self, nid: int, key: list, parent, t_access: float, t_create: float):
        super().__init__(nid, key, parent, t_access, t_create)
        self.dev = True
        self.host = False
        self.host_lock = 0
        self.host_tops = None
        self.aux_host = False
        self.aux_host_lock = 0
        self.hlp = None
        self.hln = None
        self.lb = None
        # write_through: core ``hit_count`` and ``write_through_pending_id`` (the ack
        # id, the backed-up node's id, of the write in flight covering this node).
        self.hit_count = 0
        self.wp = None
        # SWA: the host-lock window boundary (swa ``metadata["host_uuid"]``).
        self.huuid = None
        # SGLang's insert priority (``_insert_helper``), read by the ``priority``
        # eviction policy; 0 unless an insert names one (a FULL-only core's).
        self.priority = 0

    def _copy_slots(self, y) -> None:
        HNode._copy_slots(self, y)
        y.dev, y.host, y.host_lock, y.host_tops = (self.dev, self.host, self.host_lock,
                                                   self.host_tops)
        y.aux_host, y.aux_host_lock, y.hlp, y.hln = (self.aux_host, self.aux_host_lock,
                                                     self.hlp, self.hln)
        y.lb, y.hit_count, y.wp, y.huuid, y.priority = (self.lb, self.hit_count, self.wp,
                                                        self.huuid, self.priority)

