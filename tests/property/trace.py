"""A trace read for the independent replay: its events in the analyzer's order,
the layout at the dump, and the layout before the first event.

PyTorch's pickles are read with Python's own pickle module (they hold plain
dicts and lists). Our own format is read through the CLI's `convert` (the dump's
layout as a pickle) and `events --all-events` (the events with their block
sizes, which our format records): the decoders, not the analysis.
"""
import gzip
import heapq
import json
import os
import pickle
import subprocess
import tempfile

from replay import (ALLOCATED, INACTIVE, LARGE_BUFFER, MIN_BLOCK, PENDING, SMALL_SIZE, Block, DeviceState, Policy,
                    ReplayError, Segment)

STATE_CHANGES = ('alloc', 'free_requested', 'free_completed', 'segment_alloc', 'segment_free', 'segment_map',
                 'segment_unmap')


class Event:
    __slots__ = ('index', 'kind', 'device', 'address', 'requested', 'size')

    def __init__(self, index, kind, device, address, requested, size):
        self.index, self.kind, self.device = index, kind, device
        self.address, self.requested, self.size = address, requested, size


class Trace:
    def __init__(self, events, dump_segments, settings, block_sizes_known):
        self.events = events                  # in the analyzer's order: Event.index is its event number
        self.dump_segments = dump_segments    # PyTorch's 'segments' at the dump
        self.policy = Policy(settings)
        self.block_sizes_known = block_sizes_known

    def devices(self):
        return sorted({e.device for e in self.events if e.kind in STATE_CHANGES} |
                      {s['device'] for s in self.dump_segments})


def _read_bytes(path):
    if path.endswith('.zst'):
        return subprocess.run(['zstd', '-dc', path], check=True, capture_output=True).stdout
    with open(path, 'rb') as f:
        raw = f.read()
    return gzip.decompress(raw) if raw[:2] == b'\x1f\x8b' else raw


def load(path, analyze):
    if '.pickle' in os.path.basename(path):
        return _load_pickle(pickle.loads(_read_bytes(path)))
    return _load_ours(path, analyze)


def _load_pickle(top):
    """A list is the segments alone (torch.cuda.memory_snapshot()): no events.
Merges the device traces and the annotations by time as the analyzer numbers events: an
    annotation that starts at the same microsecond as an event encloses it, one that ends then
    follows it; ties keep device order, then the annotations."""
    if isinstance(top, list):
        return Trace([], top, None, False)
    traces = top.get('device_traces') or []
    sequences = []
    for device, trace in enumerate(traces):
        sequences.append([(e['time_us'], 1, device, e) for e in trace if e.get('action') in STATE_CHANGES + ('oom', 'snapshot')])
    annotations = [a for a in top.get('external_annotations') or [] if a.get('stage') in ('START', 'END')]
    sequences.append([(a['time_us'], 0 if a['stage'] == 'START' else 2, None, a) for a in annotations])
    heads = [(seq[0][0], seq[0][1], s, 0) for s, seq in enumerate(sequences) if seq]
    heapq.heapify(heads)
    events = []
    while heads:
        _, _, s, i = heapq.heappop(heads)
        _, _, device, entry = sequences[s][i]
        if i + 1 < len(sequences[s]):
            following = sequences[s][i + 1]
            heapq.heappush(heads, (following[0], following[1], s, i + 1))
        if device is None:
            kind = 'annotation_begin' if entry['stage'] == 'START' else 'annotation_end'
            events.append(Event(len(events), kind, entry.get('device', 0), 0, 0, None))
        else:
            size = entry.get('size', 0)
            events.append(Event(len(events), entry['action'], device, entry.get('addr', 0), size,
                                size if entry['action'].startswith('segment') else None))
    return Trace(events, top['segments'], top.get('allocator_settings'), False)


def _load_ours(path, analyze):
    with tempfile.TemporaryDirectory() as tmp:
        converted = os.path.join(tmp, 'dump.pickle')
        subprocess.run([analyze, 'convert', path, '-o', converted], check=True, capture_output=True)
        with open(converted, 'rb') as f:
            top = pickle.load(f)
    listed = json.loads(subprocess.run([analyze, 'events', path, '--all-events', '--format', 'json'], check=True,
                                       capture_output=True).stdout)['events']
    kinds = {'segment_release': 'segment_free'}
    events = []
    for e in listed:
        kind = kinds.get(e['kind'], e['kind'])
        events.append(Event(e['event'], kind, e.get('device', 0), int(e['address'], 16), e['aux'] if kind in (
            'alloc', 'free_requested', 'free_completed') else e['size'], e['size']))
    return Trace(events, top['segments'], top.get('allocator_settings'), True)


# --- the layout before the first event -------------------------------------------

def _live_before(trace, device):
    """The blocks live before the first event: {address: (state, requested)}, and those
    the dump still holds, never touched by the trace: {address: dump block}."""
    live_in_trace = {}
    at_start = {}
    for e in trace.events:
        if e.device != device:
            continue
        if e.kind == 'alloc':
            live_in_trace[e.address] = ALLOCATED
        elif e.kind == 'free_requested':
            if e.address in live_in_trace:
                live_in_trace[e.address] = PENDING
            else:
                at_start[e.address] = (ALLOCATED, e.requested, e.size)
                live_in_trace[e.address] = PENDING
        elif e.kind == 'free_completed':
            if e.address in live_in_trace:
                del live_in_trace[e.address]
            else:
                at_start[e.address] = (PENDING, e.requested, e.size)
    untouched = {}
    for segment in trace.dump_segments:
        if segment['device'] != device:
            continue
        for b in segment['blocks']:
            if b['state'] != INACTIVE and b['address'] not in live_in_trace and b['address'] not in at_start:
                untouched[b['address']] = b
    return at_start, untouched


