"""Weight sync: the actor's parameters to the rollout engine after every optimizer step.

Two encodings (``rollout.weight_sync``), both pure: no Ray, no
torch.distributed, no I/O. The functions here turn parameters into records
and apply records to the engine's tensors in place; moving the records
(pickled by Ray, or broadcast over NCCL) is the caller's business. Records
stay on the device of the tensors they were made from.

``bucket``: every parameter, every sync
    `iter_buckets` pulls ``(name, tensor)`` pairs one at a time (for FSDP2,
    each parameter's ``full_tensor()``) and packs their bytes into flat
    uint8 buckets of at most ``bucket_bytes``, yielding each bucket as soon
    as it is full, so the extra memory at any time is one bucket. The layout:

    - every piece starts at a multiple of `ALIGNMENT` (16) bytes, so a
      piece's bytes can be viewed as any dtype, whatever the dtypes before it;
    - a tensor is flattened (row-major) and split into consecutive runs of
      whole elements wherever a bucket fills up, so one tensor may span
      several buckets and a bucket may hold many tensors;
    - an empty tensor travels as one zero-length piece, so the receiver still
      sees, and checks, its name, shape and dtype;
    - ``bucket.nbytes <= bucket_bytes`` always, hence the minimum of
      `MIN_BUCKET_BYTES`; the last bucket is usually shorter, and is copied
      to a buffer of its own size (a moment with up to two buffers) so that
      sending it does not send the unused rest.

    `apply_bucket` writes each piece into the matching target; a
    `BucketReceiver` also records what arrived, so that at the end of a sync
    `sync_coverage` can prove every element of every target came exactly once.

``patch``: only what changed since the last sync
    `encode_entry` compares a parameter with the copy the engine was last
    sent, bit for bit (an integer view, so a NaN that stays the same NaN is
    unchanged and ``0.0`` → ``-0.0`` is a change), and sends the new values
    where the bits differ, their positions as 16-bit offsets within blocks of
    `PATCH_BLOCK` (65,536) elements plus a count per block: 2 bytes per change
    and 4 per block on top of the values. An entry is sent whole instead when
    that is no larger (a dense update, e.g. fp32 under AdamW). A parameter
    with no change sends nothing. `encode_patch` does this for a
    mapping; `PatchEncoder` keeps the snapshot between syncs, sends everything
    whole on the first sync and after `PatchEncoder.reset` (after a resume),
    and streams: `PatchEncoder.iter_patches` pulls parameters one at a time
    and yields patches of at most ``max_bytes`` (an entry is never split, so
    a patch exceeds ``max_bytes`` only when one entry alone does).
    `apply_patch` writes a patch into the targets in place.

Every problem raises a `WeightSyncError` naming the parameter and what
differed.
"""

from __future__ import annotations

import difflib
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence

import torch
from attrs import field, frozen
from jaxtyping import Int, Shaped, UInt8
from torch import Tensor

__all__ = [
    "ALIGNMENT",
    "BYTES_PER_MB",
    "MIN_BUCKET_BYTES",
    "PATCH_BLOCK",
    "Bucket",
    "BucketReceiver",
    "FlatBuckets",
    "Patch",
    "PatchEncoder",
    "PatchEntry",
    "SyncCoverage",
    "TensorPiece",
    "WeightSyncError",
    "apply_bucket",
    "apply_patch",
    "bucket_bytes_for",
    "decode_bucket",
    "encode_entry",
    "encode_patch",
    "iter_buckets",
    "plan_buckets",
    "sync_coverage",
]

# Every piece of a bucket starts at a multiple of this many bytes: the widest
# element (complex128) is 16 bytes, so a view of any dtype is valid there.
ALIGNMENT = 16
# A bucket must hold at least one element of any dtype at offset 0.
MIN_BUCKET_BYTES = ALIGNMENT
# ``rollout.bucket_size_mb`` counts mebibytes, as verl and vLLM do.
BYTES_PER_MB = 2**20

# Same-width integer dtypes: comparing and copying through these is exact for
# every dtype's bit patterns (NaN payloads, signed zeros) and works for dtypes
# whose own indexing kernels are missing (float8).
_BIT_VIEWS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class WeightSyncError(ValueError):
    """A sync that cannot be encoded or applied; the message names the parameter and the fault."""


# Typed converters: given a bare ``tuple`` as converter mypy cannot infer the element type.
def _ints(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(value) for value in values)


def _pieces(values: Iterable[TensorPiece]) -> tuple[TensorPiece, ...]:
    return tuple(values)


def _entries(values: Iterable[PatchEntry]) -> tuple[PatchEntry, ...]:
    return tuple(values)


