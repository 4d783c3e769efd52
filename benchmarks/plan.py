"""Figure 5: ``bridge-freeze plan`` time and peak memory on a full-size configuration.

``plan`` works from a Hugging Face ``config.json`` alone (no weights). We write a Qwen3-VL-30B-A3B-like
configuration (48 layers, 128 experts, a 27-layer vision encoder) and run ``bridge-freeze plan
--hf-config`` in a subprocess; its wall time and peak RSS (``wait4``) are reported against the same CLI's
cheapest sub-command, ``bridge-freeze families``, in the same run, and against ``plan`` on a tiny
configuration of the same layout (scaling). Each arm repeated; medians.

If the installed CLI has no ``plan`` sub-command, the figure says so and is skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._timing import median

PLAN_ARGS = ("--freeze-vision-model",)


def qwen3_vl_moe_config(full: bool = True) -> dict[str, Any]:
    """A ``config.json`` with Qwen3-VL-30B-A3B's published sizes (``full``) or a tiny one of the same layout."""
    text = {
        "model_type": "qwen3_vl_moe_text",
        "hidden_size": 2048 if full else 64,
        "intermediate_size": 6144 if full else 128,
        "moe_intermediate_size": 768 if full else 32,
        "num_hidden_layers": 48 if full else 2,
        "num_attention_heads": 32 if full else 4,
        "num_key_value_heads": 4 if full else 2,
        "head_dim": 128 if full else 16,
        "num_experts": 128 if full else 4,
        "num_experts_per_tok": 8 if full else 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "vocab_size": 151936 if full else 128,
        "max_position_embeddings": 262144 if full else 64,
        "rms_norm_eps": 1e-6,
        "rope_theta": 5000000,
        "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20] if full else [2, 3, 3],
                         "mrope_interleaved": True},
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }
    vision = {
        "model_type": "qwen3_vl_moe",
        "depth": 27 if full else 2,
        "hidden_size": 1152 if full else 64,
        "intermediate_size": 4304 if full else 128,
        "num_heads": 16 if full else 4,
        "out_hidden_size": text["hidden_size"],
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 2304 if full else 64,
        "deepstack_visual_indexes": [8, 16, 24] if full else [0, 1],
        "in_channels": 3,
        "hidden_act": "gelu_pytorch_tanh",
    }
    return {
        "architectures": ["Qwen3VLMoeForConditionalGeneration"],
        "model_type": "qwen3_vl_moe",
        "text_config": text,
        "vision_config": vision,
        "image_token_id": 151655,
        "video_token_id": 151656,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "tie_word_embeddings": False,
    }


def _cli() -> list[str]:
    script = Path(sys.executable).with_name("bridge-freeze")
    return [str(script)] if script.exists() else [sys.executable, "-m", "bridge_freeze_plugin.cli"]


def _measure(args: list[str]) -> tuple[float, int, int, str]:
    """(wall seconds, peak RSS bytes, return code, output tail) of one subprocess."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        tail = out.read().decode(errors="replace")[-2000:]
    return wall, usage.ru_maxrss * 1024, proc.returncode, tail  # ru_maxrss: KiB on Linux


def available() -> tuple[bool, str]:
    _, _, code, tail = _measure([*_cli(), "plan", "--help"])
    if code != 0:
        return False, f"no `plan` sub-command in this bridge-freeze CLI (exit {code}: {tail.strip()[-160:]})"
    if "--hf-config" not in tail:
        return False, "`bridge-freeze plan` has no --hf-config option"
    return True, ""


def run(quick: bool = False) -> dict[str, Any]:
    ok, why = available()
    if not ok:
        return {"available": False, "reason": why, "time_ratio": None, "peak_rss_ratio": None}
    repeat = 1 if quick else 5
    with tempfile.TemporaryDirectory() as tmp:
        configs = {}
        for name, full in (("tiny", False), ("full", True)):
            path = Path(tmp) / f"{name}.json"
            path.write_text(json.dumps(qwen3_vl_moe_config(full)))
            configs[name] = path
        arms = {
            "families": [*_cli(), "families"],
            "plan_tiny": [*_cli(), "plan", "--hf-config", str(configs["tiny"]), *PLAN_ARGS],
            "plan_full": [*_cli(), "plan", "--hf-config", str(configs["full"]), *PLAN_ARGS],
        }
        if quick:
            del arms["plan_tiny"]
        samples: dict[str, list[tuple[float, int]]] = {name: [] for name in arms}
        failures: dict[str, str] = {}
        for r in range(repeat):
            for name in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
                wall, rss, code, tail = _measure(arms[name])
                if code != 0:
                    failures[name] = f"exit {code}: {tail.strip()[-500:]}"
                samples[name].append((wall, rss))
    if failures:
        return {"available": False, "reason": f"plan failed: {failures}", "time_ratio": None, "peak_rss_ratio": None}
    result: dict[str, Any] = {"available": True, "repeat": repeat, "plan_args": list(PLAN_ARGS)}
    for name, values in samples.items():
        result[name] = {
            "seconds": median([w for w, _ in values]),
            "peak_rss_mib": median([m for _, m in values]) / 2**20,
        }
    base = samples["families"]
    full = samples["plan_full"]
    result["time_ratio"] = median([f[0] / b[0] for f, b in zip(full, base, strict=True)])
    result["peak_rss_ratio"] = median([f[1] / b[1] for f, b in zip(full, base, strict=True)])
    if "plan_tiny" in samples:
        tiny = samples["plan_tiny"]
        result["full_over_tiny_time"] = median([f[0] / t[0] for f, t in zip(full, tiny, strict=True)])
        result["full_over_tiny_rss"] = median([f[1] / t[1] for f, t in zip(full, tiny, strict=True)])
    return result


def table(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    if not result["available"]:
        return [("plan (full-size Qwen3-VL-MoE)", "not available: " + result["reason"][:70], "")]
    full = result["plan_full"]
    rows = [(
        "plan (full-size Qwen3-VL-MoE)",
        f"{result['time_ratio']:.2f}x time, {result['peak_rss_ratio']:.2f}x peak RSS of `families` "
        f"({full['seconds']:.1f} s, {full['peak_rss_mib']:.0f} MiB)",
        "",
    )]
    if "full_over_tiny_time" in result:
        rows.append(("plan full-size / tiny config", f"{result['full_over_tiny_time']:.2f}x time, "
                     f"{result['full_over_tiny_rss']:.2f}x peak RSS", ""))
    return rows
