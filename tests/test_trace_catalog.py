"""`hicache-sim traces`: the registry, verify, and fetch from a local file:// mirror.

No test here touches the network: every fetch names a ``file://`` mirror in tmp_path,
laid out as raw.githubusercontent.com is."""

import gzip
import hashlib
from pathlib import Path

import pytest

import cli
from conftest import ROOT
from sim.workloads import catalog
from sim.workloads.fetch import MANIFEST, read_manifest

TOOLAGENT = catalog.get("mooncake-toolagent")


def _mirror(tmp_path: Path, entry, contents: dict[str, bytes]) -> str:
    """A mirror holding ``contents`` (file name -> bytes) for ``entry``; its base URL."""
    base = tmp_path / "mirror"
    for f in entry.files:
        if f.name in contents:
            p = base / entry.repository / entry.commit / f.upstream
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(contents[f.name])
    base.mkdir(exist_ok=True)
    return base.as_uri()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    c = tmp_path / "cache"
    monkeypatch.setenv("HICACHE_TRACE_CACHE", str(c))
    return c


def _lines(n: int) -> bytes:
    """The first n requests of the shipped conversation trace (a valid Mooncake file)."""
    path = ROOT / "data" / "traces" / "mooncake-fast25" / "conversation_trace.jsonl.gz"
    with gzip.open(path, "rb") as f:
        return b"".join(next(f) for _ in range(n))


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_the_registry_matches_the_shipped_checksums():
    sums = {}
    for line in (ROOT / "data" / "traces" / "SHA256SUMS").read_text().splitlines():
        digest, rel = line.split()
        sums[rel] = digest
    registered = {f"{t.folder}/{f.name}": f.sha256 for t in catalog.TRACES if t.shipped
                  for f in t.files}
    assert registered == sums
    for t in catalog.TRACES:
        assert (t.shipped and not any(f.upstream for f in t.files)) or \
            (not t.shipped and all(f.upstream for f in t.files)), t.name
        if t.shipped:
            assert (ROOT / "data" / t.scenario_path).exists()


def test_remote_urls_point_at_the_pinned_commits():
    f = TOOLAGENT.files[0]
    assert catalog.raw_url(TOOLAGENT, f) == (
        "https://raw.githubusercontent.com/kvcache-ai/Mooncake/"
        "3b5a594133958449a1feaf1c9e0fc1b553e34a28/FAST25-release/traces/toolagent_trace.jsonl")
    arxiv = catalog.get("mooncake-arxiv")
    assert catalog.raw_url(arxiv, arxiv.files[0]).endswith(
        "/FAST25-release/arxiv-trace/mooncake_trace.jsonl")
    assert TOOLAGENT.requests == 23_608
    more = catalog.get("claude-code-more")
    assert catalog.raw_url(more, more.files[0]).startswith(
        "https://raw.githubusercontent.com/callanjfox/kv-cache-tester/"
        "94f6046dfd9c0c8bc0cdb24a5aa6579bac8669bf/traces/trace_")


def test_list_shows_every_trace_and_its_state(cache, capsys):
    assert cli.main(["traces"]) == 0
    out = capsys.readouterr().out
    for t in catalog.TRACES:
        assert t.name in out
    assert "not fetched" in out and str(cache) in out


def test_fetch_from_a_mirror_records_the_checksum_and_a_scenario_can_use_it(tmp_path, cache, capsys):
    data = _lines(40)
    mirror = _mirror(tmp_path, TOOLAGENT, {"toolagent_trace.jsonl": data})
    assert cli.main(["traces", "fetch", "mooncake-toolagent", "--mirror", mirror]) == 0
    out = capsys.readouterr().out
    target = cache / "mooncake-toolagent" / "toolagent_trace.jsonl"
    digest = hashlib.sha256(data).hexdigest()
    assert target.read_bytes() == data
    assert f"{len(data):,} bytes, SHA-256 {digest}" in out and "pin it with --sha256" in out
    assert read_manifest(target.parent / MANIFEST) == {"toolagent_trace.jsonl": digest}
    assert sorted(p.name for p in target.parent.iterdir()) == sorted([MANIFEST, target.name])

    # the cache is a trace root: a scenario names the path the fetch printed
    from sim.scenario import load_scenario
    from sim.workloads.count import expected_requests

    scn = tmp_path / "s.yaml"
    scn.write_text((ROOT / "scenarios" / "mooncake_conversation.yaml").read_text().replace(
        "traces/mooncake-fast25/conversation_trace.jsonl.gz", TOOLAGENT.scenario_path))
    assert expected_requests(load_scenario(scn)) == 40

    # verify checks it against the checksum recorded at the first fetch
    assert cli.main(["traces", "verify", "mooncake-toolagent"]) == 0
    assert "ok" in capsys.readouterr().out
    target.write_bytes(data + b"\n")  # damaged afterwards
    assert cli.main(["traces", "verify", "mooncake-toolagent"]) == 1
    out, err = capsys.readouterr()
    assert "MISMATCH" in out and "mismatch" in err


