"""Offline analyses of request traces: LRU stack distances and the offline optimum."""
