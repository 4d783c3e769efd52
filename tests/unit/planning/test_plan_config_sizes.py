"""``plan --hf-config`` refuses, fast and before any build, a published config with one size inflated (issue 37
item 6: a Qwen2-Audio config with ``audio_config.encoder_layers: 100000`` was still building after 3 minutes;
Whisper-style keys were not counted).

Every published fixture (tests/fixtures/hf_configs), every sub-config of it (the top, and each object with a
``model_type`` or a ``*_config`` key, at any depth), every integer in it that is not a token id: set to 10**9, the
check refuses it naming the key and the value. Every layer stack of every fixture (listed by hand from the
published configs below, not from the code): set to 100,000 layers, the build-size check refuses it naming the
key and the value. Each check runs under a timeout guard: a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from pathlib import Path

import pytest

from bridge_freeze_plugin.cli import main
from bridge_freeze_plugin.errors import PlanError
from bridge_freeze_plugin.planning._config_checks import check_hf_config

#: The checks of the ERNIE-4.5-VL and Qwen3-ASR configs import Bridge (it registers their config classes with
#: transformers): about 20 s, so not in ``make test-fast``.
pytestmark = pytest.mark.bridge

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hf_configs"
PUBLISHED = sorted(p.name for p in FIXTURES.iterdir() if (p / "config.json").is_file())
#: The first check of a type transformers does not know imports Bridge (its vendored configs): about 20 s here.
GUARD_S = 90
HUGE = 10**9

#: Each published config's layer stacks: (sub-config path, the key its class keeps the layer count in).
STACKS = {
    "ernie45_vl": ["text_config.num_hidden_layers", "vision_config.depth"],
    "exaone45_vl": ["text_config.num_hidden_layers", "vision_config.depth"],
    "gemma3_vl": ["text_config.num_hidden_layers", "vision_config.num_hidden_layers"],
    "gemma4_vl": ["text_config.num_hidden_layers", "vision_config.num_hidden_layers"],
    "glm45v": ["text_config.num_hidden_layers", "vision_config.depth"],
    "kimi_k25_vl": ["text_config.num_hidden_layers", "vision_config.vt_num_hidden_layers"],
    "minimax_m3_vl": ["text_config.num_hidden_layers", "vision_config.num_hidden_layers"],
    "ministral3": ["text_config.num_hidden_layers", "vision_config.num_hidden_layers"],
    "nemotron_omni": ["llm_config.num_hidden_layers", "sound_config.num_hidden_layers"],
    "nemotron_vl": ["llm_config.num_hidden_layers"],
    "qwen25_omni": ["thinker_config.audio_config.encoder_layers", "thinker_config.vision_config.depth",
                    "thinker_config.text_config.num_hidden_layers"],
    "qwen25_vl": ["num_hidden_layers", "vision_config.depth"],
    "qwen2_audio": ["audio_config.encoder_layers"],  # Whisper-style: the class maps num_hidden_layers to it
    "qwen35_vl": ["text_config.num_hidden_layers", "vision_config.depth"],
    "qwen35_vl_moe": ["text_config.num_hidden_layers", "vision_config.depth"],
    "qwen3_asr": ["thinker_config.text_config.num_hidden_layers", "thinker_config.audio_config.num_hidden_layers"],
    "qwen3_omni": ["thinker_config.text_config.num_hidden_layers", "talker_config.text_config.num_hidden_layers",
                   "thinker_config.audio_config.encoder_layers", "thinker_config.vision_config.depth",
                   "code2wav_config.num_hidden_layers", "talker_config.code_predictor_config.num_hidden_layers"],
    "qwen3_vl": ["text_config.num_hidden_layers", "vision_config.depth"],
    "qwen3_vl_moe": ["text_config.num_hidden_layers", "vision_config.depth"],
    "qwen3_vl_moe_235b": ["text_config.num_hidden_layers", "vision_config.depth"],
}


@contextlib.contextmanager
def guard(seconds: int = GUARD_S):
    """Fail instead of hanging (SIGALRM: the test runs in the main thread)."""

    def expired(*_):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _sub_configs(node: dict, path: str = ""):
    """The top and every object with a model_type or under a ``*_config`` key, with its dotted path."""
    yield path, node
    for key, value in node.items():
        if isinstance(value, dict) and ("model_type" in value or key.endswith("_config")):
            yield from _sub_configs(value, f"{path}{key}.")


def _integer_sizes(doc: dict):
    for path, node in _sub_configs(doc):
        for key, value in node.items():
            if type(value) is int and value >= 1 and not key.endswith(("_id", "_ids", "_index")):
                yield f"{path}{key}"


def _set(doc: dict, dotted: str, value) -> dict:
    doc = json.loads(json.dumps(doc))
    node = doc
    *parents, last = dotted.split(".")
    for key in parents:
        node = node[key]
    node[last] = value
    return doc


def _refusal(tmp_path: Path, doc: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    started = time.perf_counter()
    with guard(), pytest.raises(PlanError) as refused:
        check_hf_config(path)
    return f"{refused.value} ({time.perf_counter() - started:.1f} s)"


def test_every_fixture_is_listed_and_accepted(tmp_path):
    assert sorted(STACKS) == PUBLISHED
    for name in PUBLISHED:
        with guard():
            check_hf_config(FIXTURES / name / "config.json")  # no published config is refused


@pytest.mark.parametrize("name", PUBLISHED)
def test_every_integer_size_of_every_sub_config_inflated_is_refused_fast(tmp_path, name):
    doc = json.loads((FIXTURES / name / "config.json").read_text())
    keys = list(_integer_sizes(doc))
    assert keys, name
    for key in keys:
        message = _refusal(tmp_path, _set(doc, key, HUGE))
        assert f"`{key}` is 1,000,000,000, more than 16,777,216" in message, (key, message)


@pytest.mark.parametrize(("name", "key"), [(name, key) for name, keys in STACKS.items() for key in keys])
def test_every_layer_stack_of_every_sub_config_deepened_is_refused_fast(tmp_path, name, key):
    doc = json.loads((FIXTURES / name / "config.json").read_text())
    message = _refusal(tmp_path, _set(doc, key, 100_000))
    assert f"`{key}` = 100,000" in message and "more than the limit of 50,000" in message, message


def test_the_qwen2_audio_hang_is_refused_by_plan_fast_naming_the_key_and_its_value(tmp_path, capsys):
    doc = _set(json.loads((FIXTURES / "qwen2_audio" / "config.json").read_text()), "audio_config.encoder_layers",
               100_000)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    with guard():
        assert main(["plan", "--hf-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "would build 100,000 layer blocks" in err and "`audio_config.encoder_layers` = 100,000: 100,000" in err, err
    assert len(err.strip().splitlines()) == 1


def test_a_whisper_style_width_must_be_positive(tmp_path):
    doc = _set(json.loads((FIXTURES / "qwen2_audio" / "config.json").read_text()), "audio_config.d_model", 0)
    assert "`audio_config.d_model` is 0, but a size must be a positive integer" in _refusal(tmp_path, doc)
