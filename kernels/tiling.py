"""Tiling helpers shared by the kernels: partitions, ceil-division, dtype sizes, row blocks
with their tail, column chunks of streamed rows, work splits between engines, and
partition-broadcast loads.

Logical cores: a kernel launched at LNC=2 runs once per physical core (``nl.num_programs()``
programs, ``nl.program_id(0)`` this one); both share the HBM inputs and outputs and each
has its own engines, SBUF and PSUM (AWS, "Using Logical NeuronCores (LNC) with NKI").
``program_share`` and ``program_rows`` give each program its contiguous part of the work.
Row kernels cut the rows into ``WORK_PARTS`` fixed parts whatever the degree
(``program_row_parts``): at LNC=2 each program takes one, at LNC=1 the one program takes
both in turn, so every block, and every engine choice made from a row's place in its
part, is the same at both degrees: the outputs are identical, bit for bit.

Rows go on partitions. A *row block* is ``(first_row, partitions, rows_per_partition)``:
``partitions * rows_per_partition`` consecutive rows, partition p holding rows
``[p * J, (p + 1) * J)`` of the block, so a block is one contiguous HBM range and its load
one DMA of ``J * cols`` elements per partition. The last ``< 128`` rows form a block with
``J = 1`` (the tail).

Rows too long for SBUF are streamed in column chunks (``column_chunks``); a [H] parameter
vector (a norm's weight or bias) is then kept broadcast on all partitions when it fits a
budget (``resident_params``), else loaded per chunk (``param_columns``).
"""

import nki.isa as nisa
import nki.language as nl

from .engine_costs import active as active_engine_costs

# SBUF/PSUM partitions (lanes) of a NeuronCore, also TensorE's contraction limit.
PARTITIONS = nl.tile_size.pmax
# Parts the rows of a row kernel are cut into: the largest logical-core degree (LNC=2 on
# Trn2/Trn3), so each program of any degree takes whole parts.
WORK_PARTS = 2


def cdiv(a, b):
    """Ceiling division of non-negative ints."""
    return (a + b - 1) // b


def itemsize(dtype):
    """Bytes per element of an NKI float dtype (2 for bf16/fp16, 4 for fp32)."""
    return 2 if dtype in (nl.bfloat16, nl.float16) else 4


