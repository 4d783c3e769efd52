"""Qwen3-ASR: real ``Qwen3ASRModelProvider`` / ``Qwen3ASRModel``, Bridge's vendored HF audio encoder.

Everything sits under ``thinker``: ``thinker.audio_model`` (Bridge's vendored transformers
``Qwen3ASRAudioEncoder``: ``conv2d1..3``, ``conv_out``, ``layers``, ``ln_post``, then the two-layer projector
``proj1`` -> GELU -> ``proj2`` into the language model's width) and ``thinker.language_model`` (Bridge's
``Qwen3VLGPTModel``, M-RoPE, QK layer norm, on megatron-core's local layers). The provider's ``provide()``
asks for ``get_gpt_layer_with_transformer_engine_spec``, which the generic build patches make local; no CPU
patch of its own is needed.

Audio geometry. The encoder cuts each utterance into chunks of ``2 * n_window`` mel frames, while its
output-length formula (``_get_feat_extract_output_lengths``) hard-codes 100-frame chunks: the tiny config
keeps ``n_window=50`` so both agree. 40 frames of 16 mel bins (one chunk) -> three stride-2 convolutions ->
5 audio tokens, which replace 5 ``audio_token_id`` placeholders in the text.

Forward. The thinker computes M-RoPE positions from ``attention_mask`` read as a ``[batch, seq]`` padding
mask, but passes the same ``attention_mask`` to the language model, which on the CPU needs the explicit
causal ``[1, 1, s, s]`` mask (megatron-core's default one is made on "cuda"). The synthetic batch therefore
gives the causal mask AND the positions the thinker would compute for an unpadded row (``0..s-1`` on all
three M-RoPE axes), so the thinker does not compute them.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator
from typing import Any

import torch

from bridge_freeze_harness._hf_configs import TEXT, HFFamily
from bridge_freeze_harness.batches import Batch, TrainSpec, random_text, text_batch, text_range, token_row
from bridge_freeze_harness.tiny._common import TINY_LM, finalized

REAL = True

#: HF audio encoder sizes (``Qwen3ASRAudioEncoderConfig`` fields): output_dim is the language model's width.
TINY_AUDIO: dict[str, Any] = {
    "num_mel_bins": 16,
    "encoder_layers": 2,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "d_model": 32,
    "output_dim": TINY_LM["hidden_size"],
    "downsample_hidden_size": 8,
    "max_source_positions": 32,
    "n_window": 50,
    "n_window_infer": 100,
}
#: One chunk of mel frames, and the audio tokens it gives (40 -> 20 -> 10 -> 5).
AUDIO_FRAMES, AUDIO_TOKENS = 40, 5

#: Special token ids inside the tiny vocabulary (the real ones are >= 151643). ``audio_token_id`` and
#: ``audio_start_token_id`` are provider fields; BOS / EOS are batch-only (the model never reads them).
TOKEN_IDS: dict[str, int] = {"audio_token_id": 5, "audio_start_token_id": 6}
BATCH_IDS: dict[str, int] = {"bos_token_id": 1, "eos_token_id": 2}
#: kv_channels 16 -> 8 rotary frequencies, split over the three M-RoPE axes.
MROPE_SECTION = [2, 3, 3]


def thinker_config(**text: Any) -> Any:
    """The tiny ``Qwen3ASRThinkerConfig`` (Bridge's vendored copy; its text sizes match :data:`TINY_LM`), with
    ``text``'s fields added to its text config."""
    from megatron.bridge.models.qwen3_asr.hf_qwen3_asr.configuration_qwen3_asr import Qwen3ASRThinkerConfig

    return Qwen3ASRThinkerConfig(
        audio_config=dict(TINY_AUDIO),
        text_config={
            "vocab_size": TINY_LM["vocab_size"],
            "hidden_size": TINY_LM["hidden_size"],
            "intermediate_size": TINY_LM["ffn_hidden_size"],
            "num_hidden_layers": TINY_LM["num_layers"],
            "num_attention_heads": TINY_LM["num_attention_heads"],
            "num_key_value_heads": TINY_LM["num_query_groups"],
            "head_dim": TINY_LM["kv_channels"],
            **text,
        },
        **TOKEN_IDS,
    )


def default_rope_parameters(config: Any, device: Any = None, **_unused: Any) -> tuple[torch.Tensor, float]:
    """The plain (unscaled) rotary frequencies as transformers 4's ``"default"`` initialiser gave them.

    ``inv_freq[i] = 1 / base ** (2 i / d)`` for ``i < d / 2``, with ``base`` the config's ``rope_theta`` and ``d``
    the rotated width: ``head_dim`` (else ``hidden_size // num_attention_heads``) times the config's
    ``partial_rotary_factor`` (default 1). Both are read from the config's rope parameters first (transformers 5
    keeps them there), then from the config's own fields (transformers 4). Attention scaling 1.0.
    """
    rope = dict(getattr(config, "rope_parameters", None) or {})
    base = float(rope.get("rope_theta", getattr(config, "rope_theta", None)))
    factor = float(rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None) or 1.0))
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dim = int(head_dim * factor)
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
    return 1.0 / (base**exponents), 1.0


