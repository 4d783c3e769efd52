"""Bridge providers that declare a freeze flag the plugin knows but that no family covers, and why.

A flag set on one of these (or on any other provider no family covers) raises
``UnsupportedFreezeFlagError`` before any model is built, naming the reason below, unless the provider's
own class declares that flag: then Bridge's own freeze applies it, and the plugin says so once
(``activation._left_to_bridge``). The list is data
checked by a test against every provider class Bridge ships: a new Bridge provider with one of the
flags fails that test until it gets a family or a line here.
"""

#: "package.module:Class" -> why the plugin cannot honour the flags on it.
UNSUPPORTED_PROVIDERS: dict[str, str] = {
    "megatron.bridge.models.nemotron_omni.nemotron_omni_provider:NemotronVLModelProvider": (
        "an abstract base whose own provide() builds the text model only; use NemotronOmniModelProvider"
    ),
    "megatron.bridge.models.megatron_mimo.megatron_mimo_provider:MegatronMIMOProvider": (
        "a generic multi-modality model whose parts are modality encoders / projections, not the plugin's parts"
    ),
    "megatron.bridge.models.megatron_mimo.llava_provider:LlavaMegatronMIMOProvider": (
        "a MIMO model whose parts are modality encoders / projections, not the plugin's parts"
    ),
}