def _names(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(names)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise WeightSyncError(
            f"unknown dtype {name!r}: expected a torch dtype name like 'bfloat16'"
        )
    return dtype


def _align(offset: int) -> int:
    return -(-offset // ALIGNMENT) * ALIGNMENT


def _listed(names: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(repr(name) for name in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _did_you_mean(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ---------------------------------------------------------------------------
# Bucket mode


@frozen
class TensorPiece:
    """One run of a parameter's elements inside a bucket.

    The piece holds elements ``[element_offset, element_offset + numel)`` of
    the parameter flattened in row-major order, stored from ``byte_offset``
    of its bucket's ``data``. ``shape`` and ``dtype`` describe the whole
    parameter (the dtype as a name such as ``"bfloat16"``, so the record
    pickles and converts to JSON as plain data).
    """

    name: str
    shape: tuple[int, ...] = field(converter=_ints)
    dtype: str
    element_offset: int
    numel: int
    byte_offset: int

    @property
    def torch_dtype(self) -> torch.dtype:
        return _dtype(self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of this piece in the bucket."""
        return self.numel * self.torch_dtype.itemsize


@frozen(eq=False)
class Bucket:
    """One bucket of a sync: its position in the sync, its pieces, and their bytes.

    ``data`` is flat uint8; each piece's bytes start at its ``byte_offset``
    (a multiple of `ALIGNMENT`). Buckets are numbered from 0 within a sync.
    """

    index: int
    pieces: tuple[TensorPiece, ...] = field(converter=_pieces)
    data: UInt8[Tensor, "bytes"] = field(repr=False)

    @property
    def nbytes(self) -> int:
        return self.data.numel()


def bucket_bytes_for(mb: float) -> int:
    """The bucket size in bytes for ``rollout.bucket_size_mb`` (1 MB = 2**20 bytes).

    Rounded down to a multiple of `ALIGNMENT`, as `FlatBuckets` needs.
    """
    if isinstance(mb, bool) or not isinstance(mb, int | float) or not math.isfinite(mb) or mb <= 0:
        raise WeightSyncError(f"rollout.bucket_size_mb: expected a positive number, got {mb!r}")
    nbytes = int(mb * BYTES_PER_MB) // ALIGNMENT * ALIGNMENT
    if nbytes < MIN_BUCKET_BYTES:
        raise WeightSyncError(
            f"rollout.bucket_size_mb: {mb!r} MB is {nbytes} bytes, below the "
            f"{MIN_BUCKET_BYTES} bytes a bucket needs to hold any one element"
        )
    return nbytes


def _check_nbytes(label: str, nbytes: int) -> None:
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < MIN_BUCKET_BYTES:
        raise WeightSyncError(
            f"{label}: expected an integer ≥ {MIN_BUCKET_BYTES} (room for one aligned element "
            f"of any dtype), got {nbytes!r}"
        )


class _Cursor:
    """Where the next piece of a bucket stream goes: the bucket's index and its bytes used."""

    def __init__(self, bucket_bytes: int) -> None:
        self.bucket_bytes = bucket_bytes
        self.index = 0
        self.used = 0

    def next_bucket(self) -> None:
        self.index, self.used = self.index + 1, 0


def _place(
    cursor: _Cursor, name: str, shape: Sequence[int], dtype: torch.dtype
) -> Iterator[TensorPiece | None]:
    """The pieces of one tensor in stream order, advancing ``cursor``; None where a bucket closes.

    The consumer calls ``cursor.next_bucket()`` at each None (after taking
    the bucket it closes). This is the one place the layout rules live:
    `iter_buckets` writes by them and `plan_buckets` predicts them.
    """
    itemsize, numel, dtype_name = dtype.itemsize, math.prod(shape), _dtype_name(dtype)
    if numel == 0:
        yield TensorPiece(name, shape, dtype_name, 0, 0, cursor.used)
        return
    offset = 0
    while offset < numel:
        start = _align(cursor.used)
        count = min(max(0, (cursor.bucket_bytes - start) // itemsize), numel - offset)
        if count == 0:
            yield None
            continue
        yield TensorPiece(name, shape, dtype_name, offset, count, start)
        cursor.used = start + count * itemsize
        offset += count
        if _align(cursor.used) >= cursor.bucket_bytes:
            yield None


def plan_buckets(
    specs: Iterable[tuple[str, Sequence[int], torch.dtype]], bucket_bytes: int
) -> list[tuple[TensorPiece, ...]]:
    """The pieces of each bucket `iter_buckets` makes of tensors with these names, shapes, dtypes.

    ``specs`` in the order the tensors will be sent; with ``dtype=`` given to
    `iter_buckets`, list the dtypes after that cast.
    """
    _check_nbytes("bucket_bytes", bucket_bytes)
    cursor = _Cursor(bucket_bytes)
    buckets: list[tuple[TensorPiece, ...]] = []
    pieces: list[TensorPiece] = []
    for name, shape, dtype in specs:
        for piece in _place(cursor, name, shape, dtype):
            if piece is None:
                buckets.append(tuple(pieces))
                pieces = []
                cursor.next_bucket()
            else:
                pieces.append(piece)
    if pieces:
        buckets.append(tuple(pieces))
    return buckets


@frozen(eq=False)
class _Slot:
    """One target's place in `FlatBuckets`: its view there, and the buckets it is the last of."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    view: Tensor
    completes: list[int]


class FlatBuckets:
    """Targets re-homed into one flat buffer laid out as the bucket stream: syncs pack into them.

    Built once by the receiver of in-memory syncs (the collocated engine):
    it plans the buckets its targets will arrive in (`plan_buckets`, in the
    mapping's order), allocates one uint8 buffer of all of them back to back,
    copies each target's values to its place there and makes the target a
    view of that place (``tensor.data = view``: a module holding the tensor
    keeps it, parameters stay parameters). `iter_buckets` given ``into=``
    then copies each tensor straight to its place (after checking it
    against the plan) and yields each bucket as that window of the buffer,
    and `apply_bucket` finds every piece already in place: one copy per
    byte instead of two, and no buffer of the sender's own. The bucket size
    must be a multiple of `ALIGNMENT`, so that a tensor split between
    buckets is contiguous in the buffer.
    """

    def __init__(self, targets: Mapping[str, Tensor], bucket_bytes: int) -> None:
        _check_nbytes("bucket_bytes", bucket_bytes)
        if bucket_bytes % ALIGNMENT:
            raise WeightSyncError(
                f"bucket_bytes: in-place buckets need a multiple of {ALIGNMENT}, got {bucket_bytes}"
            )
        if not targets:
            raise WeightSyncError("FlatBuckets needs at least one target")
        self.bucket_bytes = bucket_bytes
        self.layout = plan_buckets(
            ((n, t.shape, t.dtype) for n, t in targets.items()), bucket_bytes
        )
        self.sizes = [max((p.byte_offset + p.nbytes for p in b), default=0) for b in self.layout]
        total = bucket_bytes * (len(self.sizes) - 1) + self.sizes[-1]
        device = next(iter(targets.values())).device
        self.buffer = torch.empty(total, dtype=torch.uint8, device=device)
        starts: dict[str, int] = {}
        for index, bucket in enumerate(self.layout):
            for piece in bucket:
                begin = index * bucket_bytes + piece.byte_offset
                first = starts.setdefault(
                    piece.name, begin - piece.element_offset * piece.torch_dtype.itemsize
                )
                if begin != first + piece.element_offset * piece.torch_dtype.itemsize:
                    raise WeightSyncError(
                        f"parameter {piece.name!r}: its pieces are not contiguous"
                    )
        # Bytes of all pieces of a sync (alignment gaps not counted).
        self.payload_bytes = sum(piece.nbytes for bucket in self.layout for piece in bucket)
        completes: dict[str, list[int]] = defaultdict(list)
        for index, bucket in enumerate(self.layout):
            completes[bucket[-1].name].append(index)
        self.slots: list[_Slot] = []
        with torch.no_grad():
            for name, target in targets.items():
                start = starts[name]
                view = self.buffer[start : start + target.numel() * target.element_size()]
                view = view.view(target.dtype).view(target.shape) if target.numel() else target
                self.slots.append(
                    _Slot(name, tuple(target.shape), target.dtype, view, completes[name])
                )
                if target.numel() and target.device == device:  # else copied there on apply
                    view.copy_(target)
                    target.data = view

    def holds(self, bucket: Bucket) -> bool:
        """Whether ``bucket`` was packed into this layout (so its bytes are in place already)."""
        return (
            0 <= bucket.index < len(self.layout)
            and bucket.pieces is self.layout[bucket.index]
            and bucket.nbytes == self.sizes[bucket.index]
            and (
                bucket.nbytes == 0 or bucket.data.data_ptr() == self.window(bucket.index).data_ptr()
            )
        )

    def finish(self, indices: Sequence[int], targets: Mapping[str, Tensor]) -> int:
        """End a sync of buckets it `holds`: each bucket exactly once; returns the bytes.

        A target that no longer lives in its place (its ``.data`` replaced
        since) gets a copy from there, so the targets always end up synced.
        """
        if sorted(indices) != list(range(len(self.layout))):
            counts = {index: list(indices).count(index) for index in range(len(self.layout))}
            missing = [index for index, count in counts.items() if count == 0]
            repeated = [index for index, count in counts.items() if count > 1]
            raise WeightSyncError(
                f"weight sync incomplete: of {len(self.layout)} in-place buckets, missing "
                f"{missing or 'none'}, repeated {repeated or 'none'}"
            )
        with torch.no_grad():
            for slot in self.slots:
                target = targets.get(slot.name)
                if (
                    target is not None
                    and target.data_ptr() == slot.view.data_ptr()
                    and target.shape == slot.shape
                    and target.dtype == slot.dtype
                ):
                    continue  # it is the view itself, or one just like it
                flat = _target_flat(
                    targets, slot.name, slot.shape, _dtype_name(slot.dtype), "the layout"
                )
                if flat.numel():
                    flat.copy_(slot.view.reshape(-1))
        return self.payload_bytes

    def window(self, index: int) -> UInt8[Tensor, "bytes"]:
        """Bucket ``index``'s bytes in the buffer."""
        if not 0 <= index < len(self.layout):
            raise WeightSyncError(
                f"bucket {index} is past the {len(self.layout)} buckets the targets are laid out in"
            )
        start = index * self.bucket_bytes
        return self.buffer[start : start + self.sizes[index]]


class _Packer:
    """The bucket being filled: a buffer of its own and the pieces written into it."""

    def __init__(self, bucket_bytes: int, device: torch.device | None) -> None:
        self.cursor = _Cursor(bucket_bytes)
        self.device = device
        self.buffer: Tensor | None = None
        self.pieces: list[TensorPiece] = []

    def add(self, piece: TensorPiece, source: Tensor) -> None:
        """Write ``piece``'s elements of ``source`` (flat, any dtype: cast on the way in)."""
        if piece.numel:
            if self.buffer is None:
                device = source.device if self.device is None else self.device
                self.buffer = torch.empty(
                    self.cursor.bucket_bytes, dtype=torch.uint8, device=device
                )
            end = piece.element_offset + piece.numel
            dest = self.buffer[piece.byte_offset : piece.byte_offset + piece.nbytes]
            if source.dtype == piece.torch_dtype:  # bytes as they are (any dtype, NaN payloads)
                size = source.element_size()
                raw = source.view(torch.uint8)
                dest.copy_(raw[piece.element_offset * size : end * size])
            else:
                dest.view(piece.torch_dtype).copy_(source[piece.element_offset : end])
        self.pieces.append(piece)

    def take(self, last: bool = False) -> Bucket:
        """The bucket filled so far; the packer starts the next one.

        A pickled tensor carries its whole storage, so the last bucket, often
        far from full, is copied out of the buffer; the others leave less
        than one aligned element of it unused.
        """
        used = self.cursor.used
        data = torch.empty(0, dtype=torch.uint8) if self.buffer is None else self.buffer
        data = data[:used].clone() if last and used < data.numel() else data[:used]
        bucket = Bucket(self.cursor.index, self.pieces, data)
        self.cursor.next_bucket()
        self.buffer, self.pieces = None, []
        return bucket


def iter_buckets(
    named_tensors: Iterable[tuple[str, Tensor]],
    bucket_bytes: int,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    into: FlatBuckets | None = None,
) -> Iterator[Bucket]:
    """Pack full parameters into flat byte buckets of at most ``bucket_bytes``, lazily.

    Pulls one ``(name, tensor)`` at a time and yields each bucket as soon as
    it is full, so only one bucket is held here at a time (plus the tensor
    being packed). Any dtype, any shape (0-d and empty included); a
    non-contiguous tensor is made contiguous first. ``dtype``: floating-point
    tensors are cast to it as they are packed (no cast copy of their own).
    Each bucket is a fresh buffer on ``device`` (default: the device of its
    first tensor), or, with ``into``, the receiver's own window (see
    `FlatBuckets`; every piece must match its plan). The layout rules are
    in the module docstring. ``bucket_bytes`` is checked here, before
    anything is pulled.
    """
    _check_nbytes("bucket_bytes", bucket_bytes)
    if into is not None:
        if into.bucket_bytes != bucket_bytes:
            raise WeightSyncError(
                f"bucket_bytes {bucket_bytes} differs from the {into.bucket_bytes} the "
                "receiver's FlatBuckets were laid out for"
            )
        return _pack_into(named_tensors, into, dtype)
    packer = _Packer(bucket_bytes, None if device is None else torch.device(device))
    return _pack(named_tensors, packer, dtype)


def _pack(
    named_tensors: Iterable[tuple[str, Tensor]], packer: _Packer, dtype: torch.dtype | None
) -> Iterator[Bucket]:
    seen: set[str] = set()
    for name, tensor in named_tensors:
        if name in seen:
            raise WeightSyncError(f"parameter {name!r} given twice; a sync sends each one once")
        seen.add(name)
        source = tensor.detach().reshape(-1)
        cast = dtype if dtype is not None and source.is_floating_point() else source.dtype
        for piece in _place(packer.cursor, name, tensor.shape, cast):
            if piece is None:
                yield packer.take()
            else:
                packer.add(piece, source)
    if packer.pieces:
        yield packer.take(last=True)


def _pack_into(
    named_tensors: Iterable[tuple[str, Tensor]], into: FlatBuckets, dtype: torch.dtype | None
) -> Iterator[Bucket]:
    """`iter_buckets` into a receiver's `FlatBuckets`: one copy per tensor, to its planned place.

    Every tensor is checked against the plan (name, order, shape, dtype after
    the cast) before anything of it is written; each bucket is yielded, as
    its window and its planned pieces, once its last piece is written.
    """
    slots = iter(into.slots)
    for count, (name, tensor) in enumerate(named_tensors):
        slot = next(slots, None)
        cast = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        if slot is None or slot.name != name or slot.shape != tensor.shape or slot.dtype != cast:
            planned = "nothing" if slot is None else f"{slot.name!r} {slot.shape} {slot.dtype}"
            raise WeightSyncError(
                f"tensor {count} of the sync is {name!r} {tuple(tensor.shape)} {cast}, where the "
                f"receiver's layout has {planned}; the models differ (names, order, shapes or "
                "dtypes), so the receiver must lay its targets out again (a new FlatBuckets)"
            )
        if tensor.numel():
            slot.view.copy_(tensor.detach())  # neither side needs grad: nothing is recorded
        for index in slot.completes:
            yield Bucket(index, into.layout[index], into.window(index))
    missing = [slot.name for slot in slots]
    if missing:
        raise WeightSyncError(
            f"sync incomplete: the receiver's layout has {len(missing)} more tensor(s): "
            f"{_listed(missing)}"
        )


def decode_bucket(bucket: Bucket) -> Iterator[tuple[TensorPiece, Shaped[Tensor, "piece"]]]:
    """Each piece of ``bucket`` with its elements: a flat view of ``bucket.data`` in its dtype."""
    for piece in bucket.pieces:
        dtype = piece.torch_dtype
        if piece.numel == 0:
            yield piece, torch.empty(0, dtype=dtype, device=bucket.data.device)
            continue
        end = piece.byte_offset + piece.nbytes
        if piece.byte_offset % ALIGNMENT or end > bucket.nbytes:
            raise WeightSyncError(
                f"bucket {bucket.index}: the piece of {piece.name!r} spans bytes "
                f"[{piece.byte_offset}, {end}); expected a start aligned to {ALIGNMENT} "
                f"and an end within the bucket's {bucket.nbytes} bytes"
            )
        yield piece, bucket.data[piece.byte_offset : end].view(dtype)


def _target_flat(
    targets: Mapping[str, Tensor], name: str, shape: tuple[int, ...], dtype: str, source: str
) -> Tensor:
    """The target called ``name`` as a flat in-place view, once its shape and dtype agree."""
    if name not in targets:
        raise WeightSyncError(
            f"{source} carries parameter {name!r}, which the targets lack"
            + _did_you_mean(name, targets)
        )
    target = targets[name]
    if tuple(target.shape) != shape:
        raise WeightSyncError(
            f"parameter {name!r}: {source} carries shape {shape}, "
            f"the target has shape {tuple(target.shape)}"
        )
    if _dtype_name(target.dtype) != dtype:
        raise WeightSyncError(
            f"parameter {name!r}: {source} carries dtype {dtype}, the target has dtype "
            f"{_dtype_name(target.dtype)}; cast on the sending side so both agree"
        )
    if not target.is_contiguous():
        raise WeightSyncError(
            f"parameter {name!r}: the target is not contiguous, so it cannot be written "
            "in place through a flat view"
        )
    return target.view(-1)


def apply_bucket(targets: Mapping[str, Tensor], bucket: Bucket) -> int:
    """Copy every piece of ``bucket`` into its target in place; returns the bytes applied."""
    applied = 0
    with torch.no_grad():
        for piece, values in decode_bucket(bucket):
            source = f"bucket {bucket.index}"
            flat = _target_flat(targets, piece.name, piece.shape, piece.dtype, source)
            end = piece.element_offset + piece.numel
            if piece.element_offset < 0 or end > flat.numel():
                raise WeightSyncError(
                    f"parameter {piece.name!r}: {source} carries elements "
                    f"[{piece.element_offset}, {end}), outside its {flat.numel()} elements"
                )
            dest = flat[piece.element_offset : end]
            if dest.data_ptr() != values.data_ptr():  # packed into the target itself: in place
                dest.copy_(values)
            applied += piece.nbytes
    return applied


@frozen
class SyncCoverage:
    """What the pieces of one sync covered of the targets; `complete` when all is well.

    ``incomplete``: targets with elements never received (or never named);
    ``repeated``: targets with an element received more than once;
    ``unknown``: names the targets lack; ``mismatched``: targets whose pieces
    disagree with them on shape or dtype, or reach past their end.
    """

    incomplete: tuple[str, ...] = field(default=(), converter=_names)
    repeated: tuple[str, ...] = field(default=(), converter=_names)
    unknown: tuple[str, ...] = field(default=(), converter=_names)
    mismatched: tuple[str, ...] = field(default=(), converter=_names)

    @property
    def complete(self) -> bool:
        return not (self.incomplete or self.repeated or self.unknown or self.mismatched)

    def check(self) -> None:
        """Raise a `WeightSyncError` listing every problem unless the sync was complete."""
        if self.complete:
            return
        problems = [
            f"{label}: {_listed(names)}"
            for label, names in [
                ("targets not fully received", self.incomplete),
                ("targets with elements received more than once", self.repeated),
                ("parameters the targets lack", self.unknown),
                ("pieces disagreeing with their target's shape or dtype", self.mismatched),
            ]
            if names
        ]
        raise WeightSyncError("weight sync incomplete: " + "; ".join(problems))


def sync_coverage(pieces: Iterable[TensorPiece], targets: Mapping[str, Tensor]) -> SyncCoverage:
    """Check that ``pieces`` cover every element of every target exactly once.

    Reads only the targets' names, shapes and dtypes. An empty target counts
    as covered when exactly one piece names it.
    """
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    unknown: dict[str, None] = {}
    mismatched: dict[str, None] = {}
    for piece in pieces:
        if piece.name not in targets:
            unknown[piece.name] = None
            continue
        target = targets[piece.name]
        end = piece.element_offset + piece.numel
        if (
            piece.shape != tuple(target.shape)
            or piece.dtype != _dtype_name(target.dtype)
            or piece.element_offset < 0
            or end > target.numel()
        ):
            mismatched[piece.name] = None
            continue
        spans[piece.name].append((piece.element_offset, end))
    incomplete, repeated = [], []
    for name, target in targets.items():
        if name in mismatched:
            continue
        received = sorted(spans.get(name, []))
        covered_to, gap, overlap = 0, not received, target.numel() == 0 and len(received) > 1
        for start, end in received:
            gap |= start > covered_to
            overlap |= start < covered_to
            covered_to = max(covered_to, end)
        if gap or covered_to < target.numel():
            incomplete.append(name)
        if overlap:
            repeated.append(name)
    return SyncCoverage(incomplete, repeated, unknown, mismatched)


class BucketReceiver:
    """The engine's side of one bucket sync after another: apply, then check coverage.

    State: the pieces applied since the last `finish` (metadata only, no
    tensor data). `finish` checks that they covered every target exactly
    once and clears them for the next sync.
    """

    def __init__(self, targets: Mapping[str, Tensor]) -> None:
        self.targets = targets
        self._pieces: list[TensorPiece] = []
        self._bytes = 0

    @property
    def bytes_applied(self) -> int:
        """Bytes applied since the last `finish`."""
        return self._bytes

    def apply(self, bucket: Bucket) -> int:
        """`apply_bucket` into the targets, recording the pieces; returns the bytes applied."""
        applied = apply_bucket(self.targets, bucket)
        self._pieces.extend(bucket.pieces)
        self._bytes += applied
        return applied

    def coverage(self) -> SyncCoverage:
        """What the buckets applied since the last `finish` covered."""
        return sync_coverage(self._pieces, self.targets)

    def finish(self) -> int:
        """End the sync: raise unless every target was covered exactly once; returns its bytes."""
        coverage, applied = self.coverage(), self._bytes
        self._pieces, self._bytes = [], 0
        coverage.check()
        return applied


# ---------------------------------------------------------------------------
# Patch mode


# A patch locates changes within blocks of this many elements, so a 16-bit offset suffices.
PATCH_BLOCK = 2**16


def _patch_blocks(numel: int) -> int:
    return -(-numel // PATCH_BLOCK)


def _flat_indices(offsets: Tensor, block_counts: Tensor, device: torch.device) -> Tensor:
    """Flat int64 indices from int16 ``offsets`` (read as unsigned) and changes per block."""
    offsets = offsets.to(device=device, dtype=torch.int64) & 0xFFFF
    blocks = torch.repeat_interleave(block_counts.to(device), output_size=offsets.numel())
    return blocks.to(torch.int64) * PATCH_BLOCK + offsets


@frozen(eq=False)
class PatchEntry:
    """The new values of one parameter: at the changed positions, or whole when ``offsets`` is None.

    ``values`` is flat, in the parameter's dtype. Whole, it holds every
    element in row-major order, and ``offsets`` and ``block_counts`` are
    None. Otherwise it holds the new values in increasing order of flat
    index: ``block_counts`` (int32) counts the changes in each block of
    `PATCH_BLOCK` elements, and ``offsets`` (int16, read as unsigned) holds
    each change's index modulo `PATCH_BLOCK`; `indices` decodes them.
    """

    name: str
    shape: tuple[int, ...] = field(converter=_ints)
    dtype: str
    offsets: Int[Tensor, "changed"] | None = field(repr=False)
    block_counts: Int[Tensor, "blocks"] | None = field(repr=False)
    values: Shaped[Tensor, "changed"] = field(repr=False)

    def __attrs_post_init__(self) -> None:
        where = f"patch entry {self.name!r}"
        numel = math.prod(self.shape)
        if self.values.ndim != 1 or _dtype_name(self.values.dtype) != self.dtype:
            raise WeightSyncError(
                f"{where}: values must be flat {self.dtype}, got "
                f"{_dtype_name(self.values.dtype)} of shape {tuple(self.values.shape)}"
            )
        if self.offsets is None or self.block_counts is None:
            if self.offsets is not None or self.block_counts is not None:
                raise WeightSyncError(
                    f"{where}: offsets and block_counts must be both given or both None"
                )
            if self.values.numel() != numel:
                raise WeightSyncError(
                    f"{where}: a whole entry needs {numel} values for shape "
                    f"{self.shape}, got {self.values.numel()}"
                )
            return
        if self.offsets.ndim != 1 or self.offsets.dtype != torch.int16:
            raise WeightSyncError(
                f"{where}: offsets must be flat int16, got {_dtype_name(self.offsets.dtype)} "
                f"of shape {tuple(self.offsets.shape)}"
            )
        blocks = _patch_blocks(numel)
        if self.block_counts.dtype != torch.int32 or self.block_counts.shape != (blocks,):
            raise WeightSyncError(
                f"{where}: block_counts must be flat int32 with one count per block of "
                f"{PATCH_BLOCK} elements ({blocks} for shape {self.shape}), got "
                f"{_dtype_name(self.block_counts.dtype)} of shape {tuple(self.block_counts.shape)}"
            )
        if blocks and int(self.block_counts.min()) < 0:
            raise WeightSyncError(f"{where}: block_counts must not be negative")
        total = int(self.block_counts.sum())
        if not total == self.offsets.numel() == self.values.numel():
            raise WeightSyncError(
                f"{where}: block_counts add up to {total} changes, with "
                f"{self.offsets.numel()} offsets and {self.values.numel()} values; "
                "all three must agree"
            )

    @property
    def whole(self) -> bool:
        return self.offsets is None

    @property
    def indices(self) -> Int[Tensor, "changed"] | None:
        """The flat int64 indices of the changes, increasing; None when whole."""
        if self.offsets is None or self.block_counts is None:
            return None
        return _flat_indices(self.offsets, self.block_counts, self.offsets.device)

    @property
    def nbytes(self) -> int:
        """Bytes of offsets, block counts and values: what the entry costs to send."""
        return sum(
            tensor.numel() * tensor.element_size()
            for tensor in (self.offsets, self.block_counts, self.values)
            if tensor is not None
        )


@frozen(eq=False)
class Patch:
    """Some parameters' changes since the last sync; ``full`` when it is a sync from scratch.

    A full patch holds every entry whole (it needs no snapshot to apply
    against). A patch that is not full may still hold whole entries, where
    sending positions would have cost more. Parameters without a change have
    no entry.
    """

    entries: tuple[PatchEntry, ...] = field(converter=_entries)
    full: bool

    def __attrs_post_init__(self) -> None:
        if self.full and not all(entry.whole for entry in self.entries):
            partial = [entry.name for entry in self.entries if not entry.whole]
            raise WeightSyncError(
                f"a full patch holds every entry whole; these carry indices: {_listed(partial)}"
            )

    @property
    def nbytes(self) -> int:
        """Bytes of all entries."""
        return sum(entry.nbytes for entry in self.entries)


def _bits(name: str, flat: Tensor) -> Tensor:
    """``flat`` viewed as same-width integers, for exact bitwise comparison and copies."""
    itemsize = flat.element_size()
    if itemsize not in _BIT_VIEWS:
        raise WeightSyncError(
            f"parameter {name!r}: patch mode handles elements of 1, 2, 4 or 8 bytes, "
            f"and {_dtype_name(flat.dtype)} elements are {itemsize}; use bucket mode"
        )
    return flat.view(_BIT_VIEWS[itemsize])


def _whole_entry(name: str, tensor: Tensor) -> PatchEntry:
    values = tensor.detach().reshape(-1).clone()
    return PatchEntry(name, tensor.shape, _dtype_name(tensor.dtype), None, None, values)


def _check_agree(name: str, current: Tensor, previous: Tensor) -> None:
    if current.shape != previous.shape:
        raise WeightSyncError(
            f"parameter {name!r}: current shape {tuple(current.shape)}, snapshot shape "
            f"{tuple(previous.shape)}; a changed model needs a full sync"
        )
    if current.dtype != previous.dtype:
        raise WeightSyncError(
            f"parameter {name!r}: current dtype {_dtype_name(current.dtype)}, snapshot dtype "
            f"{_dtype_name(previous.dtype)}; a changed model needs a full sync"
        )


def encode_entry(name: str, current: Tensor, previous: Tensor | None = None) -> PatchEntry | None:
    """The patch entry taking ``previous`` to ``current``, or None when they are bitwise equal.

    With ``previous`` None the entry is whole. Otherwise it locates the
    elements whose bits differ (offsets within blocks, see `PatchEntry`) and
    holds the new values there, or is whole when that costs no more bytes.
    Compared on ``current``'s device (``previous`` is copied there if it
    lives elsewhere).
    """
    if previous is None:
        return _whole_entry(name, current)
    _check_agree(name, current, previous)
    flat = current.detach().reshape(-1)
    bits = _bits(name, flat)
    before = _bits(name, previous.detach().reshape(-1).to(flat.device))
    changed = torch.nonzero(bits != before).view(-1)
    if changed.numel() == 0:
        return None
    blocks = _patch_blocks(flat.numel())
    sparse_bytes = (
        changed.numel() * (torch.int16.itemsize + flat.element_size())
        + blocks * torch.int32.itemsize
    )
    if sparse_bytes >= flat.numel() * flat.element_size():
        return _whole_entry(name, current)
    # index mod PATCH_BLOCK as a signed 16-bit number with the same bits
    offsets = (((changed & 0xFFFF) ^ 0x8000) - 0x8000).to(torch.int16)
    block_counts = torch.bincount(changed // PATCH_BLOCK, minlength=blocks).to(torch.int32)
    values = bits[changed].view(flat.dtype)
    return PatchEntry(
        name, current.shape, _dtype_name(current.dtype), offsets, block_counts, values
    )


def encode_patch(
    current: Mapping[str, Tensor], snapshot: Mapping[str, Tensor] | None = None
) -> Patch:
    """The patch taking ``snapshot`` to ``current``: full (every entry whole) when it is None.

    Otherwise both must name the same parameters, each with the same shape
    and dtype. To work one parameter at a time, call it with one-entry
    mappings, or `encode_entry` directly.
    """
    if snapshot is None:
        return Patch([_whole_entry(name, tensor) for name, tensor in current.items()], full=True)
    only_current = [name for name in current if name not in snapshot]
    only_snapshot = [name for name in snapshot if name not in current]
    if only_current or only_snapshot:
        sides = [
            f"{label}: {_listed(names)}"
            for label, names in [
                ("only in current", only_current),
                ("only in snapshot", only_snapshot),
            ]
            if names
        ]
        raise WeightSyncError(
            "current and snapshot name different parameters ("
            + "; ".join(sides)
            + "); a changed model needs a full sync (snapshot=None)"
        )
    entries = [encode_entry(name, tensor, snapshot[name]) for name, tensor in current.items()]
    return Patch([entry for entry in entries if entry is not None], full=False)


def _write(flat: Tensor, entry: PatchEntry, name: str) -> None:
    """Write ``entry`` into the flat tensor ``flat`` in place, bit for bit."""
    if entry.offsets is None or entry.block_counts is None:
        flat.copy_(entry.values)
        return
    bits = _bits(name, flat)
    indices = _flat_indices(entry.offsets, entry.block_counts, flat.device)
    bits.index_copy_(0, indices, _bits(name, entry.values.to(flat.device)))


def apply_patch(targets: Mapping[str, Tensor], patch: Patch) -> int:
    """Write every entry of ``patch`` into its target in place; returns the bytes applied.

    Only the named targets change; a full patch is checked against the
    targets entry by entry, not for covering all of them.
    """
    with torch.no_grad():
        for entry in patch.entries:
            flat = _target_flat(targets, entry.name, entry.shape, entry.dtype, "the patch")
            _write(flat, entry, entry.name)
    return patch.nbytes


class PatchEncoder:
    """The actor's side of patch mode: a snapshot of what the engine holds, and a patch per sync.

    State, all of it:

    - the snapshot: for each parameter, a copy of what the engine was last
      sent, on ``snapshot_device`` (default: each parameter's own device); it
      costs one model's worth of memory there;
    - `needs_full`: whether the next sync must send everything whole. True at
      first, after `reset` (call it after a resume, or whenever the engine
      may not hold the last patches), and after a sync that did not run to
      its end (an exception, or a consumer that stopped early), so a lost
      patch can never leave the engine silently stale.

    Between full syncs the set of parameters, their shapes and dtypes are
    fixed, and each sync must give every one of them. One sync at a time.
    """

    def __init__(self, snapshot_device: torch.device | str | None = None) -> None:
        self.snapshot_device = None if snapshot_device is None else torch.device(snapshot_device)
        self._snapshot: dict[str, Tensor] = {}
        self._needs_full = True

    @property
    def needs_full(self) -> bool:
        return self._needs_full

    @property
    def names(self) -> tuple[str, ...]:
        """The parameters of the last full sync."""
        return tuple(self._snapshot)

    def reset(self) -> None:
        """Forget the snapshot: the next sync is full."""
        self._snapshot = {}
        self._needs_full = True

    def encode(self, current: Mapping[str, Tensor]) -> Patch:
        """One patch for the whole of ``current``, updating the snapshot."""
        full = self._needs_full
        return Patch(list(self._sync(current.items(), full)), full=full)

    def iter_patches(
        self, named_tensors: Iterable[tuple[str, Tensor]], max_bytes: int
    ) -> Iterator[Patch]:
        """Pull parameters one at a time and yield patches of at most ``max_bytes`` each.

        An entry is never split: a patch exceeds ``max_bytes`` only when one
        entry alone does. Yields nothing when nothing changed. The snapshot is
        updated as entries are made; the sync counts as done (`needs_full`
        false) just before the last patch is yielded.
        """
        _check_nbytes("max_bytes", max_bytes)
        return self._chunks(named_tensors, max_bytes)

    def _chunks(
        self, named_tensors: Iterable[tuple[str, Tensor]], max_bytes: int
    ) -> Iterator[Patch]:
        full = self._needs_full
        chunk: list[PatchEntry] = []
        chunk_bytes = 0
        for entry in self._sync(named_tensors, full):
            if chunk and chunk_bytes + entry.nbytes > max_bytes:
                yield Patch(chunk, full=full)
                chunk, chunk_bytes = [], 0
            chunk.append(entry)
            chunk_bytes += entry.nbytes
        if chunk:
            yield Patch(chunk, full=full)

    def _snapshot_copy(self, tensor: Tensor) -> Tensor:
        device = tensor.device if self.snapshot_device is None else self.snapshot_device
        return torch.empty(tensor.shape, dtype=tensor.dtype, device=device).copy_(tensor.detach())

    def _sync(
        self, named_tensors: Iterable[tuple[str, Tensor]], full: bool
    ) -> Iterator[PatchEntry]:
        self._needs_full = True  # until this sync has run to its end
        if full:
            self._snapshot = {}
        seen: set[str] = set()
        for name, tensor in named_tensors:
            if name in seen:
                raise WeightSyncError(f"parameter {name!r} given twice; a sync sends each one once")
            seen.add(name)
            if full:
                self._snapshot[name] = self._snapshot_copy(tensor)
                yield _whole_entry(name, tensor)
                continue
            if name not in self._snapshot:
                raise WeightSyncError(
                    f"parameter {name!r} was not in the last full sync"
                    + _did_you_mean(name, self._snapshot)
                    + "; the parameters are fixed between full syncs (call reset() after a change)"
                )
            previous = self._snapshot[name]
            entry = encode_entry(name, tensor, previous)
            if entry is not None:
                with torch.no_grad():
                    _write(previous.view(-1), entry, name)
                yield entry
        missing = [name for name in self._snapshot if name not in seen]
        if missing:
            raise WeightSyncError(
                f"sync incomplete: {len(missing)} parameter(s) of the last full sync not given: "
                f"{_listed(missing)}; the next sync will be full"
            )
        self._needs_full = False