def _transformers5_causal_mask(create_causal_mask: Any) -> Any:
    """transformers 5's ``create_causal_mask`` called with transformers 4's keywords: ``input_embeds`` is its
    ``inputs_embeds``; ``cache_position`` is gone (transformers 5 finds the offset from ``past_key_values``)."""

    @functools.wraps(create_causal_mask)
    def call(*args: Any, input_embeds: Any = None, cache_position: Any = None, **kwargs: Any) -> Any:
        if input_embeds is not None:
            kwargs["inputs_embeds"] = input_embeds
        return create_causal_mask(*args, **kwargs)

    return call


def _init_weights_with_positions(init_weights: Any, table_class: type) -> Any:
    """transformers 5's ``_init_weights``, then a ``table_class`` module's table (its non-persistent
    ``positional_embedding`` buffer) filled as the class's own constructor computes it, at the buffer's size."""
    from transformers import initialization

    @functools.wraps(init_weights)
    def call(self: Any, module: Any) -> None:
        init_weights(self, module)
        if isinstance(module, table_class):
            table = module.positional_embedding
            with torch.device("cpu"):
                fresh = table_class(*table.shape).positional_embedding
            initialization.copy_(table, fresh.to(table.dtype))

    return call


@contextlib.contextmanager
def hf_model_patches() -> Iterator[None]:
    """The transformers-5 gaps of the vendored HF class, closed while it is built, loaded or run; undone on exit.

    - its text rotary embedding looks up ``ROPE_INIT_FUNCTIONS["default"]``, which transformers 5 dropped
      (``KeyError: 'default'``): :func:`default_rope_parameters` is entered under that key while none is there;
    - transformers 5's weight initialisation (``PreTrainedModel._init_weights``, at build and at load) fills a
      ``*RotaryEmbedding``'s ``inv_freq`` of rope type ``"default"`` from the module's
      ``compute_default_rope_parameters``, which transformers 5's own rotary classes have and the vendored one
      lacks (``AttributeError``): the vendored class gets :func:`default_rope_parameters` under that name;
    - its thinker names its tied weights as transformers 4 did, a list (``_tied_weights_keys = ["model.embed_tokens
      .weight", "lm_head.weight"]``), where transformers 5 reads a ``{target: source}`` dict (``save_pretrained``:
      ``AttributeError: 'list' object has no attribute 'keys'``): the same tie in transformers 5's form, the output
      layer from the embedding, replaces it while it is that list;
    - its text model and its thinker read ``config.pad_token_id``, which transformers 5's ``PretrainedConfig``
      no longer defaults (``AttributeError``; Qwen3-ASR-0.6B's thinker config has none): the vendored thinker and
      text config classes get transformers 4's default, ``None``, as a class attribute while they lack one;
    - transformers 5's ``from_pretrained`` builds the model on the meta device and leaves each non-persistent
      buffer to ``_init_weights``, which knows the rotary embedding's but not the audio encoder's sinusoidal
      position table (``SinusoidsPositionEmbedding.positional_embedding``): it stays uninitialised memory and the
      loaded model's audio features are NaN (measured). The vendored base class's ``_init_weights`` refills the
      table from the class's own constructor (:func:`_init_weights_with_positions`);
    - its text model's forward calls ``create_causal_mask(input_embeds=..., cache_position=...)``, transformers
      4's keywords (``TypeError: ... unexpected keyword argument 'input_embeds'``): the module's name calls
      transformers 5's function with ``inputs_embeds`` (:func:`_transformers5_causal_mask`).

    Run a forward inside too (the mask); a model built inside otherwise keeps working outside: the rotary
    embedding keeps its frequencies and its initialiser, the text model and the thinker their padding ids.
    """
    from megatron.bridge.models.qwen3_asr.hf_qwen3_asr import configuration_qwen3_asr as configs
    from megatron.bridge.models.qwen3_asr.hf_qwen3_asr import modeling_qwen3_asr as modeling

    thinker = modeling.Qwen3ASRThinkerForConditionalGeneration
    tied = thinker._tied_weights_keys
    mask = modeling.create_causal_mask
    base = modeling.Qwen3ASRPreTrainedModel
    own_init = vars(base).get("_init_weights")  # None: it inherits transformers' own
    with _rope_and_missing_attributes(modeling, configs):
        if isinstance(tied, list):
            thinker._tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
        if "input_embeds" not in inspect.signature(mask).parameters:
            modeling.create_causal_mask = _transformers5_causal_mask(mask)
        base._init_weights = _init_weights_with_positions(base._init_weights, modeling.SinusoidsPositionEmbedding)
        try:
            yield
        finally:
            if own_init is None:
                del base._init_weights
            else:
                base._init_weights = own_init
            modeling.create_causal_mask = mask
            thinker._tied_weights_keys = tied


