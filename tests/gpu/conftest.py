"""GPU tests: collected everywhere, skipped cleanly where CUDA is absent (CI, developer laptops).

They build through the harness's CUDA mode (``device="cuda"``: Bridge's own specs where TransformerEngine imports,
megatron-core's local ones where it does not; never the CPU device patch) on NCCL, world 1 (one process, device 0).
Run them on a lent machine with ``bash scripts/gpu_check.sh`` (docs/development.md, "The GPU check").
"""

from __future__ import annotations

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (a GPU machine); this machine has none")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cuda_world():
    """Bridge imported, NCCL world 1 on device 0, model-parallel state; which specs builds use (printed)."""
    from bridge_freeze_harness.cpu_runtime import import_bridge
    from bridge_freeze_harness.gpu_runtime import init_gpu_distributed, spec_choice

    import_bridge()
    import bridge_freeze_plugin  # noqa: F401  (activation: no .pth autoload where the project travels as source)

    init_gpu_distributed()
    choice = spec_choice()
    print(f"\n[tests/gpu] layer specs: {choice}"  # the output says which (pytest -rA / -s shows it)
          + (" (TransformerEngine does not import: megatron-core's local specs)" if choice == "local" else ""))
    return choice
