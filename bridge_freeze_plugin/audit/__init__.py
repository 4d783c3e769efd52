"""The run-time audit: after the first optimizer steps, the run itself says what learned and what stayed frozen.

The build proves the selection once (the guarantee after every pre-wrap hook); the audit checks it where training
happens, in every loop that reduces gradients with megatron-core's ``finalize_model_grads`` (Bridge's ``pretrain()``
/ ``finetune()``, NeMo-RL's and SkyRL's Megatron steps, a loop of one's own): for the first ``audit_steps`` optimizer
steps (default 3; ``BRIDGE_FREEZE_AUDIT_STEPS``; 0 turns it off) it counts per part the trainable tensors that got a
non-zero gradient and the part's gradient norm, model-wide; it names every trainable tensor that got none, with the
cause it can see; and it checks that nothing frozen got a gradient or changed. Then it removes itself.

- :mod:`._watch`: what it watches in one model (tensors by part, what must hold, the parts' root modules);
- :mod:`._fingerprint`: what must hold, fingerprinted (a copy on the CPU, a checksum on an accelerator);
- :mod:`._gradients`: each audited step's gradients, per tensor and per part (shards of the distributed optimizer);
- :mod:`._summary`: the verdict merged over tensor-, pipeline-, expert- and data-parallel ranks, and the causes;
- :mod:`._report`: :class:`AuditReport` (the INFO block, the warnings, ``as_dict()``);
- :mod:`._run`: one model's audit from its build to its last step;
- :mod:`._seam`: megatron-core's ``finalize_model_grads`` wrapped, where every trainer's step meets it.

Importing it imports neither torch nor Megatron.
"""

from bridge_freeze_plugin.audit._fingerprint import Fingerprints, checksum
from bridge_freeze_plugin.audit._report import CAUSES, AuditReport, Finding, PartAudit, compress
from bridge_freeze_plugin.audit._run import PENDING, RunAudit, arm, audit_of, last_audit
from bridge_freeze_plugin.audit._seam import FINALIZE, audit_step, install

__all__ = [
    "CAUSES",
    "FINALIZE",
    "PENDING",
    "AuditReport",
    "Finding",
    "Fingerprints",
    "PartAudit",
    "RunAudit",
    "arm",
    "audit_of",
    "audit_step",
    "checksum",
    "compress",
    "install",
    "last_audit",
]
