"""Fingerprints of the tensors that must not change: a bitwise copy on the CPU, a checksum elsewhere.

A tensor on the CPU is kept as a copy and compared bit for bit (exact: any change, a sign, a NaN payload). On an
accelerator a copy would double the memory of everything frozen, so each tensor is summarised by two 64-bit sums of
its bit pattern read as integers, one plain and one weighted by odd position weights, computed on the device in
slices (no copy of the tensor; a few passes over its memory). A change confined to one element always changes the
weighted sum (the difference of two bit patterns times an odd weight is never 0 modulo 2^64); changes to several
elements that cancel in both sums at once are the only thing it can miss. The cost is measured by
``benchmarks/audit.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

#: Elements per slice of the checksum (its temporary int64 tensors are this long).
SLICE = 1 << 22

_INT_OF_SIZE = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def _bits(tensor: Any) -> Any:
    """The tensor's elements as integers of the same width (a view: no copy for a contiguous tensor)."""
    import torch

    flat = tensor.detach().reshape(-1)
    if flat.dtype.is_complex:
        flat = torch.view_as_real(flat).reshape(-1)
    return flat.view(getattr(torch, _INT_OF_SIZE[flat.element_size()]))


def checksum(tensor: Any) -> Any:
    """A 2-element int64 tensor on the tensor's device: the plain and the position-weighted sum of its bits."""
    import torch

    bits = _bits(tensor)
    sums = torch.zeros(2, dtype=torch.int64, device=bits.device)
    for start in range(0, bits.numel(), SLICE):
        piece = bits[start : start + SLICE].to(torch.int64)
        weights = torch.arange(start, start + piece.numel(), dtype=torch.int64, device=bits.device) * 2 + 1
        sums[0] += piece.sum()
        sums[1] += (piece * weights).sum()
    return sums


class Fingerprints:
    """What ``(name, tensor)`` pairs hold now; :meth:`changed` names those that hold something else later."""

    def __init__(self, named: Iterable[tuple[str, Any]]) -> None:
        self._entries: list[tuple[str, Any, Any, bool]] = []
        self.bytes = 0  #: what the fingerprints keep (copies on the CPU, 16 bytes per tensor elsewhere)
        for name, tensor in named:
            if tensor.device.type == "meta":
                continue
            exact = tensor.device.type == "cpu"
            kept = tensor.detach().clone() if exact else checksum(tensor)
            self.bytes += kept.numel() * kept.element_size()
            self._entries.append((name, tensor, kept, exact))

    def __len__(self) -> int:
        return len(self._entries)

    def changed(self) -> list[str]:
        """The names of the tensors whose contents differ from the fingerprint (in the order given)."""
        import torch

        out: list[str] = []
        sums: list[tuple[str, Any, Any]] = []
        for name, tensor, kept, exact in self._entries:
            if exact:
                if tensor.shape != kept.shape or not torch.equal(_bits(tensor), _bits(kept)):
                    out.append(name)
            else:
                sums.append((name, checksum(tensor), kept))
        if sums:  # one device-to-host transfer for all of them
            now = torch.stack([s for _, s, _ in sums]).cpu()
            then = torch.stack([k for _, _, k in sums]).cpu()
            out.extend(name for (name, _, _), a, b in zip(sums, now, then, strict=True) if not torch.equal(a, b))
        return out
