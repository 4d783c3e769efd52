"""``plan --hf-config`` refuses a config.json it cannot build as one config error (exit 2, one line naming the
file, the key and the fix), before anything is built: never exit 1 "unexpected error", never a build that runs
for minutes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from bridge_freeze_plugin.cli import main

#: A tiny Qwen3-VL-MoE config.json: text 2 layers x 4 experts, vision depth 2.
TINY_CONFIG = Path(__file__).resolve().parents[2] / "fixtures" / "tiny_hf_configs" / "qwen3_vl_moe.json"
BASE = json.loads(TINY_CONFIG.read_text())


def _changed(path: str, value: object) -> dict:
    """BASE with ``path`` (dotted) set to ``value``; ``value`` DELETE removes the key."""
    doc = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node[key]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return doc


DELETE = object()

#: name -> (file content, what the one-line error must say besides the file name)
CASES: dict[str, tuple[bytes, tuple[str, ...]]] = {
    "top-level list": (b"[1, 2]", ("holds a JSON list at the top level", "one JSON object")),
    "top-level string": (b'"qwen3_vl_moe"', ("holds a JSON string at the top level",)),
    "empty": (b"", ("is empty",)),
    "blank": (b"  \n", ("is empty",)),
    "not UTF-8": (b'{"model_type": "qwen3_vl_moe", "x": "\xff"}', ("is not UTF-8 text (byte 0xff at offset 37)",
                                                                    "save config.json as UTF-8")),
    "invalid JSON": (b'{"model_type": ', ("is not valid JSON", "line 1 column 16")),
    # issue 46 item 8: nested past the parser's stack (was RecursionError, exit 1), and just past the bound
    "nested 100,000 deep": (b'{"model_type": "qwen3_vl_moe", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                            ("nests objects and arrays more than 64 levels deep",)),
    "nested 65 deep": (b'{"model_type": "qwen3_vl_moe", "x": ' + b'{"a": ' * 64 + b"1" + b"}" * 64 + b"}",
                       ("nests objects and arrays more than 64 levels deep",)),
    "9 MiB": (b'{"model_type": "qwen3_vl_moe", "x": "' + b"a" * (9 * 2**20) + b'"}',
              ("is 9.0 MiB: a config.json is a few KB (at most 8 MiB are read)",)),
    "missing model_type": (_changed("model_type", DELETE), ("has no `model_type` key", "add the model's")),
    "numeric model_type": (_changed("model_type", 5), ("`model_type` is 5, not a string",)),
    # The real options, never "change model_type" (wrong advice for a maker's genuine config).
    "unknown model_type": (_changed("model_type", "no_such_vlm"),
                           ("`model_type` 'no_such_vlm' is a model type that neither transformers",
                            "plan reads configs of these types: ", "qwen3_vl_moe (qwen3_vl_moe)",
                            "kimi_k25 (kimi_k25_vl)", "install a transformers that has 'no_such_vlm'")),
    "unknown remote-code model_type": ({**_changed("model_type", "no_such_vlm"), "auto_map": {"AutoConfig": "x.Y"}},
                                       ("'no_such_vlm' is remote code (its auto_map names files on the hub",)),
    # Nemotron Omni's published type is read offline too (it was the example of a registered family's remote type
    # plan cannot read): its language model's config must be there, and its sound / vision configs are objects.
    "Nemotron Omni without its language model config": (
        {"model_type": "NemotronH_Nano_Omni_Reasoning_V3", "architectures": ["NemotronH_Nano_Omni_Reasoning_V3"],
         "auto_map": {"AutoConfig": "configuration.Config"}},
        ("a NemotronH_Nano_Omni_Reasoning_V3 config needs a `llm_config` object",)),
    "Nemotron Omni with a sound_config that is not an object": (
        {"model_type": "NemotronH_Nano_Omni_Reasoning_V3", "architectures": ["NemotronH_Nano_Omni_Reasoning_V3"],
         "llm_config": {"model_type": "nemotron_h", "hidden_size": 64}, "sound_config": [1024]},
        ("`sound_config` is [1024], not a JSON object",)),
    "a family's remote type with a readable sibling": (
        {"model_type": "ernie4_5_moe_vl", "auto_map": {"AutoConfig": "configuration.Config"}},
        ("'ernie4_5_moe_vl' is the ernie45_vl family's",
         "plan a config of the family's type that plan reads (ernie4_5_vl_moe: transformers' own format",
         "bridge-freeze plan ernie45_vl --tiny")),
    # Bridge's generated-config type of Nemotron Nano V2 VL: the published type is read offline
    "a family's type with a sibling read offline": (
        {"model_type": "nemotron_vl", "auto_map": {"AutoConfig": "configuration.Config"}},
        ("'nemotron_vl' is the nemotron_vl family's",
         "(NemotronH_Nano_VL_V2: the maker's remote-code format of the same model, read offline)")),
    # The published Nemotron Nano V2 VL type is read offline: its language model's config must be there
    "a wrapper read offline without its sub-config": (
        {"model_type": "NemotronH_Nano_VL_V2", "architectures": ["NemotronH_Nano_VL_V2"],
         "auto_map": {"AutoConfig": "configuration.Config"}},
        ("a NemotronH_Nano_VL_V2 config needs a `llm_config` object",)),
    "a wrapper read offline with an unknown sub-config type": (
        {"model_type": "NemotronH_Nano_VL_V2", "architectures": ["NemotronH_Nano_VL_V2"],
         "llm_config": {"model_type": "no_such_lm", "hidden_size": 64}},
        ("`llm_config.model_type` is \"no_such_lm\", not a type transformers",)),
    "string hidden_size": (_changed("text_config.hidden_size", "64"), ('`text_config.hidden_size` = "64" is not',
                                                                        "expected int, got str", "fix the value")),
    "float hidden_size": (_changed("text_config.hidden_size", 64.5), ("`text_config.hidden_size` = 64.5 is not",)),
    "bool hidden_size": (_changed("text_config.hidden_size", True), ("`text_config.hidden_size` = true is not",)),
    "string num_hidden_layers": (_changed("text_config.num_hidden_layers", "2"),
                                 ('`text_config.num_hidden_layers` = "2" is not',)),
    "null vocab_size": (_changed("text_config.vocab_size", None), ("`text_config.vocab_size` = null is not",)),
    "string vision_config": (_changed("vision_config", "big"), ('`vision_config` = "big" is not',)),
    "list text_config": (_changed("text_config", [1]), ("`text_config` = [1] is not",)),
    "negative hidden_size": (_changed("text_config.hidden_size", -64),
                             ("`text_config.hidden_size` is -64, but a size must be a positive integer",
                              "fix `text_config.hidden_size`")),
    "zero layers": (_changed("text_config.num_hidden_layers", 0), ("`text_config.num_hidden_layers` is 0",)),
    "negative vision depth": (_changed("vision_config.depth", -1), ("`vision_config.depth` is -1",)),
    "negative heads": (_changed("vision_config.num_heads", -4), ("`vision_config.num_heads` is -4",)),
    # 10**6 layers x (4 experts + 1) + 2 vision layers: refused before any build, with the way out.
    "a million layers": (_changed("text_config.num_hidden_layers", 10**6),
                         ("would build 5,000,002 layer blocks",
                          "`text_config.num_hidden_layers` = 1,000,000 x (1 + 4 experts): 5,000,000",
                          "more than the limit of 50,000", "--max-layer-blocks N")),
}


def _write(tmp_path: Path, content: bytes | dict) -> Path:
    path = tmp_path / "config.json"
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return path


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_config_is_one_config_error_naming_file_key_and_fix(tmp_path, capsys, case):
    content, expected = CASES[case]
    path = _write(tmp_path, content)
    code = main(["plan", "--hf-config", str(path)])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"bridge-freeze plan: error: {path}"), lines[0]
    for text in expected:
        assert text in lines[0], (text, lines[0])
    assert "fix `model_type`" not in lines[0]


def test_the_build_size_limit_is_exact_and_can_be_raised(tmp_path, capsys, cpu_bridge):
    # BASE: text 2 layers x (4 experts + 1) = 10, vision depth 2 = 2: 12 layer blocks.
    path = _write(tmp_path, BASE)
    assert main(["plan", "--hf-config", str(path), "--max-layer-blocks", "11"]) == 2
    assert "would build 12 layer blocks" in capsys.readouterr().err
    assert main(["plan", "--hf-config", str(path), "--max-layer-blocks", "12", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"]["family"] == "qwen3_vl_moe" and doc["total"]["total"] > 0


def test_no_limit_with_zero(tmp_path, capsys, cpu_bridge):
    path = _write(tmp_path, BASE)
    assert main(["plan", "--hf-config", str(path), "--max-layer-blocks", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"]["source"] == "hf-config"


def test_max_layer_blocks_below_zero_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--hf-config", "x", "--max-layer-blocks", "-1"])
    assert exit_info.value.code == 2
    assert "argument --max-layer-blocks: must be an integer from 0 to 2**63 - 1, got '-1'" in capsys.readouterr().err


@pytest.mark.parametrize("with_tiny", [False, True])
def test_a_registered_type_nothing_reads_names_the_family_and_what_to_plan(tmp_path, capsys, monkeypatch,
                                                                            with_tiny):
    """A family's remote-code HF type that neither transformers nor plan's offline readers know (every built-in
    family's published type is readable now, so a family is registered here as another package would): the
    refusal names the family, and its tiny plan where the harness has a tiny configuration of it (faked), else
    says there is none; never "another family" nor "another transformers"."""
    from bridge_freeze_harness import tiny
    from bridge_freeze_plugin.registry import REGISTRY, register_family

    if with_tiny:
        monkeypatch.setattr(tiny, "TINY_FAMILIES", {**tiny.TINY_FAMILIES, "acme_vl": None})
    register_family("acme_vl", providers=["acme.providers:AcmeVLProvider"], language_model=["language_model"],
                    vision_model=["vision_tower"], hf_model_types=["AcmeForVision"], source="test")
    try:
        path = _write(tmp_path, {"model_type": "AcmeForVision", "auto_map": {"AutoConfig": "configuration.Config"}})
        assert main(["plan", "--hf-config", str(path)]) == 2
    finally:
        REGISTRY.unregister("acme_vl")
    line = capsys.readouterr().err.strip()
    assert "'AcmeForVision' is the acme_vl family's, and remote code" in line
    assert line.endswith("plan the family's tiny configuration (bridge-freeze plan acme_vl --tiny: the full "
                         "model's parts and prefixes, not its sizes)" if with_tiny else
                         "plan it from a config.json once transformers knows 'AcmeForVision' (there is no tiny "
                         "configuration of acme_vl here)")
