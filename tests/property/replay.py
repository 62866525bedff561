"""An event-by-event replay of a memory trace, written apart from the analyzer.

It rebuilds the caching allocator's layout (segments, and the blocks inside
them) after any event from two facts only: the trace's events and the layout
PyTorch dumped at the end. Nothing here calls or mirrors the analyzer's code;
the property test (property_test.py) holds the analyzer's reports to it.

PyTorch's semantics it relies on (c10/cuda/CUDACachingAllocator.cpp):
  - alloc takes the start of a free block: the block is the rounded request,
    or the whole free block when the remainder is too small to split;
  - free_requested leaves the block active (pending) until free_completed,
    which makes it inactive and merges it with inactive neighbours;
  - segment_alloc / segment_free add and remove a whole cudaMalloc'd segment;
    segment_map / segment_unmap map and unmap pages of an expandable segment,
    whose contiguous mapped runs the dump lists as one segment each;
  - free blocks never touch each other, and every free block of the large
    pool is larger than 1 MiB (of the small pool: 512 B or more).
A trace that begins mid-run (the ring overflowed) starts from the layout
inferred from what the trace and the dump say existed before its first event.
"""
import bisect

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20          # kSmallSize: requests up to 1 MiB go to the small pool
SMALL_BUFFER = 2 << 20        # kSmallBuffer: a small-pool segment
LARGE_BUFFER = 20 << 20       # kLargeBuffer
ALLOCATED, PENDING, INACTIVE = 'active_allocated', 'active_pending_free', 'inactive'


