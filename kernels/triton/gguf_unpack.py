"""Each GGUF type's blocks unpacked as planes, for the Triton matmul (kernels/triton/gguf_matmul.py).

One step of the matmul's K loop reads NB blocks of 32 values or one super-block of 256 from BLOCK_N rows. The
step's bytes are loaded as tiles of contiguous bytes, and each block's scalars (d, dmin, sub-block scales) per
block, not per value; shifts then cut the tiles into planes of values in the order they unpack, not in column
order. (Where one byte feeds two planes of different groupings, Q6_K's high bits, Q2_K/Q3_K's 2-bit values and
the K-quants' scale bytes, the second read comes from L1.)

    plane q [BLOCK_N, G, I]   values of G groups (blocks or sub-blocks) of I consecutive columns each
    a, b    [BLOCK_N, G]      the group's scale and offset: w[n, g, i] = a[n, g] * q[n, g, i] + b[n, g]
    col0, STRIDE              value (g, i) is column col0 + STRIDE * g + i

A sum over K does not depend on the order of K when x and W share it, so `plane` reads x at those columns and
adds the plane's share of x @ W.T. Its GEMV form (a decode step's few rows) keeps the per-group factors out of
the inner sum: sum_k w x = a * sum_i(q x) + b * sum_i(x) per group, so the offset costs one x sum per group, not
one operation per weight. Its tl.dot form (prompts) builds w and hands it to the tensor cores.

The layouts are kernels/torch_ref/gguf_blocks.py's; rows and blocks past the weight's end were clamped by the
caller to real ones (so no byte load needs a mask) and `plane` zeroes x beyond `col_stop` instead.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def plane(
    acc, q, a, b, x_rows, col0, STRIDE: tl.constexpr, col_stop, HAS_B: tl.constexpr, GEMV: tl.constexpr, DOT_FP32
):
    """acc [BLOCK_M, BLOCK_N] += x[:, cols] @ w.T for w = a * q + b (b only where HAS_B), x_rows [BLOCK_M]: value
    (g, i) of the plane is column col0 + STRIDE * g + i. The columns are built from aranges here, not passed in
    as a tensor, so the compiler sees the runs of contiguous columns and loads x in vectors (a gathered x left
    the tensor cores waiting on an H200)."""
    q = q.to(tl.float32)
    GROUPS: tl.constexpr = q.shape[1]
    RUN: tl.constexpr = q.shape[2]
    if GEMV:
        cols = col0 + STRIDE * tl.arange(0, GROUPS)[:, None] + tl.arange(0, RUN)[None, :]  # [GROUPS, RUN]
        x = tl.load(x_rows[:, None, None] + cols[None, :, :], mask=cols[None, :, :] < col_stop, other=0.0)
        x = x.to(tl.float32)  # [BLOCK_M, GROUPS, RUN]
        part = tl.sum(q[None, :, :, :] * x[:, None, :, :], axis=3) * a[None, :, :]  # [BLOCK_M, BLOCK_N, GROUPS]
        if HAS_B:
            part += tl.sum(x, axis=2)[:, None, :] * b[None, :, :]
        acc += tl.sum(part, axis=2)
    else:
        w = q * a[:, :, None]
        if HAS_B:
            w += b[:, :, None]
        w = tl.reshape(w, (q.shape[0], GROUPS * RUN))  # [BLOCK_N, GROUPS * RUN]
        flat = tl.arange(0, GROUPS * RUN)
        cols = col0 + STRIDE * (flat // RUN) + flat % RUN
        x = tl.load(x_rows[:, None] + cols[None, :], mask=cols[None, :] < col_stop, other=0.0)
        if DOT_FP32:
            acc = tl.dot(x.to(tl.float32), tl.trans(w), acc, input_precision="ieee")
        else:  # 16-bit x: the weight is rounded to x's dtype for the tensor cores, sums stay float32
            acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc)
    return acc


@triton.jit
def _int8(ptr):
    return tl.load(ptr).to(tl.int8, bitcast=True).to(tl.float32)


@triton.jit
def _f16(ptr):
    """The little-endian float16 at byte pointers `ptr` (2-byte alignment is not guaranteed), as float32."""
    lo = tl.load(ptr).to(tl.uint16)
    hi = tl.load(ptr + 1).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _level(q):
    """IQ4_NL/IQ4_XS: a nibble's level (gguf_blocks.KVALUES) as a select chain: triton has no constant tables."""
    v = tl.where(q == 0, -127, 0)
    v = tl.where(q == 1, -104, v)
    v = tl.where(q == 2, -83, v)
    v = tl.where(q == 3, -65, v)
    v = tl.where(q == 4, -49, v)
    v = tl.where(q == 5, -35, v)
    v = tl.where(q == 6, -22, v)
    v = tl.where(q == 7, -10, v)
    v = tl.where(q == 8, 1, v)
    v = tl.where(q == 9, 13, v)
    v = tl.where(q == 10, 25, v)
    v = tl.where(q == 11, 38, v)
    v = tl.where(q == 12, 53, v)
    v = tl.where(q == 13, 69, v)
    v = tl.where(q == 14, 89, v)
    v = tl.where(q == 15, 113, v)
    return v.to(tl.float32)


