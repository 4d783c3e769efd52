"""The pre-wrap build: what happens to a model between a provider's ``provide()`` and the DDP wrap.

Named after Bridge's own seam (``register_pre_wrap_hook``); not ``build/``, which tools treat as generated output.


- :mod:`.context`: the :class:`~.context.BuildContext`, computed once per build (family, selection, labels);
- :mod:`.pipeline`: ``provide()`` / ``provide_distributed_model()`` with the selection applied, per call and
  per thread;
- :mod:`.flags`: the flags as descriptors, read as ``False`` by Bridge's own ``provide()`` during a build;
- :mod:`.classify`: which part each parameter belongs to, by identity (wrappers and renames do not hide it);
- :mod:`.freeze`: the freeze itself (``requires_grad`` by part);
- :mod:`.model_names`: model-wide parameter names under pipeline / expert parallelism (what patterns match);
- :mod:`.hooks`: the pre-wrap hook chain (the plugin's freeze first, the guarantee last), for
  ``provide_distributed_model`` and Bridge's public ``get_model`` alike;
- :mod:`.lora`: LoRA with full-rank parts (restore, overlap check, ``params_to_save``);
- :mod:`.guarantee`: after every hook, what trains is exactly what was asked (a hook may narrow a trained part);
- :mod:`.recompute_fix`: full recompute where it breaks gradients, turned off there (private config copies);
- :mod:`.adapters`: what the plugin knows of Bridge's PEFT conventions;
- :mod:`.collective`: an error on one rank is an error on every rank;
- :mod:`.model_wide`: the model-wide report over tensor / pipeline / expert ranks (one ``all_reduce``).
"""
