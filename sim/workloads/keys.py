"""Tree keys from prefix-block ids: one int unit per full page.

SGLang truncates every key to whole pages (``page_aligned``, sem §1.2): a trailing
partial page is never matched nor inserted. The engine therefore keys a request by
``page_key(...)``, one unit per *full* page of its input, and (if it caches the
decoded tokens) appends ``output_key(...)`` for the pages the output completes.

Id conventions (both are ints, so the tree compares them cheaply):

* input pages are **non-negative**: derived from the prefix-block ids, so two
  requests share page ``p`` exactly when they share the whole prefix up to it;
* output pages are **negative**: ``-(1 + rid * 2**32 + page_index)``. They never
  collide with input pages (sign) nor with other requests' output pages (``rid``).
  Traces hash only the input, so a decoded page can never be matched by a later
  request's block ids: output pages only occupy capacity. Reuse is resolved at block
  granularity, which is all the traces record.
"""

from __future__ import annotations

from sim.errors import UserError

# Output page ids: rid * OUTPUT_PAGE_STRIDE + page index, negated. 2**32 pages per
# request is far beyond any context length, and output_key checks it.
OUTPUT_PAGE_STRIDE = 1 << 32


def pages_per_block(block_size: int, page_size: int) -> tuple[int, int]:
    """(pages per block, blocks per page); exactly one of them is > 1 unless equal.

    Raises UserError unless one size divides the other.
    """
    if block_size <= 0 or page_size <= 0:
        raise UserError(
            f"found block_size {block_size}, page_size {page_size}; expected positive sizes"
        )
    if page_size <= block_size:
        if block_size % page_size:
            raise UserError(
                f"found block_size {block_size} and page_size {page_size}; "
                "expected page_size to divide block_size (or block_size to divide page_size)"
            )
        return block_size // page_size, 1
    if page_size % block_size:
        raise UserError(
            f"found block_size {block_size} and page_size {page_size}; "
            "expected block_size to divide page_size (or page_size to divide block_size)"
        )
    return 1, page_size // block_size


