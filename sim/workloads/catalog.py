"""The known request traces: the ones shipped under data/traces/ and larger public ones
that ``hicache-sim traces fetch`` downloads into the trace cache.

This module is the registry, and it is data only: names, sources (repository, pinned
commit, path), formats, request counts and SHA-256 checksums. It is never read from a
file a user supplies, so a name on the command line can only select one of these.

Shipped files are the upstream files gzip-compressed (``data/traces/README.md``); their
checksums are those of ``data/traces/SHA256SUMS`` (a test keeps the two equal). Remote
files are fetched unchanged from ``raw.githubusercontent.com`` at the pinned commit. A
remote file whose checksum could not be taken offline has ``sha256=None``: the fetch
computes it, prints it and records it beside the file, and ``traces verify`` checks it
from then on (``--sha256`` pins one up front).
"""

from __future__ import annotations

from dataclasses import dataclass, field

RAW_BASE = "https://raw.githubusercontent.com"

MOONCAKE = ("kvcache-ai/Mooncake", "3b5a594133958449a1feaf1c9e0fc1b553e34a28")
KV_CACHE_TESTER = ("callanjfox/kv-cache-tester", "94f6046dfd9c0c8bc0cdb24a5aa6579bac8669bf")


@dataclass(frozen=True)
class TraceFile:
    """One file of a trace: where it lives upstream and, when known, its checksum."""

    name: str  # the file name in the trace's folder (shipped: under data/traces/<folder>/)
    sha256: str | None = None
    upstream: str | None = None  # path in the source repository (remote traces)
    size: int | None = None  # bytes, when known offline


@dataclass(frozen=True)
class TraceEntry:
    name: str  # what `hicache-sim traces fetch NAME` takes
    description: str
    format: str  # the scenario's workload.format: mooncake, agentic or generic
    shipped: bool  # under data/traces/ (nothing to fetch)
    folder: str  # shipped: data/traces/<folder>; remote: <trace cache>/<folder>
    files: tuple[TraceFile, ...]
    source: tuple[str, str]  # (repository, commit)
    license: str
    requests: int | None = None  # None: not counted offline
    scenario_path: str = ""  # what a scenario's workload.path names (relative to a root)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def repository(self) -> str:
        return self.source[0]

    @property
    def commit(self) -> str:
        return self.source[1]


def _files(pairs) -> tuple[TraceFile, ...]:
    return tuple(TraceFile(n, h) for n, h in pairs)


def _upstream(folder: str, names, sha256=None) -> tuple[TraceFile, ...]:
    return tuple(TraceFile(n, sha256, f"{folder}/{n}") for n in names)


