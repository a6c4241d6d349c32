"""Hypothesis strategies shared by the analysis tests."""

import hypothesis.strategies as st


@st.composite
def prefix_traces(draw, max_requests=8, max_depth=5, max_fanout=3, max_units=14):
    """Requests walking a random prefix forest, so units get shared and cut. Ids are
    scrambled (never contiguous) so nothing can rely on their order."""
    children: dict = {}
    made = 0
    requests = []
    for _ in range(draw(st.integers(1, max_requests))):
        node, path = None, []
        for _ in range(draw(st.integers(1, max_depth))):
            kids = children.setdefault(node, [])
            pick = draw(st.integers(0, max_fanout - 1))
            if pick >= len(kids):
                if made >= max_units:
                    if not kids:
                        break
                    pick = pick % len(kids)
                else:
                    kids.append(made * 7 + 3)
                    made += 1
                    pick = len(kids) - 1
            node = kids[pick]
            path.append(node)
        requests.append(path)
    return requests