def page_key(blocks, block_size: int, page_size: int, input_len: int) -> list[int]:
    """One int per full page of the first ``input_len`` tokens of ``blocks``.

    * ``page_size <= block_size``: page ``j`` of block ``b`` is ``b * r + j`` with
      ``r = block_size // page_size``. Distinct prefix ids give disjoint id ranges.
    * ``page_size > block_size``: a page's id is the prefix id of its last block,
      unique because that block's prefix id names the whole prefix.

    ``input_len`` may be less than the request's input (a prefill chunk). A trailing
    partial page is dropped, as SGLang does.
    """
    r, k = pages_per_block(block_size, page_size)
    n_pages = input_len // page_size
    if n_pages <= 0:
        return []
    if k == 1:
        if r == 1:
            if len(blocks) < n_pages:
                _short(blocks, block_size, input_len)
            return list(blocks[:n_pages])
        n_blocks = -(-n_pages // r)
        if len(blocks) < n_blocks:
            _short(blocks, block_size, input_len)
        # page j of block b is b * r + j: each block's pages are one C-level range
        # extend, not r Python-level additions (at page size 1, one per token)
        key: list[int] = []
        extend = key.extend
        for b in blocks[:n_blocks]:
            start = b * r
            extend(range(start, start + r))
        del key[n_pages:]
        return key
    if len(blocks) < n_pages * k:
        _short(blocks, block_size, input_len)
    return list(blocks[k - 1 : n_pages * k : k])


def output_key(rid: int, input_len: int, output_len: int, page_size: int) -> list[int]:
    """Negative ids for the full pages that the output completes.

    These are the pages ``input_len // page_size`` up to
    ``(input_len + output_len) // page_size`` (exclusive) of the full sequence; the
    page that straddles the input's tail and the output's head counts as output.
    ``page_key(...) + output_key(...)`` is the key of the finished sequence.
    """
    first = input_len // page_size
    last = (input_len + output_len) // page_size
    if last >= OUTPUT_PAGE_STRIDE:
        raise UserError(f"found {last} pages in request {rid}; expected fewer than 2**32")
    base = -1 - rid * OUTPUT_PAGE_STRIDE
    return list(range(base - first, base - last, -1))


def _short(blocks, block_size: int, input_len: int) -> None:
    raise UserError(
        f"found {len(blocks)} blocks of {block_size} tokens; "
        f"expected at least enough blocks for {input_len} input tokens"
    )


def page_units(blocks, block_counts, block_sizes, page_size: int, input_lens):
    """``page_key`` of many requests at once, as one flat int64 array and the offset
    of each request's first page (``len = requests + 1``): what the planner's one-pass
    curves take, without a Python list per request.

    ``blocks`` holds every request's block ids back to back (``block_counts[i]`` of
    them for request ``i``); ``block_sizes`` and ``input_lens`` are per request. Each
    request's run equals ``page_key(its blocks, its block size, page_size, its
    input)``: the same ids in the same order (tests check it). A request with too few
    blocks raises page_key's error for the first such request. Block ids are an
    ``IdSpace``'s (dense, non-negative), so ``id * pages per block`` fits in int64.
    """
    import numpy as np

    blocks = np.asarray(blocks, dtype=np.int64)
    counts = np.asarray(block_counts, dtype=np.int64)
    bs = np.asarray(block_sizes, dtype=np.int64)
    n_in = np.asarray(input_lens, dtype=np.int64)
    n = len(counts)
    bstarts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=bstarts[1:])
    if n and page_size <= 0:
        page_key(blocks[:bstarts[1]].tolist(), int(bs[0]), page_size, int(n_in[0]))
    fine = bs >= page_size  # page_size <= block_size: r pages per block
    safe = np.maximum(bs, 1)
    r = np.where(fine, safe // page_size, 1)
    k = np.where(fine, 1, page_size // safe)
    n_pages = np.maximum(n_in // page_size, 0)
    need = np.where(fine, -(-n_pages // r), n_pages * k)
    bad_size = (bs <= 0) | np.where(fine, safe % page_size, page_size % safe).astype(bool)
    bad = np.flatnonzero(bad_size | ((n_pages > 0) & (counts < need)))
    if len(bad):  # the first bad request raises page_key's own error
        i = int(bad[0])
        page_key(blocks[bstarts[i]:bstarts[i + 1]].tolist(), int(bs[i]), page_size, int(n_in[i]))
        raise AssertionError("page_key accepted a request page_units refused")  # pragma: no cover
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(n_pages, out=starts[1:])
    total = int(starts[-1])
    one_size = len(r) and (r == r[0]).all() and (k == k[0]).all()
    if one_size and int(k[0]) == 1 and int(r[0]) > 1:
        # one block size of several pages (the Mooncake traces): by blocks, not pages
        return _split_blocks(blocks, bstarts, n_pages, need, int(r[0])), starts
    req = np.repeat(np.arange(n, dtype=np.int64), n_pages)
    j = np.arange(total, dtype=np.int64) - starts[:-1][req]  # page index within its request
    if one_size:
        r, k = int(r[0]), int(k[0])  # one block size (every trace but a generic one): scalars
    else:
        r, k = r[req], k[req]
    if isinstance(k, int) and k == 1:
        units = blocks[bstarts[:-1][req] + j] if r == 1 else blocks[bstarts[:-1][req] + j // r] * r + j % r
    else:
        bidx = np.where(k == 1, j // r, (j + 1) * k - 1)
        units = blocks[bstarts[:-1][req] + bidx] * r + np.where(k == 1, j % r, 0)
    return units.astype(np.int64, copy=False), starts


def _split_blocks(blocks, bstarts, n_pages, need, r: int):
    """``page_units``' ids for one block size of ``r`` pages: each request's first
    ``need`` blocks, block ``b`` as pages ``b * r .. b * r + r - 1``, the last one cut
    to the request's remaining pages. The same ids in the same order as page by page
    (page ``j`` of a request is page ``j % r`` of its block ``j // r``), with the
    per-page work done once per block: a few passes over the pages instead of a
    dozen (about 0.1 s of a Mooncake plan's CPU)."""
    import numpy as np

    nb = need * (n_pages > 0)  # blocks each request uses
    bs = np.zeros(len(nb) + 1, dtype=np.int64)
    np.cumsum(nb, out=bs[1:])
    # the block ids in request order: request i's run starts at bstarts[i]
    bidx = np.arange(int(bs[-1]), dtype=np.int64) + np.repeat(bstarts[:-1] - bs[:-1], nb)
    pages = (blocks[bidx] * r)[:, None] + np.arange(r, dtype=np.int64)
    used = nb > 0
    tail = n_pages[used] - (nb[used] - 1) * r  # pages of each request's last block, 1..r
    if (tail == r).all():
        return pages.reshape(-1)
    keep = np.ones(pages.shape, dtype=bool)
    keep[bs[1:][used] - 1] = np.arange(r) < tail[:, None]
    return pages[keep]