def _segments_before(trace, device):
    """Undoes the segment events from the dump back: [(address, size, expandable, pool)]."""
    whole = {}
    mapped = []   # sorted, disjoint [start, end) of expandable memory
    for s in trace.dump_segments:
        if s['device'] != device:
            continue
        if s.get('is_expandable'):
            mapped.append([s['address'], s['address'] + s['total_size']])
        else:
            whole[s['address']] = (s['total_size'], s.get('segment_type', 'large'))
    mapped.sort()
    for e in reversed(trace.events):
        if e.device != device:
            continue
        if e.kind == 'segment_alloc':
            if whole.pop(e.address, None) is None:
                raise ReplayError('segment_alloc at 0x%x of a segment the dump does not hold, nor a later free' % e.address)
        elif e.kind == 'segment_free':
            whole[e.address] = (e.size, 'small' if e.size == 2 << 20 else 'large')
        elif e.kind == 'segment_map':
            mapped = _subtract(mapped, e.address, e.address + e.size)
        elif e.kind == 'segment_unmap':
            mapped = _add(mapped, e.address, e.address + e.size)
    out = [(a, size, False, pool) for a, (size, pool) in whole.items()]
    out += [(a, end - a, True, 'expandable') for a, end in mapped]
    return sorted(out)


def _subtract(ranges, start, end):
    out = []
    for a, b in ranges:
        if b <= start or a >= end:
            out.append([a, b])
            continue
        if a < start:
            out.append([a, start])
        if b > end:
            out.append([end, b])
    return out


def _add(ranges, start, end):
    ranges = sorted(ranges + [[start, end]])
    out = []
    for a, b in ranges:
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def initial_state(trace, device):
    """The layout before the first event: empty for a whole trace; after a ring overflow,
    the segments the dump and the trace show existed, holding the blocks that were live.
    A live block the dump no longer holds is its rounded request, plus the bytes up to the
    next live block where those are too few to have been split off (free blocks never are)."""
    state = DeviceState(trace.policy)
    for address, size, expandable, pool in _segments_before(trace, device):
        state.add_segment(Segment(address, size, expandable, pool))
    at_start, untouched = _live_before(trace, device)
    live = {a: (b['state'], b['requested_size'], b['size']) for a, b in untouched.items()}
    live.update(at_start)
    for segment in state.segments:
        inside = sorted(a for a in live if segment.address <= a < segment.end)
        for k, address in enumerate(inside):
            block_state, requested, size = live[address]
            if size is None:
                size = _size_before(trace.policy, segment, address, requested,
                                    inside[k + 1] if k + 1 < len(inside) else segment.end)
            segment.carve(address, size, block_state, requested)
            if block_state == ALLOCATED:
                state.allocated += size
            else:
                state.pending += size
            state.requested += requested
    for address in live:
        if state.segment_at(address)[1] is None:
            raise ReplayError('a block live before the trace at 0x%x lies in no segment' % address)
    return state


def _size_before(policy, segment, address, requested, next_live):
    rounded = policy.round_size(requested)
    gap = next_live - address - rounded
    small = segment.pool == 'small' or (segment.expandable and rounded <= SMALL_SIZE)
    if gap < 0:
        raise ReplayError('the block live before the trace at 0x%x (%d B requested) overlaps the next' % (address, requested))
    if small or policy.expandable:
        return rounded + gap if gap < MIN_BLOCK else rounded
    oversize = policy.max_split is not None and rounded >= policy.max_split
    return rounded + gap if gap <= SMALL_SIZE or (oversize and gap < LARGE_BUFFER) else rounded


def dump_layout(trace, device):
    """The dump's layout in DeviceState.layout()'s form, expandable pieces joined where they touch."""
    segments, blocks = [], []
    for s in sorted((s for s in trace.dump_segments if s['device'] == device), key=lambda s: s['address']):
        kind = 'expandable' if s.get('is_expandable') else s.get('segment_type', 'large')
        if kind == 'expandable' and segments and segments[-1][2] == 'expandable' and \
                segments[-1][0] + segments[-1][1] == s['address']:
            segments[-1] = (segments[-1][0], segments[-1][1] + s['total_size'], kind)
        else:
            segments.append((s['address'], s['total_size'], kind))
        for b in s['blocks']:
            blocks.append((b['address'], b['size'], b['state'], b['requested_size'] if b['state'] != INACTIVE else None))
    return {'segments': segments, 'blocks': blocks}


def apply(state, e, block_sizes_known):
    k = e.kind
    if k == 'alloc':
        state.alloc(e.address, e.requested, e.size if block_sizes_known else None)
    elif k == 'free_requested':
        state.free_requested(e.address)
    elif k == 'free_completed':
        state.free_completed(e.address)
    elif k == 'segment_alloc':
        state.segment_alloc(e.address, e.size)
    elif k == 'segment_free':
        state.segment_free(e.address, e.size)
    elif k == 'segment_map':
        state.segment_map(e.address, e.size)
    elif k == 'segment_unmap':
        state.segment_unmap(e.address, e.size)
