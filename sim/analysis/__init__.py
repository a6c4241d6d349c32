"""Offline analyses of request traces.

``stack_distance``: one-pass LRU hit-rate curves; ``optimum``: the offline optimum
(single and two tiers); ``replay``: the real radix tree replayed as a single-tier LRU
and compared with the curve; ``bound``: a scenario's reference hit rates and the bound
the reports draw (``bound.json``).
"""