@triton.jit
def _e2m1(q):
    """MXFP4: a code's doubled E2M1 level (kernels/torch_ref/mxfp4.py): magnitudes m = 0..3 as they are, then
    4, 6, 8, 12 for m = 4..7, which are 2 + bit 0 shifted left by 1 + bit 1; bit 3 is the sign."""
    m = q & 7
    level = tl.where(m < 4, m, (2 + (m & 1)) << (1 + ((m >> 1) & 1)))
    return tl.where(q >= 8, -level, level).to(tl.float32)


@triton.jit
def _e8m0_half(ptr):
    """MXFP4: the exponent byte e at `ptr` as its block scale 2^(e - 128), built from its bits as ggml does
    (subnormal for e < 2)."""
    e = tl.load(ptr).to(tl.int32)
    bits = tl.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    return bits.to(tl.float32, bitcast=True)


# ------------------------------------------------------------------------------------- blocks of 32 values
#
# A step reads NB blocks: byte tiles [BLOCK_N, NB, 16] (nibbles) or [BLOCK_N, NB, 32] (Q8_0); the low nibbles
# of block g hold its columns 32g .. 32g + 15, the high nibbles 32g + 16 .. 32g + 31.


@triton.jit
def _blocks(rows, kb, num_blocks, SIZE: tl.constexpr, NB: tl.constexpr):
    """Byte pointers [BLOCK_N, NB] to blocks kb .. kb + NB - 1, clamped to the row."""
    return rows[:, None] + tl.minimum(kb + tl.arange(0, NB), num_blocks - 1)[None, :] * SIZE


@triton.jit
def _fifth_bits(base):
    """Q5_0/Q5_1: the 4 bytes at `base` [BLOCK_N, NB] as one little-endian 32-bit word of high bits per block."""
    word = (
        tl.load(base).to(tl.int32)
        | (tl.load(base + 1).to(tl.int32) << 8)
        | (tl.load(base + 2).to(tl.int32) << 16)
        | (tl.load(base + 3).to(tl.int32) << 24)
    )
    return word[:, :, None]


