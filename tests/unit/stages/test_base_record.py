"""The base record of a trainable-only checkpoint (issue 45 item 1): its file, and the base's fingerprint (no Bridge).

The fingerprint must tell apart what a wrong base looks like on disk (another model: other sizes; another
iteration of the same run: a small file changed; the same path rewritten: a data file's bytes changed) and keep a
copy of the base elsewhere, read as the same. Each expectation is built here from bytes written by the test.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from bridge_freeze_plugin.stages import SIDECAR, BaseRecord, fingerprint, saved_record

BIG = 6 << 20  # above the size hashed whole: sampled


def _base(root: Path, step: bytes = b"step 4", data: bytes | None = None) -> Path:
    root.mkdir(parents=True)
    (root / ".metadata").write_bytes(b"shapes")
    (root / "train_state.pt").write_bytes(step)
    (root / "__0_0.distcp").write_bytes(bytes(BIG) if data is None else data)
    return root


def test_a_copy_keeps_the_fingerprint_and_the_record_file_is_not_part_of_it(tmp_path):
    base = _base(tmp_path / "a")
    copy = Path(shutil.copytree(base, tmp_path / "b"))
    (copy / SIDECAR).write_text("{}")
    assert fingerprint(base) == fingerprint(copy)


def test_another_iteration_another_model_or_a_rewritten_data_file_change_it(tmp_path):
    first = fingerprint(_base(tmp_path / "a"))
    assert fingerprint(_base(tmp_path / "step", step=b"step 2")) != first
    assert fingerprint(_base(tmp_path / "size", data=bytes(BIG + 1))) != first
    start = bytearray(BIG)
    start[:8] = b"\x01" * 8  # the first slice of the data file read
    assert fingerprint(_base(tmp_path / "bytes", data=bytes(start))) != first


def test_the_record_written_into_an_iteration_directory_reads_back(tmp_path):
    from bridge_freeze_plugin.stages._base_record import write_record  # the writer the save step calls

    base = _base(tmp_path / "base" / "iter_0000002")
    iteration = tmp_path / "run" / "iter_0000004"
    iteration.mkdir(parents=True)
    assert saved_record(iteration) is None  # not a trainable-only checkpoint
    write_record(iteration, BaseRecord(str(base.parent), str(base)), {"b.weight", "a.weight"})
    body = json.loads((iteration / SIDECAR).read_text())
    assert body["base"] == {"pretrained_checkpoint": str(base.parent), "loaded_from": str(base),
                            "fingerprint": fingerprint(base)}
    record = saved_record(iteration)
    assert record is not None and record.path == str(iteration / SIDECAR)
    assert (record.base.given, record.base.loaded, record.base.digest) == (str(base.parent), str(base),
                                                                          fingerprint(base))
    assert record.saved == ("a.weight", "b.weight")
    assert [p.name for p in iteration.iterdir()] == [SIDECAR]  # no partial file left behind