class Policy:
    """PyTorch's rounding and splitting under the snapshot's allocator_settings."""

    def __init__(self, settings):
        settings = settings or {}
        self.expandable = bool(settings.get('expandable_segments', False))
        max_split = settings.get('max_split_size', -1)
        self.max_split = max_split if isinstance(max_split, int) and max_split > 0 else None
        divisions = settings.get('roundup_power2_divisions') or {}
        if isinstance(divisions, dict):
            self.divisions = [int(v) for _, v in sorted(divisions.items(), key=lambda kv: int(kv[0]))]
        else:
            self.divisions = []
        self.divisions += [0] * (16 - len(self.divisions))

    def round_size(self, size):
        if size < MIN_BLOCK:
            return MIN_BLOCK
        interval = max(size.bit_length() - 1 - 20, 0)
        divisions = self.divisions[min(interval, 15)]
        if divisions > 1 and size > MIN_BLOCK * divisions:
            if size & (size - 1) == 0:
                return size
            floor = 1 << (size.bit_length() - 1)
            step = floor >> (divisions.bit_length() - 1)
            if step == 0:
                return floor << 1
            rounded = size & ~(step - 1)
            return size if rounded == size else rounded + step
        return MIN_BLOCK * ((size + MIN_BLOCK - 1) // MIN_BLOCK)

    def keeps_remainder(self, rounded, remainder, small):
        """True when PyTorch does not split `remainder` off a block given `rounded` bytes."""
        if small or self.expandable:
            return remainder < MIN_BLOCK
        oversize = self.max_split is not None and rounded >= self.max_split
        return oversize or remainder <= SMALL_SIZE


class Block:
    __slots__ = ('address', 'size', 'state', 'requested')

    def __init__(self, address, size, state=INACTIVE, requested=None):
        self.address, self.size, self.state, self.requested = address, size, state, requested

    @property
    def end(self):
        return self.address + self.size


class Segment:
    """A cudaMalloc'd segment, or one contiguous mapped run of an expandable one."""

    def __init__(self, address, size, expandable, pool):
        self.address, self.size, self.expandable, self.pool = address, size, expandable, pool
        self.blocks = [Block(address, size)]

    @property
    def end(self):
        return self.address + self.size

    def index_of(self, address):
        starts = [b.address for b in self.blocks]
        i = bisect.bisect_right(starts, address) - 1
        if i < 0 or address >= self.blocks[i].end:
            raise ReplayError('0x%x lies in no block of segment 0x%x' % (address, self.address))
        return i

    def carve(self, address, size, state, requested):
        """Turns [address, address+size) of one inactive block into a block of `state`."""
        i = self.index_of(address)
        free = self.blocks[i]
        if free.state != INACTIVE or address + size > free.end:
            raise ReplayError('0x%x+%d is not inside a free block (%s at 0x%x+%d)' % (address, size, free.state, free.address, free.size))
        pieces = []
        if address > free.address:
            pieces.append(Block(free.address, address - free.address))
        pieces.append(Block(address, size, state, requested))
        if address + size < free.end:
            pieces.append(Block(address + size, free.end - address - size))
        self.blocks[i:i + 1] = pieces

    def release(self, address):
        """Makes the block at `address` inactive and merges it with inactive neighbours."""
        i = self.index_of(address)
        block = self.blocks[i]
        block.state, block.requested = INACTIVE, None
        self.merge_around(i)

    def merge_around(self, i):
        lo, hi = i, i
        while lo > 0 and self.blocks[lo - 1].state == INACTIVE:
            lo -= 1
        while hi + 1 < len(self.blocks) and self.blocks[hi + 1].state == INACTIVE:
            hi += 1
        if hi > lo:
            merged = Block(self.blocks[lo].address, self.blocks[hi].end - self.blocks[lo].address)
            self.blocks[lo:hi + 1] = [merged]


class ReplayError(Exception):
    pass


class DeviceState:
    """One device's layout, kept as segments sorted by address, with its totals."""

    def __init__(self, policy):
        self.policy = policy
        self.segments = []          # sorted by address
        self.allocated = self.pending = self.requested = self.reserved = 0

    # --- lookup ---------------------------------------------------------------
    def segment_at(self, address):
        starts = [s.address for s in self.segments]
        i = bisect.bisect_right(starts, address) - 1
        if i >= 0 and address < self.segments[i].end:
            return i, self.segments[i]
        return i, None

    def add_segment(self, segment):
        starts = [s.address for s in self.segments]
        self.segments.insert(bisect.bisect_left(starts, segment.address), segment)
        self.reserved += segment.size

    # --- the events -----------------------------------------------------------
    def segment_alloc(self, address, size):
        if self.segment_at(address)[1] is not None:
            raise ReplayError('segment_alloc at 0x%x inside a live segment' % address)
        self.add_segment(Segment(address, size, False, 'small' if size == SMALL_BUFFER else 'large'))

    def segment_free(self, address, size):
        i, segment = self.segment_at(address)
        if segment is None or segment.address != address or len(segment.blocks) != 1 or segment.blocks[0].state != INACTIVE:
            raise ReplayError('segment_free at 0x%x of no wholly free segment' % address)
        del self.segments[i]
        self.reserved -= segment.size

    def segment_map(self, address, size):
        end = address + size
        _, before = self.segment_at(address - 1)
        _, after = self.segment_at(end)
        if self.segment_at(address)[1] is not None:
            raise ReplayError('segment_map at 0x%x inside a mapped range' % address)
        piece = Segment(address, size, True, 'expandable')
        if before is not None and before.expandable and before.end == address:
            before.blocks.extend(piece.blocks)
            before.size += size
            piece = before
        else:
            self.add_segment(piece)
            self.reserved -= size
        if after is not None and after.expandable and after.address == end:
            piece.blocks.extend(after.blocks)
            piece.size += after.size
            self.segments.remove(after)
        self.reserved += size
        piece.merge_around(piece.index_of(address))

    def segment_unmap(self, address, size):
        i, piece = self.segment_at(address)
        if piece is None or not piece.expandable or address + size > piece.end:
            raise ReplayError('segment_unmap at 0x%x+%d of no mapped range' % (address, size))
        piece.carve(address, size, 'unmapping', None)
        k = piece.index_of(address)
        head, tail = piece.blocks[:k], piece.blocks[k + 1:]
        replaced = []
        for blocks in (head, tail):
            if blocks:
                run = Segment(blocks[0].address, blocks[-1].end - blocks[0].address, True, 'expandable')
                run.blocks = blocks
                replaced.append(run)
        self.segments[i:i + 1] = replaced
        self.reserved -= size

    def alloc(self, address, requested, size=None):
        """`size`: the block's size where the trace records it (ours); PyTorch's records only the request."""
        _, segment = self.segment_at(address)
        if segment is None:
            raise ReplayError('alloc at 0x%x outside every segment' % address)
        if size is None:
            free = segment.blocks[segment.index_of(address)]
            if free.address != address:
                raise ReplayError('alloc at 0x%x inside the free block at 0x%x' % (address, free.address))
            rounded = self.policy.round_size(requested)
            small = segment.pool == 'small' or (segment.expandable and rounded <= SMALL_SIZE)
            remainder = free.size - rounded
            size = free.size if remainder >= 0 and self.policy.keeps_remainder(rounded, remainder, small) else rounded
        segment.carve(address, size, ALLOCATED, requested)
        self.allocated += size
        self.requested += requested

    def _active_block(self, address):
        _, segment = self.segment_at(address)
        if segment is None:
            raise ReplayError('free of 0x%x outside every segment' % address)
        block = segment.blocks[segment.index_of(address)]
        if block.address != address or block.state == INACTIVE:
            raise ReplayError('free of 0x%x, which is no live block' % address)
        return segment, block

    def free_requested(self, address):
        _, block = self._active_block(address)
        if block.state == ALLOCATED:
            block.state = PENDING
            self.allocated -= block.size
            self.pending += block.size

    def free_completed(self, address):
        segment, block = self._active_block(address)
        if block.state == ALLOCATED:  # free_requested fell before the ring's first entry
            self.allocated -= block.size
        else:
            self.pending -= block.size
        self.requested -= block.requested or 0
        segment.release(address)

    # --- what the reports show ----------------------------------------------------
    @property
    def active(self):
        return self.allocated + self.pending

    def segment_count(self):
        return sum(1 for s in self.segments if not s.expandable)

    def inactive_split(self):
        return sum(b.size for s in self.segments if not s.expandable and len(s.blocks) > 1
                   for b in s.blocks if b.state == INACTIVE)

    def largest_free(self):
        return max((b.size for s in self.segments for b in s.blocks if b.state == INACTIVE), default=0)

    def figures(self):
        return {'allocated': self.allocated, 'pending_free': self.pending, 'active': self.active,
                'requested': self.requested, 'reserved': self.reserved, 'cached_free': self.reserved - self.active,
                'segments': self.segment_count(), 'inactive_split': self.inactive_split()}

    def layout(self):
        """The canonical layout: segments (expandable ones as mapped runs) and every mapped block."""
        segments = [(s.address, s.size, 'expandable' if s.expandable else s.pool) for s in self.segments]
        blocks = [(b.address, b.size, b.state, b.requested if b.state != INACTIVE else None)
                  for s in self.segments for b in s.blocks]
        return {'segments': segments, 'blocks': blocks}

    def live_allocations(self):
        return [(b.address, b.size, b.requested) for s in self.segments for b in s.blocks if b.state == ALLOCATED]