@triton.jit
def small_blocks(acc, rows, x_rows, kb, col_stop, num_blocks, TYPE: tl.constexpr, NB: tl.constexpr, GEMV, DOT_FP32):
    """Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4 (TYPE as gguf_matmul.TYPE_IDS): NB blocks from block kb."""
    i16 = tl.arange(0, 16)
    if TYPE == 4:  # Q8_0: d | 32 int8
        base = _blocks(rows, kb, num_blocks, 34, NB)
        i32 = tl.arange(0, 32)
        q = _int8(base[:, :, None] + 2 + i32[None, None, :])
        acc = plane(acc, q, _f16(base), 0.0, x_rows, kb * 32, 32, col_stop, False, GEMV, DOT_FP32)
    else:
        if TYPE == 0:  # Q4_0: d | nibbles, value d * (q - 8)
            base = _blocks(rows, kb, num_blocks, 18, NB)
            QS: tl.constexpr = 2
            a = _f16(base)
            b = -8.0 * a
        elif TYPE == 1:  # Q4_1: d, m | nibbles, value d * q + m
            base = _blocks(rows, kb, num_blocks, 20, NB)
            QS: tl.constexpr = 4
            a = _f16(base)
            b = _f16(base + 2)
        elif TYPE == 2:  # Q5_0: d | fifth bits | nibbles, value d * (q - 16)
            base = _blocks(rows, kb, num_blocks, 22, NB)
            QS: tl.constexpr = 6
            a = _f16(base)
            b = -16.0 * a
            high = _fifth_bits(base + 2)
        elif TYPE == 3:  # Q5_1: d, m | fifth bits | nibbles, value d * q + m
            base = _blocks(rows, kb, num_blocks, 24, NB)
            QS: tl.constexpr = 8
            a = _f16(base)
            b = _f16(base + 2)
            high = _fifth_bits(base + 4)
        elif TYPE == 10:  # IQ4_NL: d | nibbles, value d * KVALUES[q]
            base = _blocks(rows, kb, num_blocks, 18, NB)
            QS: tl.constexpr = 2
            a = _f16(base)
            b = 0.0
        else:  # MXFP4: e | nibbles, value 2^(e - 128) * E2M1_DOUBLED[q]
            base = _blocks(rows, kb, num_blocks, 17, NB)
            QS: tl.constexpr = 1
            a = _e8m0_half(base)
            b = 0.0
        qs = tl.load(base[:, :, None] + QS + i16[None, None, :]).to(tl.int32)  # [BLOCK_N, NB, 16]
        for half in tl.static_range(2):  # low nibbles: columns 0..15 of each block; high: 16..31
            q = (qs >> (4 * half)) & 15
            if TYPE == 2 or TYPE == 3:
                q |= ((high >> (16 * half + i16[None, None, :])) & 1) << 4
            if TYPE == 10:
                q = _level(q)
            if TYPE == 12:
                q = _e2m1(q)
            # IQ4_NL (10) and MXFP4 (12) have no offset
            acc = plane(acc, q, a, b, x_rows, kb * 32 + 16 * half, 32, col_stop, TYPE < 10, GEMV, DOT_FP32)
    return acc


# ---------------------------------------------------------------------------------------- super-blocks
#
# A step reads one super-block (256 columns from col0) of each row. Its values go out as planes of 128 or 64
# columns whose groups are sub-blocks (Q4_K, Q5_K: 32 values; the others: 16), so every group has one scale.


