"""Bridge providers that declare a freeze flag the plugin knows but that no family covers, and why.

A flag set on one of these, on a subclass of one (unless a family names the subclass itself), or on any other
provider no family covers raises ``UnsupportedFreezeFlagError`` before any model is built, naming the reason below,
unless the provider's own class declares that flag: then Bridge's own freeze applies it, and the plugin says so
once (``activation._left_to_bridge``). The list is data checked by tests against every provider class the installed
Bridge ships and against a listing generated from Bridge 0.7.0's source (``scripts/gen_freeze_providers.py``): a
new Bridge provider with a freeze flag fails them until it gets a family or a line here.
"""

#: "package.module:Class" -> why the plugin cannot honour the flags on it.
UNSUPPORTED_PROVIDERS: dict[str, str] = {
    "megatron.bridge.models.nemotron_omni.nemotron_omni_provider:NemotronVLModelProvider": (
        "an abstract base whose own provide() builds the text model only; use NemotronOmniModelProvider"
    ),
    "megatron.bridge.models.megatron_mimo.megatron_mimo_provider:MegatronMIMOProvider": (
        "a generic multi-modality model whose parts are modality encoders / projections, not the plugin's parts"
    ),
    "megatron.bridge.diffusion.models.nemotron_labs_diffusion.nemotron_labs_diffusion_provider:"
    "NemotronLabsDiffusionModelProvider": (
        "a text-only diffusion language model: it inherits Ministral3's vision flags, but its provide() builds a "
        "GPT model with no vision tower or projection, not Ministral3's VLM"
    ),
    "megatron.bridge.models.megatron_mimo.llava_provider:LlavaMegatronMIMOProvider": (
        "a MIMO model whose parts are modality encoders / projections, not the plugin's parts"
    ),
}