def rows_per_partition(cols, target_cols, max_cols):
    """Rows per partition J so one transfer moves >= ``target_cols`` elements per partition,
    with a block's row tile (J * cols elements per partition) at most ``max_cols``."""
    return max(1, min(cdiv(target_cols, cols), max_cols // cols))


def row_blocks(n_rows, per_max, tail_position=None, first_row=0):
    """[(first_row, partitions, rows_per_partition)] covering rows [first_row, n_rows): full
    blocks of 128 * J rows (J <= per_max), then the < 128-row tail block with J = 1.
    ``tail_position`` moves the tail to that index of the list (e.g. 1: right after the
    first block)."""
    blocks = []
    start = first_row
    while n_rows - start >= PARTITIONS:
        per = min(per_max, (n_rows - start) // PARTITIONS)
        blocks.append((start, PARTITIONS, per))
        start += PARTITIONS * per
    if start < n_rows:
        tail = (start, n_rows - start, 1)
        if tail_position is None:
            blocks.append(tail)
        else:
            blocks.insert(min(tail_position, len(blocks)), tail)
    return blocks


# Most row slots one part_row_stats tile holds (8 bytes each for LayerNorm's (mean, rstd):
# 4 KiB per partition). A part with more row slots (more than 65536 rows in 128-row tiles)
# takes several tiles, so SBUF use stays bounded whatever the row count.
ROW_STATS_TILE_SLOTS = 512


def part_row_stats(hbm, lo, hi, per_max, width):
    """Per-row values of a part's rows [lo, hi) (e.g. LayerNorm's (mean, rstd)) kept in
    [128, slots, width] fp32 SBUF tiles allocated once each, laid out as ``row_blocks(hi,
    per_max, first_row=lo)`` lays out the rows: a block (start, parts, per) at ``per``
    consecutive slots of one tile, blocks in row order, a new tile when the next block
    would pass ROW_STATS_TILE_SLOTS. A tile per block would rotate through the compiler's
    few buffers, and a later block's first write wait for an earlier block's last read.

    Returns (views, runs): views {block start: its [parts, per, width] view}; runs, one per
    run of consecutive blocks with the same (parts, per) in one tile (a part of at most
    ROW_STATS_TILE_SLOTS slots has at most three: the full blocks, a shorter last full
    block, the tail): (last block's start, HBM view, SBUF view) of the run's rows of
    ``hbm`` [N, width], [parts, count, per, width] both (one transfer moves a run; empty
    when ``hbm`` is None)."""
    blocks = row_blocks(hi, per_max, first_row=lo)      # in row order
    views, runs = {}, []
    tile, used, i = None, 0, 0
    while i < len(blocks):
        first, parts, per = blocks[i]
        if tile is None or used + per > ROW_STATS_TILE_SLOTS:
            remaining = sum(b[2] for b in blocks[i:])
            tile = nl.ndarray((PARTITIONS, min(remaining, max(per, ROW_STATS_TILE_SLOTS)), width),
                              dtype=nl.float32, buffer=nl.sbuf)
            used = 0
        count = 1
        while (i + count < len(blocks) and blocks[i + count][1:] == (parts, per)
               and used + (count + 1) * per <= tile.shape[1]):
            count += 1
        for k in range(count):
            views[blocks[i + k][0]] = tile[0:parts, used + k * per:used + (k + 1) * per, :]
        if hbm is not None:
            # HBM rows first + k * parts * per + p * per + j -> [p, k, j, width]
            rows = hbm[first:first + count * parts * per, :].reshape((count, parts, per, width))
            runs.append((blocks[i + count - 1][0], rows.permute((1, 0, 2, 3)),
                         tile[0:parts, used:used + count * per, :].reshape((parts, count, per, width))))
        used += count * per
        i += count
    return views, runs


def share(n, part, parts):
    """[lo, hi) of range(n) for ``part`` of ``parts`` contiguous parts whose sizes differ by
    at most one (the later parts are the larger)."""
    return (part * n) // parts, ((part + 1) * n) // parts


def program_share(n):
    """[lo, hi) of range(n) that this program takes (``share`` over the programs). At
    LNC=1: (0, n)."""
    return share(n, nl.program_id(0), nl.num_programs())


def row_part(n_rows, part, parts):
    """[lo, hi) rows of ``part`` of ``parts``, cut at 128-row tiles (every part but the last
    has only full tiles; the last also takes the < 128-row tail): their tile counts differ
    by at most one."""
    lo, hi = share(cdiv(n_rows, PARTITIONS), part, parts)
    return min(n_rows, lo * PARTITIONS), min(n_rows, hi * PARTITIONS)


def program_rows(n_rows):
    """[lo, hi) of the rows [0, n_rows) this program takes (``row_part`` over programs)."""
    return row_part(n_rows, nl.program_id(0), nl.num_programs())


def even_parts(n):
    """[lo, hi) of each of the WORK_PARTS parts of range(n), in order; their sizes differ by
    at most one (the later parts are the larger)."""
    return [share(n, part, WORK_PARTS) for part in range(WORK_PARTS)]


def program_parts(parts):
    """The items of a WORK_PARTS-long list of parts that this program takes, in order."""
    lo, hi = share(WORK_PARTS, nl.program_id(0), nl.num_programs())
    return parts[lo:hi]


def program_row_parts(n_rows):
    """The [lo, hi) row ranges of the WORK_PARTS parts this program takes, in order."""
    pid, count = nl.program_id(0), nl.num_programs()
    lo, hi = share(WORK_PARTS, pid, count)
    return [row_part(n_rows, part, WORK_PARTS) for part in range(lo, hi)]


def block_rows(hbm, start, parts, per):
    """[parts, per, cols] view of rows [start, start + parts * per) of an HBM [N, cols]
    tensor: partition p holds the block's rows [p * per, (p + 1) * per)."""
    return hbm[start:start + parts * per, :].reshape((parts, per, hbm.shape[1]))


def load_block(hbm, start, parts, per):
    """A new SBUF tile [parts, per, cols] holding a row block of ``hbm`` (one DMA)."""
    tile = nl.ndarray((parts, per, hbm.shape[1]), dtype=hbm.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=block_rows(hbm, start, parts, per))
    return tile


def load_blocks(block, *hbms):
    """New SBUF tiles [parts, per, cols], one per HBM [N, cols] tensor of ``hbms``, each
    holding the row block ``block`` = (start, parts, per) (one DMA each, in that order).
    The tiles share one allocation site, so the compiler's buffer rotation (the cost
    model's: a site's tiles take turns in a few buffers) counts them together, as it does
    tiles allocated on one source line: callers that want a tensor's tiles rotated apart
    load it with load_block."""
    start, parts, per = block
    return tuple(load_block(hbm, start, parts, per) for hbm in hbms)


def program_row_blocks(n_rows, per_max, tail_position=None):
    """``row_blocks`` of each part this program takes (``program_row_parts``), in order:
    the same blocks at every logical-core degree."""
    blocks = []
    for lo, hi in program_row_parts(n_rows):
        blocks += row_blocks(hi, per_max, tail_position, first_row=lo)
    return blocks


def fitting_ahead(most, need):
    """The most items to load ahead for ``pipelined``, of ``most``, ``most`` - 1, ..., 0,
    whose on-chip tiles fit the active generation's SBUF: ``need(ahead)`` is the kernel's
    bound on the bytes per partition live at that depth."""
    sbuf = active_engine_costs().sbuf_bytes_per_partition
    for ahead in range(most, 0, -1):
        if need(ahead) <= sbuf:
            return ahead
    return 0


def slot_stores_pay(per, cols, itemsize, slot_ns):
    """Whether a block of ``per`` rows per partition (rows of ``cols`` elements of
    ``itemsize`` bytes) pays to be stored row slot by row slot, each slot's [P, cols] store
    issued as soon as the slot is made, rather than in one store after its last slot:
    ``per`` transfers instead of one cost a core's 16 DMA queues per x occ(d) - occ(per x d)
    more (d: one slot's data per queue, EngineCosts.queue_data_ns; each transfer holds a
    queue at least the transfer gap, EngineCosts.dma_occupancy_ns), and they overlap the
    work of every slot but the first (``slot_ns`` each, the estimated work after the last
    point all slots wait for). By the active generation's figures (engine_costs.py)."""
    if per < 2:
        return False
    c = active_engine_costs()
    slot_data_ns = c.queue_data_ns(cols * itemsize)
    extra_queue_ns = per * c.dma_occupancy_ns(slot_data_ns) - c.dma_occupancy_ns(per * slot_data_ns)
    return (per - 1) * slot_ns > extra_queue_ns


def pipelined(items, load, compute, store, ahead):
    """Run load -> compute -> store over ``items`` with the loads issued ``ahead`` items
    before their compute and each store one item after its compute, in program order.

    The compiler gives tiles a program keeps alive their own buffers and rotates the rest
    (in the cost model, about one iteration's tiles more than the program keeps alive):
    issuing load i + ahead before compute i keeps that many input tiles in flight, and
    deferring store i past compute i + 1 keeps the next output tile from waiting for it.
    ``load(item) -> loaded``, ``compute(item, loaded) -> result``, ``store(item, result)``."""
    items = list(items)
    loaded = [load(item) for item in items[:ahead]]
    pending = None
    for i, item in enumerate(items):
        if i + ahead < len(items):
            loaded.append(load(items[i + ahead]))
        result = compute(item, loaded.pop(0))
        if pending is not None:
            store(*pending)
        pending = (item, result)
    if pending is not None:
        store(*pending)


def pipelined_halves(items, load, front, back, store, ahead, interleave=True):
    """``pipelined`` with each item's compute in two halves, software-pipelined: item i's
    first half is issued before item i - 1's second half (but for the last item, after it:
    no item follows to fill the engines), so an item does not wait, engine by engine, for
    its predecessor's whole chain. ``interleave=False`` issues each item's halves in turn.
    ``load(item) -> loaded``, ``front(item, loaded) -> state``, ``back(item, loaded, state)
    -> result``, ``store(item, result)``; each store is issued after its item's second half.
    Used by the norm backwards (kernels/rms_norm_backward.py, kernels/layer_norm_backward.py)."""
    items = list(items)
    pending = []
    results = {}

    def finish_pending():
        if pending:
            i, loaded, state = pending.pop()
            results[i] = back(items[i], loaded, state)

    def compute(entry, loaded):
        i, item = entry
        early = not interleave or i == len(items) - 1
        if early:
            finish_pending()
        state = front(item, loaded)
        if not early:
            finish_pending()
        pending.append((i, loaded, state))
        if not interleave:
            finish_pending()
        return i

    def store_result(entry, i):
        finish_pending()            # the last item's second half
        store(entry[1], results.pop(i))

    pipelined(list(enumerate(items)), lambda entry: load(entry[1]), compute, store_result, ahead)


def fp32_column(value):
    """A [128, 1] fp32 SBUF tile holding ``value`` on every partition (one memset): the
    norms' eps as ScalarE's bias operand (a float bias needs NeuronCore-v3)."""
    tile = nl.ndarray((PARTITIONS, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=tile, value=value)
    return tile


def split_count(n, share):
    """How many of ``n`` items go to the first of two engines given its ``share`` (0..1):
    the split point of range(n) into [0, cut) and [cut, n)."""
    return min(n, max(0, int(round(n * share))))


def split_multiply(dst, a, b, cut):
    """dst = a * b over [P, J, H] tiles, columns [0, cut) on VectorE and the rest on GpSimd
    (the norm backwards' products); ``a`` and ``b`` are callables (lo, hi) -> the operand's
    columns."""
    cols = dst.shape[-1]
    for lo, hi, engine in ((0, cut, nisa.engine.vector), (cut, cols, nisa.engine.gpsimd)):
        if hi > lo:
            nisa.tensor_tensor(dst=dst[:, :, lo:hi], data1=a(lo, hi), data2=b(lo, hi), op=nl.multiply, engine=engine)


def path_segments(per, cols, shares):
    """[(row j, first column, end column, path k)] splitting a [P, per, cols] block's work
    between len(shares) + 1 paths: path k takes ``shares[k]`` of it, the last path the rest
    (cut points at the rounded cumulative shares, split_count); whole rows when a partition
    holds several rows (per > 1), else the columns of its single row. Empty paths are left
    out."""
    n = per if per > 1 else cols
    cuts = [0]
    total = 0.0
    for share in shares:
        total += share
        cuts.append(split_count(n, total))
    cuts.append(n)
    spans = [(lo, hi, k) for k, (lo, hi) in enumerate(zip(cuts, cuts[1:])) if hi > lo]
    if per > 1:
        return [(j, 0, cols, k) for lo, hi, k in spans for j in range(lo, hi)]
    return [(0, lo, hi, k) for lo, hi, k in spans]


def engine_segments(per, cols, share):
    """[(row j, first column, end column, on the first engine)] splitting a [P, per, cols]
    block's work between two engines in the ratio ``share`` (path_segments with two paths)."""
    return [(j, lo, hi, k == 0) for j, lo, hi, k in path_segments(per, cols, (share,))]


def spread(i, share):
    """Whether item i is among the round(n * share) items of a sequence spread evenly."""
    return int((i + 1) * share) > int(i * share)


def broadcast_rows(vec_hbm, cols):
    """[128, cols] SBUF copy of a [cols] HBM vector on every partition (one stride-0 DMA)."""
    tile = nl.ndarray((PARTITIONS, cols), dtype=vec_hbm.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=vec_hbm.reshape((1, cols)).broadcast(0, PARTITIONS))
    return tile


def column_chunks(cols, chunk):
    """[(c0, c1)] column ranges of at most ``chunk`` columns covering [0, cols)."""
    return [(c0, min(cols, c0 + chunk)) for c0 in range(0, cols, chunk)]


# A kernel's last block (no block follows it to hide its chain) is finished and stored in
# column chunks (drain_chunks) no smaller than these transfers per partition, from the DMA
# guide: >= 2 KiB recommended, >= 4 KiB saturates bandwidth (nki-spec "Hardware numbers").
# The norm backwards, compute-bound, cut at the first (kernels/rms_norm_backward.py,
# kernels/layer_norm_backward.py; rows shorter than that are not cut: smaller stores each
# hold the DMA queues for the transfer gap, and the LayerNorm backward's [4096, 128], eight
# 256-byte row stores instead of one, modeled 19.8 -> 23.3 us on trn2); the DMA-bound
# forwards at the second (kernels/rms_norm.py, kernels/layer_norm.py).
DMA_RECOMMENDED_BYTES = 2048
DMA_SATURATING_BYTES = 4096


def drain_chunks(per, cols, itemsize, min_bytes):
    """[(row slot j, c0, c1)]: a [P, per, cols] block's rows, row slot by row slot, each in
    as many equal column chunks of at least ``min_bytes`` per partition as it holds; [] for
    rows shorter than that (the block is stored whole)."""
    n = cols * itemsize // min_bytes
    if n < 1:
        return []
    return [(j, c0, c1) for j in range(per) for c0, c1 in column_chunks(cols, cdiv(cols, n))]


def resident_params(params, cols, budget):
    """[128, cols] SBUF broadcast copies of the [cols] HBM vectors ``params`` (None entries
    stay None) when together they take at most ``budget`` bytes per partition; else a list
    of None (``param_columns`` then loads the columns each chunk needs)."""
    total = sum(cols * itemsize(p.dtype) for p in params if p is not None)
    if total > budget:
        return [None for _ in params]
    return [None if p is None else broadcast_rows(p, cols) for p in params]


def param_columns(vec_hbm, resident, c0, c1):
    """[128, c1 - c0] SBUF columns c0:c1 of the [cols] HBM vector ``vec_hbm`` on every
    partition: a view of its resident copy, or a new stride-0 load (one DMA). None for a
    None vector."""
    if vec_hbm is None:
        return None
    if resident is not None:
        return resident[:, c0:c1]
    tile = nl.ndarray((PARTITIONS, c1 - c0), dtype=vec_hbm.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=vec_hbm[c0:c1].reshape((1, c1 - c0)).broadcast(0, PARTITIONS))
    return tile