@triton.jit
def _k_quant(acc, base, x_rows, col0, col_stop, QS: tl.constexpr, FIFTH: tl.constexpr, GEMV, DOT_FP32):
    """Q4_K (QS 16) and Q5_K (QS 48, FIFTH): d, dmin | 12 bytes of 6-bit scales and mins | (fifth bits) | nibbles.

    Chunk g (bytes 32g .. 32g + 31 of the nibbles) holds sub-block 2g + p in its nibble p. For the sub-block's
    index j = 2 (g % 2) + p within its half, the 12 bytes A = 4..7, B = 8..11, C = 12..15 give
    half 0: scale A[j] & 63, min B[j] & 63; half 1: scale C[j] & 15 | A[j] >> 6 << 4, min C[j] >> 4 | B[j] >> 6 << 4.
    """
    d = _f16(base)[:, None]
    dmin = _f16(base + 2)[:, None]
    g4 = tl.arange(0, 4)
    i32 = tl.arange(0, 32)
    chunks = base[:, None, None] + QS + 32 * g4[None, :, None] + i32[None, None, :]  # [BLOCK_N, 4, 32]
    qs = tl.load(chunks).to(tl.int32)
    if FIFTH:  # bit s of byte l: the fifth bit of value l of sub-block s
        fifth = tl.load(base[:, None, None] + 16 + i32[None, None, :]).to(tl.int32)  # [BLOCK_N, 1, 32]
    first_half = g4[None, :] < 2
    for p in tl.static_range(2):
        j = base[:, None] + 2 * (g4[None, :] % 2) + p  # [BLOCK_N, 4]
        sa = tl.load(j + 4).to(tl.int32)
        sb = tl.load(j + 8).to(tl.int32)
        sc = tl.load(j + 12).to(tl.int32)
        scale = tl.where(first_half, sa & 63, (sc & 15) | ((sa >> 6) << 4))
        minimum = tl.where(first_half, sb & 63, (sc >> 4) | ((sb >> 6) << 4))
        q = (qs >> (4 * p)) & 15
        if FIFTH:
            q |= ((fifth >> (2 * g4[None, :, None] + p)) & 1) << 4
        a = d * scale.to(tl.float32)
        b = -dmin * minimum.to(tl.float32)
        # value i of sub-block 2g + p is column 32 (2g + p) + i
        acc = plane(acc, q, a, b, x_rows, col0 + 32 * p, 64, col_stop, True, GEMV, DOT_FP32)
    return acc


