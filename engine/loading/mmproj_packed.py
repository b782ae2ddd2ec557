"""An mmproj's quantized linear weights kept in their blocks, as the text model's projections are.

The families of engine/loading/mmproj_families/ are written for float tensors: they rename, and some move
rows (Pixtral's q/k order undone, Qwen2-VL's q, k and v joined). A packed weight cannot go through those torch
operations, so where its rows end up is learnt by running the family on a stand-in for each:

    packed weight [N, K]  ->  its row numbers, int32 [N, 1] expanded to [N, K] (no memory until a family
                              joins or reorders it: then 4 bytes a value, until the trace is read)
    the family's output   ->  a checkpoint tensor of whole rows of such numbers names the source rows it
                              holds, in order: it becomes those rows of the packed weights (`_gather`)

The family's config and processor come from that same run (the stand-ins have the real shapes). A weight
whose numbers come out otherwise (a transpose, arithmetic, a dtype change, a row used twice or dropped) is
dequantized, and the family runs again with its floats (and meta tensors for the rest); a family that
cannot run on stand-ins at all gets every tensor as a float, as before packing existed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.gguf.tensors import (
    INT4_TYPES,
    INT8_TYPES,
    block_weight,
    dequantize,
    int4_weight,
    int8_weight,
    packed,
)
from engine.models.linear import BlockWeight, QuantizedWeight, SplitWeight
from kernels import ops

__all__ = ["read_packable", "translate_packed"]

log = logging.getLogger(__name__)

Weight = BlockWeight | QuantizedWeight | SplitWeight
FLOAT_TYPES = ("F32", "F16", "BF16")


@dataclass
class Packable:
    """One quantized GGUF tensor read as the kernels take it (not yet repacked: rows may still move)."""

    weight: Weight
    tensor: Any  # the gguf reader's tensor, for its name and to drop its mapped pages once repacked
    first_id: int  # its row numbers in pass 1 are first_id .. first_id + num_rows - 1

    @property
    def num_rows(self) -> int:
        return self.weight.shape[0]


def read_packable(tensors: list[Any], dtype: torch.dtype, device: torch.device) -> dict[str, Packable]:
    """The quantized 2-D weights of an mmproj that a kernel on `device` reads packed, by GGUF name: the text
    loader's choice (engine/gguf/checkpoint.py with quantized="int4"): blocks where a block kernel takes them,
    else Q4_0 / Q4_1 as 4-bit and Q8_0 as two 4-bit planes. Embeddings (patch, position, class, the image
    break row), convolutions, norms and biases are not among them: they are read as floats."""
    found: dict[str, Packable] = {}
    first_id = 0
    for t in tensors:
        kind = t.tensor_type.name
        if len(t.shape) != 2 or kind in FLOAT_TYPES or not t.name.endswith(".weight") or "_embd" in t.name:
            continue
        num_cols, num_rows = int(t.shape[0]), int(t.shape[1])  # GGUF dims run innermost first
        if ops.can_keep_blocks(kind, device, dtype, num_cols, num_rows):
            weight = block_weight(t, dtype)
        elif kind in INT4_TYPES:
            weight = int4_weight(t, dtype)
        elif kind in INT8_TYPES:
            weight = int8_weight(t, dtype)
        else:
            continue  # no kernel for this type here: dequantized like a float tensor
        found[t.name] = Packable(weight.map_rows(lambda rows: rows.to(device)), t, first_id)
        first_id += num_rows
    return found


Translate = Callable[[dict[str, Any]], tuple[dict[str, Any], dict[str, Any], Any]]


def translate_packed(
    translate: Translate, floats: dict[str, torch.Tensor], packable: dict[str, Packable], gguf: Any
) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """`translate(raw)` (a family's, its other arguments bound) over `floats` and the `packable` weights, the
    latter coming out packed under the checkpoint names the family gives them (see the module docstring)."""
    if not packable:
        return translate(floats)
    try:
        (extra, tensors, processor), rows, dirty = _trace_rows(translate, floats, packable)
        if dirty:  # again, with the floats of what cannot stay packed and shape-only stand-ins for the rest
            raw = {**floats, **{n: _float(p, gguf) if n in dirty else _meta(p) for n, p in packable.items()}}
            extra, tensors, processor = translate(raw)
            stand_ins = {n for n, value in tensors.items() if isinstance(value, torch.Tensor) and value.is_meta}
            if stand_ins != set(rows):
                raise ValueError(f"the two runs disagree on the packed tensors ({sorted(stand_ins ^ set(rows))[:3]})")
            log.info("dequantized %d projector weights its family does more with than rename or reorder", len(dirty))
        tensors = dict(tensors)
        for name, (ids, owners) in rows.items():
            tensors[name] = _gather(ids, owners, packable)
    except Exception as e:  # the family's own run on floats below says what is really wrong, if anything is
        log.info("the projector's weights are dequantized: its family cannot run on packed stand-ins (%s)", e)
        return translate({**floats, **{name: _float(p, gguf) for name, p in packable.items()}})
    return extra, tensors, processor


def _float(p: Packable, gguf: Any) -> torch.Tensor:
    return dequantize(p.tensor, gguf).to(device=p.weight.device, dtype=p.weight.dtype)


def _meta(p: Packable) -> torch.Tensor:
    return torch.empty(p.weight.shape, dtype=p.weight.dtype, device="meta")


def _trace_rows(translate: Translate, floats: dict[str, torch.Tensor], packable: dict[str, Packable]):
    """The family's result on row-number stand-ins, `{checkpoint name: (source row numbers [M], the source
    of each)}` for its outputs that can be packed, and the dirty sources: those whose numbers come out other
    than as whole rows, each once (or that share an output with a dirty one). Only clean outputs are listed,
    with their stand-ins left in the result."""
    raw: dict[str, Any] = dict(floats)
    for name, p in packable.items():
        ids = torch.arange(p.first_id, p.first_id + p.num_rows, dtype=torch.int32)
        raw[name] = ids.unsqueeze(1).expand(p.weight.shape)  # [N, K], every column the row numbers
    result = translate(raw)
    del raw
    names = list(packable)
    starts = torch.tensor([packable[n].first_id for n in names], dtype=torch.int32)
    num_ids = sum(p.num_rows for p in packable.values())
    rows: dict[str, tuple[torch.Tensor, list[str]]] = {}
    counts = torch.zeros(num_ids, dtype=torch.int64)
    dirty: set[str] = set()
    for name, value in result[1].items():
        if not isinstance(value, torch.Tensor) or value.dtype != torch.int32:
            continue
        column = value.reshape(-1, 1) if value.dim() < 2 else value[:, :1]
        ids = column.reshape(-1).contiguous()
        if ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < num_ids:
            raise ValueError(f"{name} holds integers that are not row numbers")
        owners = [names[i] for i in (torch.searchsorted(starts, ids, right=True) - 1).tolist()]
        whole_rows = value.dim() == 2 and (value.stride(1) == 0 or bool((value == column).all()))
        if whole_rows and all(packable[n].weight.shape[1] == value.shape[1] for n in set(owners)):
            rows[name] = (ids.long(), owners)
            counts += torch.bincount(ids.long(), minlength=num_ids)
        else:  # transposed, reshaped across rows, ...: what came out is not these weights' rows
            dirty.update(owners)
    for name, p in packable.items():  # a row used twice, or dropped (a dtype change loses the numbers too)
        if not bool((counts[p.first_id : p.first_id + p.num_rows] == 1).all()):
            dirty.add(name)
    while True:  # a checkpoint tensor joining a dirty weight's rows is not packed, nor are its other sources
        spread = {n for _, owners in rows.values() if dirty.intersection(owners) for n in owners}
        if spread <= dirty:
            break
        dirty |= spread
    clean = {name: (ids, owners) for name, (ids, owners) in rows.items() if not dirty.intersection(owners)}
    return result, clean, dirty


def _gather(ids: torch.Tensor, owners: list[str], packable: dict[str, Packable]) -> Weight | torch.Tensor:
    """The weight whose rows are the source rows `ids` (from `owners`), in that order: each run of rows from
    one source is that source (or its rows reordered), repacked for its kernel; several runs are stacked."""
    parts: list[Weight] = []
    start = 0
    for end in range(1, len(ids) + 1):
        if end < len(ids) and owners[end] == owners[start]:
            continue
        p = packable[owners[start]]
        local = ids[start:end] - p.first_id
        weight = p.weight
        if not torch.equal(local, torch.arange(p.num_rows)):
            weight = weight.map_rows(lambda r, local=local: r[local.to(r.device)])
        parts.append(packed(weight, p.tensor) if isinstance(weight, BlockWeight) else weight)
        start = end
    if len(parts) == 1:
        return parts[0]
    if len({type(w) for w in parts}) == 1 and len({w.group_size for w in parts}) == 1:
        return type(parts[0]).cat(parts)
    return torch.cat([w.dequantize() for w in parts])  # kinds the kernels cannot run as one weight
