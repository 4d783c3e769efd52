"""The docs' runnable examples run as written (a page a user copies from must not rot)."""

from __future__ import annotations

import re
from pathlib import Path

from _shared import QWEN3_PROJECTION

DOCS = Path(__file__).resolve().parents[3] / "docs"


def first_python_block(page: str) -> str:
    text = (DOCS / page).read_text(encoding="utf-8")
    match = re.search(r"```python\n(.*?)```", text, re.S)
    assert match, f"no python example in docs/{page}"
    return match.group(1)


def test_the_lora_with_full_rank_parts_example_runs_and_trains_what_it_says(cpu_bridge, capsys):
    namespace: dict = {}
    exec(compile(first_python_block("lora.md"), "docs/lora.md", "exec"), namespace)
    chunks, state = namespace["chunks"], namespace["state"]
    trained = {n for n, p in chunks[0].named_parameters() if p.requires_grad}
    adapters = {n for n in trained if ".adapter." in n}
    assert adapters and trained == adapters | {n for n, _ in chunks[0].named_parameters() if QWEN3_PROJECTION.match(n)}
    assert set(state) == {n.replace(".to_wrap.", ".") for n in trained}
    assert "adapters" in capsys.readouterr().out
