"""The README's runnable examples run as written (a README a user copies from must not rot)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def python_block_under(heading: str) -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"no python example under '## {heading}'"
    return match.group(1)


def test_the_lora_with_full_rank_parts_example_runs_and_trains_what_it_says(cpu_bridge, capsys):
    namespace: dict = {}
    exec(compile(python_block_under("LoRA with full-rank parts"), "README.md", "exec"), namespace)
    chunks, state = namespace["chunks"], namespace["state"]
    trained = {n for n, p in chunks[0].named_parameters() if p.requires_grad}
    projection = re.compile(r"^vision_model\.(merger|decoder\.deepstack_merger_list)\.")
    adapters = {n for n in trained if ".adapter." in n}
    assert adapters and trained == adapters | {n for n, _ in chunks[0].named_parameters() if projection.match(n)}
    assert set(state) == {n.replace(".to_wrap.", ".") for n in trained}
    assert "adapters" in capsys.readouterr().out
