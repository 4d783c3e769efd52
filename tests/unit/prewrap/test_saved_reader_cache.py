"""Bridge's cached ``read_run_config``, wrapped for flag provenance, still records a read that its cache answers
(issue 46 item 0: the wrapper keeps the cache; tests/unit/activation/test_wrappers_keep_all.py has the rest)."""

from __future__ import annotations

from pathlib import Path


def _run_config(tmp_path: Path) -> Path:
    path = tmp_path / "run_config.yaml"
    path.write_text("model:\n  _target_: megatron.bridge.models.gpt_provider.GPTModelProvider\n  num_layers: 2\n")
    return path


def _bridge_conftest_calls() -> None:
    from megatron.bridge.training.utils.checkpoint_utils import read_run_config, read_train_state

    read_run_config.cache_clear()
    read_train_state.cache_clear()


def test_the_reader_reached_by_name_still_records_what_it_read(cpu_bridge, tmp_path):
    """The flag-provenance record still happens on a cached second read (the wrapper records each call)."""
    from megatron.bridge.training.utils.checkpoint_utils import read_run_config

    from bridge_freeze_plugin.prewrap import _saved

    _bridge_conftest_calls()
    path = str(_run_config(tmp_path))
    read_run_config(path)
    _saved.forget_saved()
    read_run_config(path)  # a cache hit
    assert [s.path for s in _saved._SAVED] == [path]
