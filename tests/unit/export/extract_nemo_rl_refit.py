"""NeMo-RL's own refit code, read out of a NeMo-RL source at test time for test_nemo_rl_refit.py.

NeMo-RL cannot be imported here (its modules import Ray, vLLM, ZMQ and its whole training stack at the top), and
it is not installable from PyPI (``nemo-rl`` there is a 0.0.0 placeholder). So the functions and methods its refit
runs through are read, each unchanged (its decorators, its body), from a NeMo-RL source the user names, and
``_nemo_rl_refit.py`` runs them on the CPU. Nothing of NeMo-RL is kept in this repository: the source is
``$BRIDGE_FREEZE_NEMO_RL``, a checkout of the commit below, or ``GITDIR@COMMIT`` (a clone or bare mirror, read
with ``git archive``). To see what the test runs:

    python tests/unit/export/extract_nemo_rl_refit.py /path/to/NVIDIA-NeMo/RL        # or GITDIR@7ea279ab
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"
DATE = "2026-08-22"
#: Where the test finds NeMo-RL's source: a checkout of COMMIT, or GITDIR@COMMIT.
ENV = "BRIDGE_FREEZE_NEMO_RL"
#: (path in NeMo-RL, qualified names copied from it)
PIECES: list[tuple[str, list[str]]] = [
    ("nemo_rl/utils/nsys.py", ["wrap_with_nvtx_name"]),
    ("nemo_rl/models/megatron/pipeline_parallel.py", ["broadcast_obj_from_pp_rank"]),
    ("nemo_rl/models/generation/vllm/quantization/fp8_train_utils.py", ["get_vllm_qkv_scale_names"]),
    ("nemo_rl/models/policy/utils.py", ["IPCProtocol", "calculate_aligned_size", "stream_weights_via_ipc_zmq_impl"]),
    ("nemo_rl/models/policy/workers/megatron_policy_worker.py", [
        "_estimate_refit_tensor_size_in_bytes",
        "MegatronPolicyWorkerImpl.prepare_refit_info",
        "MegatronPolicyWorkerImpl._is_fp8_export",
        "MegatronPolicyWorkerImpl._build_refit_conversion_tasks",
        "MegatronPolicyWorkerImpl._calculate_refit_param_info",
        "MegatronPolicyWorkerImpl._iter_params_with_optional_kv_scales",
        "MegatronPolicyWorkerImpl.stream_weights_via_ipc_zmq",
    ]),
    ("nemo_rl/distributed/worker_groups.py", ["RayWorkerGroup.run_all_workers_single_data"]),
    ("nemo_rl/models/policy/lm_policy.py", ["Policy.run_all_workers_single_data", "Policy.prepare_refit_info"]),
    ("nemo_rl/models/generation/vllm/vllm_generation.py", ["VllmGeneration.prepare_refit_info"]),
    ("nemo_rl/models/generation/vllm/vllm_worker.py", [
        "VllmGenerationWorkerImpl.prepare_refit_info",
        "VllmGenerationWorkerImpl.update_weights_via_ipc_zmq",
    ]),
    ("nemo_rl/models/generation/vllm/vllm_backend.py", [
        "_format_refit_key_error",
        "IPCWeightManifestError",
        "_IPCWeightManifest",
        "VllmInternalWorkerExtension.prepare_refit_info",
        "VllmInternalWorkerExtension._weight_update_errors_are_fatal",
        "VllmInternalWorkerExtension.update_weights_via_ipc_zmq",
    ]),
]
HEADER = f"""\
# NeMo-RL's refit code as read from https://github.com/NVIDIA-NeMo/RL at {COMMIT} ({DATE}), by
# extract_nemo_rl_refit.py. Each piece: "#### <path> <qualified name> <first line>-<last line>", then its source.
"""


def piece(tree: ast.Module, lines: list[str], qualname: str) -> tuple[int, int, str]:
    """(first line, last line, dedented source) of ``qualname`` (``name`` or ``Class.method``), decorators included."""
    body: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    for part in qualname.split("."):
        found = [n for n in body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == part]
        if len(found) != 1:
            raise SystemExit(f"{qualname}: {len(found)} definitions of {part!r} where one was expected")
        node = found[0]
        body = node.body
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return first, node.end_lineno, textwrap.dedent("".join(lines[first - 1:node.end_lineno]))


def extract(checkout: Path) -> str:
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0 and head.stdout.strip() != COMMIT:
        raise SystemExit(f"{checkout} is at {head.stdout.strip()}, not {COMMIT}")
    out = [HEADER]
    for path, names in PIECES:
        source = (checkout / path).read_text()
        tree, lines = ast.parse(source), source.splitlines(keepends=True)
        for name in names:
            first, last, text = piece(tree, lines, name)
            out.append(f"#### {path} {name} {first}-{last}\n{text}")
    return "".join(out)


def extract_from(spec: str) -> str:
    """:func:`extract` of a checkout directory, or of ``GITDIR@COMMIT`` (the pieces' files taken with ``git
    archive``; the commit must be :data:`COMMIT`)."""
    import io
    import tarfile
    import tempfile

    gitdir, at, commit = spec.rpartition("@")
    if not at or Path(spec).is_dir():
        return extract(Path(spec))
    full = subprocess.run(["git", "--git-dir", gitdir, "rev-parse", f"{commit}^{{commit}}"], capture_output=True,
                          text=True)
    if full.returncode != 0 or full.stdout.strip() != COMMIT:
        raise SystemExit(f"{spec}: not commit {COMMIT} ({(full.stdout or full.stderr).strip()})")
    paths = [path for path, _ in PIECES]
    archive = subprocess.run(["git", "--git-dir", gitdir, "archive", "--format=tar", COMMIT, *paths],
                             capture_output=True, check=True)
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(tmp, filter="data")
        return extract(Path(tmp))


if __name__ == "__main__":
    sys.stdout.write(extract_from(sys.argv[1]))
