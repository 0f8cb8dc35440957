# Which query rows each consumer warpgroup of a warp-specialized kernel works on, read from the
# TTGIR that Triton 3.6 prints after its Hopper warp specialization (ttg.warp_specialize with a
# default region and partitionN regions). No triton import: the CPU tests use it on saved text.
#
# A row index tensor is the sum of a splat scalar (the tile's first row) and a tt.make_range; the
# data partitioning pass gives each consumer its slice of the range and rewrites what it slices.
# In Triton 3.6 it also maps a descriptor load's row coordinate to coordinate + BLOCK_M / 2 for
# the second consumer, so when that coordinate is the same SSA value as the splat's scalar the
# second consumer's rows get the offset twice (dense_prefill_ws before 2026-12-02: rows
# m0 + 128 ... instead of m0 + 64 ...). consumer_rows() resolves each splat scalar to a
# structural expression plus a constant and returns every consumer's row intervals relative to
# that expression, so a test can demand that the consumers tile [0, BLOCK_M) exactly once.
import re

_DEF = re.compile(r"^\s*(%[\w.$-]+)(?::\d+)? = ([\w.]+)(.*)$")
_PARTITION = re.compile(r"^\s*partition(\d+)\(")
_RANGE = re.compile(r"start = (\d+) : i32.*end = (\d+) : i32|end = (\d+) : i32, start = (\d+)")
_CONST_INT = re.compile(r"^\s*(?:\{[^}]*\}\s*)?(-?\d+) : i(?:32|64)")
_OPERAND = re.compile(r"%[\w.$-]+")


def split_partitions(ttgir: str) -> dict[str, list[str]]:
    """The lines of each region of the first ttg.warp_specialize: 'default', 'partition0', ..."""
    regions: dict[str, list[str]] = {}
    current = None
    for line in ttgir.splitlines():
        if re.match(r"^\s*default \{", line):
            current = "default"
        elif m := _PARTITION.match(line):
            current = f"partition{m.group(1)}"
        elif current and re.match(r"^\s*tt\.return", line):
            break
        if current:
            regions.setdefault(current, []).append(line)
    return regions


def _defs(lines: list[str]) -> dict[str, tuple[str, str]]:
    out = {}
    for line in lines:
        if m := _DEF.match(line):
            out[m.group(1)] = (m.group(2), m.group(3))
    return out


def _operands(rest: str) -> list[str]:
    """The SSA operands of an op: before its attribute dict / type signature."""
    head = re.split(r" \{|\s:\s", rest, maxsplit=1)[0]
    return _OPERAND.findall(head)


def _resolve(name: str, defs: dict, depth: int = 0) -> tuple[str, int]:
    """(structure, constant): the scalar as a structural expression plus an integer offset;
    block arguments and values from outside the region read as 'arg'."""
    if name not in defs or depth > 40:
        return "arg", 0
    op, rest = defs[name]
    if op == "arith.constant":
        m = _CONST_INT.match(rest)
        return ("", int(m.group(1))) if m else (f"const{rest.strip()[:20]}", 0)
    args = [_resolve(a, defs, depth + 1) for a in _operands(rest)]
    if op == "arith.addi" and len(args) == 2:
        (sa, ca), (sb, cb) = args
        return "+".join(s for s in (sa, sb) if s), ca + cb
    attrs = re.findall(r"tt\.get_(?:program_id|num_programs) (\w)", f"{op}{rest}")
    parts = [f"{s}{'+' if s and c else ''}{c if c or not s else ''}" for s, c in args]
    return f"{op}{attrs}({','.join(parts)})", 0


def consumer_rows(ttgir: str, rows: int) -> dict[str, list[tuple[str, int, int]]]:
    """partition name -> [(structure, lo, hi)]: every index tensor splat(scalar) + make_range of
    `rows` elements (a consumer's share of the tile's rows) whose scalar does not depend on a
    loop variable, as the rows structure + [lo, hi). Partitions without any are left out (the
    producer)."""
    out: dict[str, list[tuple[str, int, int]]] = {}
    for name, lines in split_partitions(ttgir).items():
        defs = _defs(lines)
        found = set()
        for op, rest in defs.values():
            if op != "arith.addi" or "tensor<" not in rest:
                continue
            ops = _operands(rest)
            if len(ops) != 2:
                continue
            kinds = {o: defs.get(o, ("?", ""))[0] for o in ops}
            splat = [o for o in ops if kinds[o] == "tt.splat"]
            rng = [o for o in ops if kinds[o] == "tt.make_range"]
            if len(splat) != 1 or len(rng) != 1:
                continue
            m = _RANGE.search(defs[rng[0]][1])
            if not m:
                continue
            if m.group(1):
                start, end = int(m.group(1)), int(m.group(2))
            else:
                start, end = int(m.group(4)), int(m.group(3))
            if end - start != rows:
                continue
            scalar = _operands(defs[splat[0]][1])
            if len(scalar) != 1:
                continue
            structure, const = _resolve(scalar[0], defs)
            if "arg" in structure:  # the key index of the loop (its induction variable)
                continue
            found.add((structure, const + start, const + end))
        if found:
            out[name] = sorted(found)
    return out


def rows_problem(ttgir: str, block_m: int, consumers: int = 2) -> str | None:
    """None when the consumer partitions split the tile's rows [0, block_m) among them, each its
    own interval of block_m / consumers rows from the same first row; else what is wrong."""
    share = block_m // consumers
    found = consumer_rows(ttgir, share)
    if len(found) != consumers:
        return f"{len(found)} partitions with {share}-row index tensors, not {consumers}: {found}"
    intervals = []
    for name, entries in found.items():
        if len(entries) != 1:
            return f"{name} indexes rows in more than one way: {entries}"
        intervals.append(entries[0])
    if len({s for s, _, _ in intervals}) != 1:
        return f"the consumers count rows from different first rows: {found}"
    spans = sorted((lo, hi) for _, lo, hi in intervals)
    expected = [(i * share, (i + 1) * share) for i in range(consumers)]
    if spans != expected:
        return f"the consumers cover rows {spans} of the tile, not {expected}: {found}"
    return None


_TMA_LOAD = re.compile(
    r"ttng\.async_tma_copy_global_to_local .*!tt\.tensordesc<tensor<([\dx]+)x\w+,.*"
    r"-> !ttg\.memdesc<([\dx]+)x\w+,"
)


def tma_box_mismatches(ttgir: str) -> list[str]:
    """Copy-engine loads whose descriptor box differs from the shared buffer they fill: the
    copy writes the box's bytes while the mbarrier expects the buffer's (a host descriptor the
    pass halved the load of; the kernel waits forever or overwrites its neighbour)."""
    out = []
    for line in ttgir.splitlines():
        if (m := _TMA_LOAD.search(line)) and m.group(1) != m.group(2):
            out.append(f"box {m.group(1)} into a {m.group(2)} buffer: {line.strip()[:160]}")
    return out