TRACES: tuple[TraceEntry, ...] = (
    TraceEntry(
        name="mooncake-conversation",
        description="Mooncake FAST'25 conversation trace (Kimi), real arrivals, 512-token blocks",
        format="mooncake", shipped=True, folder="mooncake-fast25",
        files=_files([("conversation_trace.jsonl.gz",
                       "cbae1655f679723e13e66e016606208ac03590d5b470d82cc4306a249288ea8a")]),
        source=MOONCAKE, license="Apache-2.0", requests=12_031,
        scenario_path="traces/mooncake-fast25/conversation_trace.jsonl.gz",
    ),
    TraceEntry(
        name="mooncake-synthetic",
        description="Mooncake FAST'25 synthetic trace, Poisson arrivals, long shared prefixes",
        format="mooncake", shipped=True, folder="mooncake-fast25",
        files=_files([("synthetic_trace.jsonl.gz",
                       "e43beb47ac9d36c2e7b1254e3309dd3c39cebc26c8ef340612070bf0298bacb8")]),
        source=MOONCAKE, license="Apache-2.0", requests=3_993,
        scenario_path="traces/mooncake-fast25/synthetic_trace.jsonl.gz",
    ),
    TraceEntry(
        name="claude-code-subset",
        description="29 Claude Code agentic sessions (WEKA kv-cache-tester), incl. sub-agents",
        format="agentic", shipped=True, folder="weka-claude-code-subset",
        files=_files([
        ("trace_0001.json.gz", "2af9053e211e236075b7425d42609e4826b0247a91a41c6890b5d52c201edf30"),
        ("trace_0002.json.gz", "b77d3a145c78459c1cce8a0d9bbfb409df154e344dbfaa65a011b54c6228d3c0"),
        ("trace_0003.json.gz", "bdb65684d9488c3c0320e20146a5638cf7274c4621ab7695759990fde626380e"),
        ("trace_0004.json.gz", "bf0dc7eb57bb462b7979fdd9d8073d7b217c2d97d77853f976196fb61696229c"),
        ("trace_0006.json.gz", "677daabe56b61ff9b32a0b3d997404feb878b6b83569c3fdebbe11fa97894d32"),
        ("trace_0007.json.gz", "2f0c6b9b9eb230d615d713ebc216646cd3a8492f3177192cbbec5961a18b8d56"),
        ("trace_0008.json.gz", "72a9003154cd60609510d88d746abd3af167a4e331b754fc96687786c6453592"),
        ("trace_0009.json.gz", "472c38e4bf7a8818e835438d412571f40b6d28fcbd9736db42a768d00997a4d6"),
        ("trace_0010.json.gz", "d55cef48760e333d573a05603877d87c06b79a79f4fde41c9165c274dcce83ad"),
        ("trace_0011.json.gz", "8857dddada71d025bbb2c7771555372cc1b043266b0c0fdb386758bc9b076988"),
        ("trace_0012.json.gz", "1596044cd44c233e983e56ed013edfc0a59102a20c17b71a1037fc0bd531dac6"),
        ("trace_0013.json.gz", "5519d8af272f1d9998dc16320d60cad3f5b18f48ba9d468e9d642c455c6e2466"),
        ("trace_0014.json.gz", "6c651bf3f9cb6276be3ab98d7464706d4a97ecebe51c9af7ed8c271083af189c"),
        ("trace_0015.json.gz", "c94f6c17c73cdbe52680f7f9a5e2124e28d8af2d46f2c5a5e4fa9c0468f2e0d0"),
        ("trace_0016.json.gz", "8f61fbaa0b8427fc529c2185714a010ea3d680aa3a661015447df0e97c38ad5f"),
        ("trace_0017.json.gz", "0d909ff5cc18cead626aa50ff97e546d3ca22b2eed67fe1e1327c508b96f84fd"),
        ("trace_0018.json.gz", "1523692a6f603948f0df5a5b5d2894672e55e97217101aadebea02e1ff953f5d"),
        ("trace_0019.json.gz", "3195becdf87a093fc5cf0111e26197501bb8c2fc544811711af4007eb883ef2b"),
        ("trace_0020.json.gz", "d847f764ef30bf59944b9da4cab783d2bec79a63db2ea13252dec9c52fcb94d8"),
        ("trace_0021.json.gz", "39600c05afb6948ecde1e165af4b5de367bca6e41d42b258b6a5af11b656ff26"),
        ("trace_0022.json.gz", "6db0141e1f54e7c86f29ca4ae163ba7b7765b877901807459fc73be91d54cd06"),
        ("trace_0023.json.gz", "6f647468bd043f7fbbdc30847871803933c7126bde56a922125fc688b3ca9bd2"),
        ("trace_0024.json.gz", "8bd5284b80dafd804d3f07e092ed082098837e7f22e5383361c00bdcbc4067ac"),
        ("trace_0026.json.gz", "ce37c7bf337e22c180ddccefc25b2e8d45aaed2169cb0ef30655b12d3b58f302"),
        ("trace_0027.json.gz", "fc748c1beca6218709faa30b2126bc88a35c45d4778cbc7fcbc428a4151d1c16"),
        ("trace_0028.json.gz", "13e2d20bdb3c5e42fb9b7cd0f7786c388195992c323336c8750b8590bcf5ac26"),
        ("trace_0029.json.gz", "f5aa890105c60728d9c0202e2b37e217592206fe79014b950626089c0ddcd1e2"),
        ("trace_0030.json.gz", "81f87eb559197c6ad29353af2ccfb75335cdd9cec105c9a180c199150e3f5cf1"),
        ("trace_0032.json.gz", "a2f6f25e8bf73a3710af852c474f1ae2a499fd55af71806363a77f2c376de6fc"),
        ]),
        source=KV_CACHE_TESTER, license="Apache-2.0", requests=3_006,
        scenario_path="traces/weka-claude-code-subset",
    ),
    TraceEntry(
        name="mooncake-toolagent",
        description="Mooncake FAST'25 tool-and-agent trace (about 4 MB), real arrivals",
        format="mooncake", shipped=False, folder="mooncake-toolagent",
        files=_upstream("FAST25-release/traces", ["toolagent_trace.jsonl"]),
        source=MOONCAKE, license="Apache-2.0", requests=23_608,
        scenario_path="mooncake-toolagent/toolagent_trace.jsonl",
    ),
    TraceEntry(
        name="mooncake-arxiv",
        description="Mooncake's first trace, released with the arXiv technical report",
        format="mooncake", shipped=False, folder="mooncake-arxiv",
        files=_upstream("FAST25-release/arxiv-trace", ["mooncake_trace.jsonl"]),
        source=MOONCAKE, license="Apache-2.0",
        scenario_path="mooncake-arxiv/mooncake_trace.jsonl",
    ),
    TraceEntry(
        name="claude-code-large",
        description="the kv-cache-tester sessions of trace_0001-0032 left out of the shipped "
                    "subset (each over 4 MiB)",
        format="agentic", shipped=False, folder="claude-code-large",
        files=_upstream("traces", [f"trace_{i:04d}.json" for i in (5, 25, 31)]),
        source=KV_CACHE_TESTER, license="Apache-2.0",
        scenario_path="claude-code-large",
        notes=("a file the pinned commit does not hold fails the fetch with one line",),
    ),
    TraceEntry(
        name="claude-code-more",
        description="12 more Claude Code agentic sessions from kv-cache-tester "
                    "(trace_0033-0044)",
        format="agentic", shipped=False, folder="claude-code-more",
        files=_upstream("traces", [f"trace_{i:04d}.json" for i in range(33, 45)]),
        source=KV_CACHE_TESTER, license="Apache-2.0",
        scenario_path="claude-code-more",
    ),
)

BY_NAME = {t.name: t for t in TRACES}


def get(name: str) -> TraceEntry | None:
    return BY_NAME.get(name)


def raw_url(entry: TraceEntry, f: TraceFile, base: str = RAW_BASE) -> str:
    """The file's URL under ``base``, laid out as raw.githubusercontent.com is:
    ``<base>/<owner>/<repo>/<commit>/<path>`` (a mirror keeps the same layout)."""
    return f"{base.rstrip('/')}/{entry.repository}/{entry.commit}/{f.upstream}"