@contextlib.contextmanager
def _rope_and_missing_attributes(modeling: Any, configs: Any) -> Iterator[None]:
    """:func:`hf_model_patches`' ``"default"`` rope initialiser and the class attributes the vendored classes lack
    (the rotary class's ``compute_default_rope_parameters``, the configs' ``pad_token_id``); undone on exit."""
    from transformers import modeling_rope_utils

    functions = modeling_rope_utils.ROPE_INIT_FUNCTIONS
    add_rope = "default" not in functions
    #: (class, attribute, value) set while the class lacks the attribute
    missing = [(cls, name, value) for cls, name, value in (
        (modeling.Qwen3ASRThinkerTextRotaryEmbedding, "compute_default_rope_parameters",
         staticmethod(default_rope_parameters)),
        (configs.Qwen3ASRThinkerConfig, "pad_token_id", None),
        (configs.Qwen3ASRTextConfig, "pad_token_id", None),
    ) if not hasattr(cls, name)]
    if add_rope:
        functions["default"] = default_rope_parameters
    for cls, name, value in missing:
        setattr(cls, name, value)
    try:
        yield
    finally:
        for cls, name, _ in reversed(missing):
            delattr(cls, name)
        if add_rope and functions.get("default") is default_rope_parameters:
            del functions["default"]


def make_provider(**overrides: Any) -> Any:
    from megatron.bridge.models.qwen3_asr.qwen3_asr_provider import Qwen3ASRModelProvider

    provider = Qwen3ASRModelProvider(
        **TINY_LM,
        thinker_config=thinker_config(),
        mrope_section=list(MROPE_SECTION),
        # Untied output layer, so thinker.language_model.output_layer exists.
        share_embeddings_and_output_weights=False,
        cross_entropy_loss_fusion=False,
        **TOKEN_IDS,
    )
    return finalized(provider, **overrides)


def audio_batch(provider: Any, spec: TrainSpec, batch_size: int, gen: torch.Generator) -> Batch:
    """``bos text audio*5 text eos`` per row, 40 mel frames per row, explicit M-RoPE positions (module docstring)."""
    ids = spec.all_ids()
    audio = int(provider.audio_token_id)
    low, high = text_range(spec, int(provider.vocab_size))
    rows = [
        token_row(
            [
                ids["bos_token_id"],
                random_text(gen, spec.text_before, low, high),
                torch.full((AUDIO_TOKENS,), audio),
                random_text(gen, spec.text_after, low, high),
                ids["eos_token_id"],
            ]
        )
        for _ in range(batch_size)
    ]
    batch = text_batch(rows, provider, ids["eos_token_id"], [audio])
    seq_len = batch["input_ids"].shape[1]
    batch["position_ids"] = torch.arange(seq_len).expand(3, batch_size, seq_len).contiguous()
    bins = int(provider.thinker_config.audio_config.num_mel_bins)
    batch["input_features"] = torch.randn(batch_size, bins, AUDIO_FRAMES, generator=gen, dtype=provider.params_dtype)
    batch["feature_attention_mask"] = torch.ones(batch_size, AUDIO_FRAMES, dtype=torch.long)
    return batch


TRAIN_SPECS = {
    "qwen3_asr": TrainSpec(token_ids=TOKEN_IDS, batch_ids=BATCH_IDS, roles={}, make_batch=audio_batch),
}


def hf_checkpoint_config() -> Any:
    """Bridge's vendored ``Qwen3ASRConfig`` at the tiny sizes, its text rotary settings as Qwen3-ASR-0.6B's
    (``rope_scaling``: default type, interleaved M-RoPE, whose section the tiny head_dim needs: Bridge reads it)."""
    from megatron.bridge.models.qwen3_asr.hf_qwen3_asr.configuration_qwen3_asr import Qwen3ASRConfig

    rope = {"rope_type": "default", "mrope_section": list(MROPE_SECTION), "mrope_interleaved": True,
            "interleaved": True}
    thinker = thinker_config(**TEXT, rope_theta=1_000_000.0, rope_scaling=rope)
    return Qwen3ASRConfig(thinker_config=thinker)


#: the tiny HF checkpoint recipe (collected by :data:`bridge_freeze_harness.hf_checkpoint.HF_FAMILIES`).
HF_CHECKPOINTS = {
    # transformers 5.12.1 has no Qwen3-ASR class: the maker's, as Bridge vendors it, with its transformers-5 gaps
    # closed while it is built, loaded or run (hf_model_patches).
    "qwen3_asr": HFFamily("Qwen3ASRForConditionalGeneration", hf_checkpoint_config,
                          model_module="megatron.bridge.models.qwen3_asr.hf_qwen3_asr.modeling_qwen3_asr",
                          model_patches=hf_model_patches),
}
