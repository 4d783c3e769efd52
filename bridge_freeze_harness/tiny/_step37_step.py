"""The harness's forward step for Step-3.7 in Bridge's loop, and the batch layout it reads (declared in
:mod:`bridge_freeze_harness.tiny.step37`'s ``FORWARD_STEPS``).

Bridge's only Step-3.7 step, ``megatron/bridge/models/stepfun/step37_flickr8k_step.py``, cannot run here: it reads
packed Flickr8k batches (image files loaded by its ``preprocess_packed_batch``) and hands the model THD-packed
sequences (``PackedSeqParams`` from ``cu_seqlens``) for TE's varlen attention, while megatron-core's local
``DotProductAttention``, the CPU's, asserts ``packed_seq_params is None``
(``megatron/core/transformer/dot_product_attention.py:153``). This step calls the model as that step does
(``model(input_ids=..., images=list[ImageForInsert], labels=..., loss_mask=..., position_ids=None, ...)``, Bridge's
masked next-token loss) on the synthetic BSHD rows instead: one row per sample, its causal mask, no ``cu_seqlens``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

#: the synthetic-sample keys (``step37.train_batch``) the step carries to the model.
STEP37_KEYS = frozenset({"input_ids", "labels", "loss_mask", "attention_mask", "images"})


def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows along the batch; the samples' ``ImageForInsert`` groups merged per insert token, their pixels in row
    order (the model fills each ``<im_start>`` it finds, row by row, with the next image's features)."""
    from megatron.bridge.models.stepfun.modelling_step37.image_insert_embedding import ImageForInsert

    pixels: dict[int, list[torch.Tensor]] = {}
    for sample in samples:
        for group in sample["images"]:
            pixels.setdefault(group.insert_start_token, []).append(group.images)
    return {
        "tokens": torch.cat([s["input_ids"] for s in samples]),
        "labels": torch.cat([s["labels"] for s in samples]),
        "loss_mask": torch.cat([s["loss_mask"] for s in samples]),
        "attention_mask": samples[0]["attention_mask"],  # [1, 1, s, s], shared by the batch
        "images": [ImageForInsert(insert_start_token=token, images=torch.cat(group))
                   for token, group in pixels.items()],
    }


def forward_step(state: Any, data_iterator: Iterable, model: Any, return_schedule_plan: bool = False,
                 ) -> tuple[torch.Tensor, Any]:
    """Bridge's Step-3.7 forward on a BSHD batch of :func:`collate` (the module docstring says why not THD)."""
    from megatron.bridge.models.stepfun.modelling_step37.image_insert_embedding import ImageForInsert
    from megatron.bridge.training.losses import create_masked_next_token_loss_function

    if return_schedule_plan:
        raise NotImplementedError("the harness's Step-3.7 step builds no schedule plan (no MoE comm overlap here)")
    device = next(model.parameters()).device  # Bridge's step moves to "cuda": the model's device here
    timers = state.timers
    timers("batch-generator", log_level=2).start()
    with state.straggler_timer(bdata=True):
        batch = next(data_iterator)
        images = [ImageForInsert(insert_start_token=group.insert_start_token, images=group.images.to(device))
                  for group in batch["images"]]
    timers("batch-generator").stop()
    loss_mask = batch["loss_mask"].to(device)
    forward_args = {
        "input_ids": batch["tokens"].to(device),
        "labels": batch["labels"].to(device),
        "loss_mask": loss_mask,
        "position_ids": None,  # as Bridge's step: the decoder's rotary computes them
        "attention_mask": batch["attention_mask"].to(device),
        "images": images,
    }
    with state.straggler_timer:
        output_tensor = model(**forward_args)
    rerun = state.cfg.rerun_state_machine
    return output_tensor, create_masked_next_token_loss_function(loss_mask, rerun.check_for_nan_in_loss,
                                                                 rerun.check_for_spiky_loss)
