#!/usr/bin/env python3
"""Which statements of SGLang's component and core functions that sim/hybrid follows
the vendored hybrid cases execute (line tracing with sys.settrace, stdlib only).

Usage (in the oracle venv, about 20 s):

    $SGLANG_ORACLE_VENV/bin/python tools/sglang_oracle/coverage_hybrid.py

Prints, per function, the statements run and the ones never run (docs/HYBRID.md §7
says why the remaining ones are outside the model: host tier, sessions, T-LRU,
write-through acks, the SWA host tier, or unreachable in the modelled configurations).
"""

import ast
import gzip
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import oracle_hybrid as oh  # noqa: E402
import sglang.srt.mem_cache.unified_cache.components.full as full_mod  # noqa: E402
import sglang.srt.mem_cache.unified_cache.components.mamba as mamba_mod  # noqa: E402
import sglang.srt.mem_cache.unified_cache.components.swa as swa_mod  # noqa: E402
import sglang.srt.mem_cache.unified_cache.unified_tree_core as core_mod  # noqa: E402

FILES = {swa_mod.__file__: "swa", mamba_mod.__file__: "mamba", core_mod.__file__: "core",
         full_mod.__file__: "full"}
FUNCS = {
    "swa": ["create_match_validator", "finalize_match_result_in_tree_core", "_clip_to_window",
            "_recover_from_incoming", "update_component_on_insert_overlap", "_populate_range",
            "commit_insert_component_data", "_maybe_split_leaf_for_swa_lock",
            "redistribute_on_node_split", "evict_component", "_evict_device_next_node",
            "acquire_component_lock", "release_component_lock", "release_window_lock",
            "refresh_lru",
            # the host tier (docs/HYBRID.md §5.8)
            "_collect_unbacked_swa_nodes", "_collect_unbacked_swa_nodes_in_window",
            "needs_incremental_backup", "recover_after_unevict", "build_hicache_transfers",
            "commit_hicache_transfer", "drive_host_eviction"],
    "mamba": ["create_match_validator", "finalize_match_result_in_tree_core",
              "finalize_match_result_in_cache",
              "commit_insert_component_data", "_evict_excess_path_states",
              "redistribute_on_node_split", "evict_component", "_evict_device_next_node",
              "acquire_component_lock", "release_component_lock", "refresh_lru",
              # the host tier
              "needs_incremental_backup", "build_hicache_transfers", "commit_hicache_transfer",
              "drive_host_eviction", "prepare_load_back", "_alloc_request_state_slot",
              "finalize_load_back"],
    "core": ["_match_prefix_helper", "_match_post_processor", "_insert_walk_step",
             "_insert_overlap_step", "_insert_commit_step", "_insert_tail_step", "_split_node",
             "_add_new_node", "_cascade_evict", "_should_cascade_evict_component",
             "_delete_unbacked_device_leaf", "_iteratively_delete_tombstone_ancestors",
             "evict_device_next_node", "evict_device_leaf", "inc_lock_ref", "dec_lock_ref",
             "_release_components", "dec_swa_lock_only", "set_component_device_value",
             # the host tier
             "_finish_internal_component_eviction", "_demote", "_evict_host_leaf",
             "drive_host_eviction", "_reclaim_full_host_duplicates",
             "_release_full_host_duplicate", "_can_reclaim_full_host_duplicate",
             "drop_subtree_no_host", "_unevict_node_on_insert", "_build_backup_spec",
             "build_load_back_spec", "commit_backup", "commit_load_back", "finish_load_back",
             "inc_host_lock_ref", "dec_host_lock_ref", "_is_device_leaf", "_is_host_leaf",
             "_evict_component_and_detach_lru", "_release_all_component_layers",
             "_update_duplicate_tracking", "finish_write_through",
             # write_through
             "_inc_hit_count_and_check", "_finish_insert_walk_node",
             "_should_backup_after_insert", "_needs_incremental_component_backup",
             "_build_backup_kv_action", "mark_write_through_pending",
             "_is_settled_full_host_duplicate"],
    "full": ["create_match_validator", "finalize_match_result_in_tree_core",
             "redistribute_on_node_split", "evict_component", "drive_host_eviction",
             "acquire_component_lock", "release_component_lock", "build_hicache_transfers",
             "commit_hicache_transfer"],
}
CASES = pathlib.Path(__file__).resolve().parents[2] / "data" / "conformance" / "hybrid"


def run_cases() -> dict:
    hit = {f: set() for f in FILES}

    def tracer(frame, event, arg):
        lines = hit.get(frame.f_code.co_filename)
        if lines is None:
            return None

        def local(frame, event, arg):
            if event == "line":
                lines.add(frame.f_lineno)
            return local

        return local

    sys.settrace(tracer)
    try:
        for case in sorted(CASES.glob("*.jsonl.gz")):
            if case.name.endswith(".out.jsonl.gz"):
                continue
            ops = [json.loads(line) for line in gzip.open(case, "rt")]
            oracle = (oh.HostHybridOracle if ops[0].get("hicache") else oh.HybridOracle)(ops[0])
            for op in ops[1:]:
                oracle.apply(op)
    finally:
        sys.settrace(None)
    return hit


def main():
    hit = run_cases()
    for path, name in FILES.items():
        src = open(path).read()
        text = src.splitlines()
        for node in ast.walk(ast.parse(src)):
            if not (isinstance(node, ast.FunctionDef) and node.name in FUNCS[name]):
                continue
            stmts = {n.lineno for n in ast.walk(node) if isinstance(n, ast.stmt) and n is not node}
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                stmts.discard(first.lineno)  # the docstring
            missed = sorted(stmts - hit[path])
            print(f"{name}.{node.name}: {len(stmts) - len(missed)}/{len(stmts)} statements run")
            for line in missed:
                print(f"    never run {line}: {text[line - 1].strip()[:90]}")


if __name__ == "__main__":
    main()
