"""A replica's device KV allocator: what running requests hold outside the tree.

SGLang's scheduler takes a request's KV slots from the token-to-KV pool allocator
(``sglang/srt/mem_cache/allocator/token.py`` ``TokenToKVPoolAllocator``, paged:
``allocator/paged.py`` ``PagedTokenToKVPoolAllocator``; hybrid SWA:
``allocator/swa.py`` ``SWATokenToKVPoolAllocator``) at prefill (``alloc_extend``)
and decode (``alloc_decode``), hands them to the radix tree when the request's
sequence is inserted (``cache_finished_req`` / ``cache_unfinished_req``: the slots
become the tree's, duplicates are freed), and ``free``s what a finished request
still holds. The simulator keeps only the count: ``KVAllocator`` is the single
writer of a replica's ``reserved`` ledger, the device tokens that running requests
hold outside the tree. The tree's own room checks (an insert's ``device_full``, a
load-back's room) and ``sim.scheduler.available`` read that ledger, as SGLang's
``available_size()`` excludes slots a request holds.

A rank with late frees (``sim.jitter``: the free lands after a drawn delay) returns
a finished request's tokens in two steps: ``free_later`` when the free is issued,
``late_freed`` when it lands; ``late`` is what is in flight meanwhile.

One allocator per replica (``sim.ranks.Cohort.kv``); a fork gives the new replica
its own (``fork``), with the same counters. Every operation is a plain integer
update: no per-token work.
"""

from __future__ import annotations


class KVAllocator:
    """The device KV a replica's running requests hold outside its tree."""

    __slots__ = ("tree", "late", "frees")

    def __init__(self, tree):
        self.tree = tree
        self.late = 0    # tokens freed on a late-free rank, not yet back (``free_later``)
        self.frees = 0   # finished-request frees issued (the key of the late-free draws)

    @property
    def reserved(self) -> int:
        """Device tokens running requests hold outside the tree."""
        return self.tree.reserved

    def alloc(self, tokens: int) -> None:
        """``alloc_extend`` / ``alloc_decode``: ``tokens`` more held by running requests
        (the caller has checked they fit: ``sim.scheduler.available``)."""
        self.tree.reserved += tokens

    def to_tree(self, tokens: int) -> None:
        """A request's own ``tokens`` pass to the tree with its insert (SGLang hands
        the slots over; the tree frees the duplicates)."""
        self.tree.reserved -= tokens

    def free(self, tokens: int) -> None:
        """``free``: a finished (or retracted) request returns ``tokens``."""
        self.tree.reserved -= tokens

    def issue_free(self) -> int:
        """Count a finished request's free on a late-free rank; returns its index
        (the key of its delay draw, ``sim.jitter.Jitter.free_delay``)."""
        n = self.frees
        self.frees = n + 1
        return n

    def free_later(self, tokens: int) -> None:
        """A free issued on a late-free rank: ``tokens`` stay held until ``late_freed``."""
        self.late += tokens

    def late_freed(self, tokens: int) -> None:
        """A late free lands: ``tokens`` are back in the allocator."""
        self.tree.reserved -= tokens
        self.late -= tokens

    def fork(self, tree) -> "KVAllocator":
        """The allocator of ``tree``, a clone of this allocator's tree: the same counts."""
        new = KVAllocator(tree)
        new.late, new.frees = self.late, self.frees
        return new