def test_a_checksum_mismatch_keeps_nothing(tmp_path, cache, capsys):
    mirror = _mirror(tmp_path, TOOLAGENT, {"toolagent_trace.jsonl": _lines(5)})
    rc = cli.main(["traces", "fetch", "mooncake-toolagent", "--mirror", mirror,
                   "--sha256", "0" * 64])
    assert rc == 2
    assert "checksum mismatch" in _one_line_error(capsys)
    folder = cache / "mooncake-toolagent"
    assert not folder.exists() or list(folder.iterdir()) == []  # no partial or temp file


def test_a_refetch_must_match_the_first_fetch(tmp_path, cache, capsys):
    mirror = _mirror(tmp_path, TOOLAGENT, {"toolagent_trace.jsonl": _lines(5)})
    assert cli.main(["traces", "fetch", "mooncake-toolagent", "--mirror", mirror]) == 0
    first = (cache / "mooncake-toolagent" / "toolagent_trace.jsonl").read_bytes()
    capsys.readouterr()
    mirror = _mirror(tmp_path, TOOLAGENT, {"toolagent_trace.jsonl": _lines(6)})  # upstream changed
    assert cli.main(["traces", "fetch", "mooncake-toolagent", "--mirror", mirror]) == 2
    assert "checksum mismatch" in _one_line_error(capsys)
    assert (cache / "mooncake-toolagent" / "toolagent_trace.jsonl").read_bytes() == first
    assert not [p for p in (cache / "mooncake-toolagent").iterdir() if p.name.endswith(".tmp")]


def test_a_multi_file_trace_is_fetched_into_one_folder(tmp_path, cache, capsys):
    more = catalog.get("claude-code-more")
    files = {f.name: f"{{\"n\": {i}}}\n".encode() for i, f in enumerate(more.files)}
    mirror = _mirror(tmp_path, more, files)
    assert cli.main(["traces", "fetch", "claude-code-more", "--mirror", mirror]) == 0
    folder = cache / "claude-code-more"
    assert {p.name for p in folder.iterdir()} == set(files) | {MANIFEST}
    assert cli.main(["traces", "fetch", "claude-code-more", "--mirror", mirror,
                     "--sha256", "a" * 64]) == 2
    assert "single-file trace" in _one_line_error(capsys)


@pytest.mark.parametrize("argv, message", [
    (["traces", "fetch", "no-such-trace"], "unknown trace 'no-such-trace'"),
    (["traces", "verify", "no-such-trace"], "unknown trace 'no-such-trace'"),
    (["traces", "fetch", "mooncake-toolagent", "--mirror", "ftp://example.org/x"], "--mirror"),
    (["traces", "fetch", "mooncake-toolagent", "--mirror", "https://"], "no host"),
    (["traces", "fetch", "mooncake-toolagent", "--sha256", "xyz"], "64 hex digits"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, cache, capsys):
    assert cli.main(argv) == 2
    assert message in _one_line_error(capsys)
    assert not cache.exists()


def test_a_mirror_without_the_file_or_folder_is_one_line(tmp_path, cache, capsys):
    assert cli.main(["traces", "fetch", "mooncake-toolagent", "--mirror",
                     (tmp_path / "nowhere").as_uri()]) == 2
    assert "no such folder" in _one_line_error(capsys)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["traces", "fetch", "mooncake-toolagent", "--mirror", empty.as_uri()]) == 2
    assert "cannot download" in _one_line_error(capsys)
    assert not list((cache / "mooncake-toolagent").iterdir())


def test_a_shipped_trace_needs_no_fetch(cache, capsys):
    assert cli.main(["traces", "fetch", "mooncake-conversation"]) == 0
    assert "ships with the repository" in capsys.readouterr().out
    assert not cache.exists()