@triton.jit
def _crumbs(acc, base, x_rows, col0, col_stop, TYPE: tl.constexpr, GEMV, DOT_FP32):
    """Q2_K: 16 B scales (low nibble * d, high * dmin) | 64 B 2-bit q | d, dmin; Q3_K: 32 B high-bit mask | 64 B
    2-bit q | 12 B 6-bit scales | d. Value 128h + 32s + l is bits 2s of byte 32h + l of the 2-bit values, and
    its sub-block 8h + 2s + l // 16; a plane is a half h, its group g = 2s + l // 16."""
    g8 = tl.arange(0, 8)
    i16 = tl.arange(0, 16)
    run = base[:, None, None] + 16 * (g8 % 2)[None, :, None] + i16[None, None, :]  # [BLOCK_N, 8, 16]: byte l
    shift = 2 * (g8 // 2)[None, :, None]
    if TYPE == 5:
        d = _f16(base + 80)[:, None]
        dmin = _f16(base + 82)[:, None]
    else:
        d = _f16(base + 108)[:, None]
        mask = tl.load(run).to(tl.int32)  # bit 4h + s of byte l: value 128h + 32s + l has no offset
    for half in tl.static_range(2):
        cols = col0 + 128 * half  # group g: columns 16g .. 16g + 15 from here
        if TYPE == 5:
            crumb = (tl.load(run + 16 + 32 * half).to(tl.int32) >> shift) & 3
            scales = tl.load(base[:, None] + 8 * half + g8[None, :]).to(tl.int32)  # [BLOCK_N, 8]
            a = d * (scales & 15).to(tl.float32)
            b = -dmin * (scales >> 4).to(tl.float32)
            acc = plane(acc, crumb, a, b, x_rows, cols, 16, col_stop, True, GEMV, DOT_FP32)
        else:
            crumb = (tl.load(run + 32 + 32 * half).to(tl.int32) >> shift) & 3
            q = crumb - 4 + 4 * ((mask >> (4 * half + shift // 2)) & 1)
            # scale i = 8h + g: low 4 bits are nibble h of byte 96 + g, high 2 bits are bits 2 (i // 4) of
            # byte 104 + i % 4
            low = (tl.load(base[:, None] + 96 + g8[None, :]).to(tl.int32) >> (4 * half)) & 15
            top_bytes = tl.load(base[:, None] + 104 + g8[None, :] % 4).to(tl.int32)
            top = (top_bytes >> (2 * (2 * half + g8[None, :] // 4))) & 3
            a = d * ((low | (top << 4)) - 32).to(tl.float32)
            acc = plane(acc, q, a, 0.0, x_rows, cols, 16, col_stop, False, GEMV, DOT_FP32)
    return acc


@triton.jit
def super_blocks(acc, rows, x_rows, sb, col_stop, TYPE: tl.constexpr, GEMV: tl.constexpr, DOT_FP32: tl.constexpr):
    """Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS (TYPE as gguf_matmul.TYPE_IDS): super-block sb of every row."""
    col0 = sb * 256
    i16 = tl.arange(0, 16)
    if TYPE == 7:
        acc = _k_quant(acc, rows + sb * 144, x_rows, col0, col_stop, 16, False, GEMV, DOT_FP32)
    elif TYPE == 8:
        acc = _k_quant(acc, rows + sb * 176, x_rows, col0, col_stop, 48, True, GEMV, DOT_FP32)
    elif TYPE == 5:
        acc = _crumbs(acc, rows + sb * 84, x_rows, col0, col_stop, TYPE, GEMV, DOT_FP32)
    elif TYPE == 6:
        acc = _crumbs(acc, rows + sb * 110, x_rows, col0, col_stop, TYPE, GEMV, DOT_FP32)
    elif TYPE == 9:
        # Q6_K: 128 B low nibbles | 64 B high crumbs | 16 int8 scales | d. Value 128h + 32t + l: nibble t // 2 of
        # byte 64h + 32 (t % 2) + l, crumb t of byte 128 + 32h + l, scale 8h + 2t + l // 16. A plane is a half h
        # and a nibble e, its group g = 2 (t % 2) + l // 16 (t = g // 2 + 2e): 64 consecutive columns
        base = rows + sb * 210
        d = _f16(base + 208)[:, None]
        g4 = tl.arange(0, 4)
        for half in tl.static_range(2):
            runs = base[:, None, None] + 16 * g4[None, :, None] + i16[None, None, :]  # [BLOCK_N, 4, 16]
            nibbles = tl.load(runs + 64 * half).to(tl.int32)
            # the 32 crumb bytes of this half serve groups g and g + 2 (read twice, the second time from L1)
            crumbs = tl.load(runs - 32 * (g4 // 2)[None, :, None] + 128 + 32 * half).to(tl.int32)
            for e in tl.static_range(2):
                t = g4[None, :, None] // 2 + 2 * e
                q = ((nibbles >> (4 * e)) & 15) | (((crumbs >> (2 * t)) & 3) << 4)  # [BLOCK_N, 4, 16]
                a = d * _int8(base[:, None] + 192 + 8 * half + 4 * e + g4[None, :])
                cols = col0 + 128 * half + 64 * e  # group g: columns 16g .. 16g + 15 from here
                acc = plane(acc, q, a, -32.0 * a, x_rows, cols, 16, col_stop, True, GEMV, DOT_FP32)
    else:  # IQ4_XS: d | 2 B high scale bits | 4 B low scale nibbles | 8 x 16 B nibbles, one 16 B run per sub-block
        base = rows + sb * 136
        s8 = tl.arange(0, 8)
        low = (tl.load(base[:, None] + 4 + s8[None, :] // 2).to(tl.int32) >> (4 * (s8[None, :] % 2))) & 15
        top = (tl.load(base[:, None] + 2 + s8[None, :] // 4).to(tl.int32) >> (2 * (s8[None, :] % 4))) & 3
        a = _f16(base)[:, None] * ((low | (top << 4)) - 32).to(tl.float32)  # [BLOCK_N, 8]
        runs = base[:, None, None] + 8 + 16 * s8[None, :, None] + i16[None, None, :]  # [BLOCK_N, 8, 16]
        qs = tl.load(runs).to(tl.int32)
        for half in tl.static_range(2):
            q = _level((qs >> (4 * half)) & 15)  # sub-block s: columns 32s .. 32s + 15 low, 32s + 16 .. high
            acc = plane(acc, q, a, 0.0, x_rows, col0 + 16 * half, 32, col_stop, False, GEMV, DOT_FP32)
    return acc
