"""Host pool sizes of an MLA model, with and without host dedup, by SGLang 0.5.23's code.

Run in the server oracle venv (its CPU shims let SGLang's pools import):

    /tmp/sglang-server-venv/bin/python tools/sglang_sizing/mla_dedup_sizing.py data/sizing/mla_dedup.json

Each case builds SGLang's own ``MLATokenToKVPoolHost`` (mem_cache/pool_host/mla.py)
from an allocator-only ``MLAHostAllocation``, which is what a dedup peer rank holds:
the base ``HostKVCache.__init__`` sizes it (``size``, ``page_num``: the same code sizes
the owner's pool) and, being a dummy, allocates no buffer (``kv_buffer`` None). The
owner's pool would allocate ``size * size_per_token`` bytes
(``_allocate_host_buffer``'s ``requested_bytes``). Per node of ``tp`` ranks (one TP
group): without dedup every rank allocates that; with dedup only the owner does.
"""
import json
import sys

sys.path.insert(0, "/work/shared/oracle/server")
import cpu_shims  # noqa: E402,F401

import torch  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLAHostAllocation, MLATokenToKVPoolHost  # noqa: E402

# DeepSeek-V3: 61 layers, kv_lora_rank 512 + qk_rope_head_dim 64, bf16.
LAYERS, LORA, ROPE = 61, 512, 64


def case(tp, page, device_tokens, ratio, size_gb):
    dim = LORA + ROPE
    alloc = MLAHostAllocation(dtype=torch.bfloat16, kv_lora_rank=LORA, qk_rope_head_dim=ROPE,
                              kv_cache_dim=dim, size_per_token=dim * 2 * LAYERS)
    p = MLATokenToKVPoolHost(alloc, host_to_device_ratio=ratio, host_size=size_gb,
                             page_size=page, layout="layer_first", pin_memory=False,
                             device_capacity_tokens=device_tokens, start_layer=0,
                             end_layer=LAYERS, target_layer_num=LAYERS)
    owner = p.size * p.size_per_token
    peer = 0 if p.kv_buffer is None else owner
    return {"tp": tp, "page_size": page, "device_tokens": device_tokens, "hicache_ratio": ratio,
            "hicache_size": size_gb, "host_tokens": p.size, "size_per_token": p.size_per_token,
            "owner_bytes": owner, "peer_bytes_dedup": peer,
            "node_bytes_dedup_off": tp * owner, "node_bytes_dedup_on": owner + (tp - 1) * peer}


# The last case is scenarios/deepseek_mla_dedup.yaml's pool (tests/test_mla_dedup.py plans it).
cases = [case(8, 64, 65536, 2.0, 0), case(8, 64, 65536, 0, 40), case(4, 1, 100000, 3.0, 0),
         case(8, 64, 8192, 0, 4)]
json.dump(cases, open(sys.argv[1], "w"), indent=1)
print(json.dumps(cases, indent=1))
