#!/usr/bin/env python3
"""Writes the hostile inputs of testdata/hostile/: one file per failure class
of docs/RELIABILITY.md, each made by this script from our own golden files
(testdata/format_versions/) or from plain Python pickles shaped like
torch.cuda.memory._snapshot(). tests/test_hostile_inputs.cpp replays each
against expected.tsv. Run from the repository root:
    python3 testdata/hostile/make_hostile.py [path/to/cachealloc-analyze]
The analyzer, when given, converts the wrapped-totals pickles to our format
(the reader accepts them: only the replay can tell)."""
import gzip
import os
import pickle
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
V5 = open(os.path.join(HERE, '..', 'format_versions', 'v5.bin'), 'rb').read()
V1 = open(os.path.join(HERE, '..', 'format_versions', 'v1.bin'), 'rb').read()
BASE = 0x7f0000000000
SEGMENT = 2 << 20
q = lambda v: struct.pack('<Q', v)


def write(name, data):
    with open(os.path.join(HERE, name), 'wb') as f:
        f.write(data)


def patch(data, old, new, count=1):
    assert data.count(old) >= 1, (old, data.count(old))
    assert len(old) == len(new)
    return data.replace(old, new, count)


# --- our format: the golden v5 file (and v1, cereal throughout) with the final
# layout's first segment or its blocks changed in place.
segment = q(BASE) + q(SEGMENT)
block0 = q(BASE) + q(1024) + q(1000)
block1 = q(BASE + 1024) + q(SEGMENT - 1024) + q(0)
for source, version in ((V5, 'v5'), (V1, 'v1')):
    write(f'wrapping_segment_{version}.bin', patch(source, segment, q(BASE) + q(2**64 - 4096)))
    write(f'overlapping_blocks_{version}.bin', patch(source, block1, q(BASE + 512) + q(SEGMENT - 1024) + q(0)))
    write(f'block_outside_segment_{version}.bin', patch(source, block1, q(BASE + 1024) + q(SEGMENT) + q(0)))
    write(f'blocks_short_of_segment_{version}.bin', patch(source, block1, q(BASE + 1024) + q(SEGMENT - 4096) + q(0)))
    # "a.py" -> "a\xff\xfey": two bytes that start no UTF-8 sequence.
    write(f'invalid_utf8_{version}.bin', patch(source, b'\x04a.py', b'\x04a\xff\xfey'))
    # "a.py" -> ESC [ 2 J: clears a terminal when printed raw (valid UTF-8, so read).
    write(f'control_chars_{version}.bin', patch(source, b'\x04a.py', b'\x04\x1b[2J'))


# --- PyTorch pickles (protocol 4, as torch.save writes), minimal but complete.
def block(address, size, state='active_allocated', requested=None, frames=()):
    return {'address': address, 'size': size, 'requested_size': size if requested is None else requested,
            'state': state, 'frames': list(frames)}


def segment_of(address, blocks, device=0, total=None):
    total = sum(b['size'] for b in blocks) if total is None else total
    allocated = sum(b['size'] for b in blocks if b['state'] == 'active_allocated')
    return {'device': device, 'address': address, 'total_size': total, 'allocated_size': allocated,
            'active_size': allocated, 'requested_size': allocated, 'stream': 0, 'segment_type': 'large',
            'segment_pool_id': (0, 0), 'is_expandable': False, 'frames': [], 'blocks': blocks}


def trace_entry(action, addr, size, time_us, frames=()):
    return {'action': action, 'addr': addr, 'size': size, 'stream': 0, 'time_us': time_us,
            'compile_context': 'N/A', 'user_metadata': '', 'frames': list(frames)}


def snapshot(segments, trace):
    return {'segments': segments, 'device_traces': [trace], 'allocator_settings': {},
            'external_annotations': []}


def dump(name, value, replace=None):
    data = pickle.dumps(value, protocol=4)
    if replace:
        data = patch(data, *replace)
    write(name, data)


frame = {'filename': 'train.py', 'line': 7, 'name': 'step'}
A = 0x7f4000000000
ok_segment = segment_of(A, [block(A, 1 << 20, frames=[frame]), block(A + (1 << 20), 1 << 20, 'inactive', 0)])
ok_trace = [trace_entry('segment_alloc', A, 2 << 20, 1000), trace_entry('alloc', A, 1 << 20, 1001, [frame])]

# Invalid UTF-8 in a frame's file name (Python's pickle.loads refuses it too).
bad_frame = dict(frame, filename='bad\u00e9name.py')
dump('invalid_utf8_frame.pickle',
     snapshot([segment_of(A, [block(A, 1 << 20, frames=[bad_frame]), block(A + (1 << 20), 1 << 20, 'inactive', 0)])],
              [trace_entry('segment_alloc', A, 2 << 20, 1000), trace_entry('alloc', A, 1 << 20, 1001, [bad_frame])]),
     (b'bad\xc3\xa9name', b'bad\xff\xfename'))
# Control characters in a frame's name: valid UTF-8, read, then spelled out.
evil_frame = dict(frame, name='evil\x1b[2J\r\x07\nstep', filename='evil\x1b]0;title\x07.py')
dump('control_chars_frame.pickle',
     snapshot([segment_of(A, [block(A, 1 << 20, frames=[evil_frame]), block(A + (1 << 20), 1 << 20, 'inactive', 0)])],
              [trace_entry('segment_alloc', A, 2 << 20, 1000), trace_entry('alloc', A, 1 << 20, 1001, [evil_frame])]))
# Control characters in text the error message quotes: one line all the same.
dump('control_chars_in_error.pickle',
     snapshot([segment_of(A, [block(A, 2 << 20, 'evil\nstate\x1b[31m\r')])], []))
# Layouts both readers refuse.
dump('overlapping_segments.pickle',
     snapshot([segment_of(A, [block(A, 2 << 20)]), segment_of(A + (1 << 20), [block(A + (1 << 20), 2 << 20)])], []))
dump('blocks_short_of_segment.pickle', snapshot([segment_of(A, [block(A, 1 << 20)], total=2 << 20)], []))
dump('overlapping_blocks.pickle',
     snapshot([segment_of(A, [block(A, 1 << 20), block(A + 4096, 1 << 20)], total=2 << 20)], []))
dump('wrapping_segment.pickle', snapshot([segment_of(2**64 - (1 << 20), [block(2**64 - (1 << 20), 2 << 20)])], []))
# Events whose replay is impossible: a segment of 2^61 bytes at event 2.
dump('wrapped_totals_huge_segment.pickle',
     snapshot([ok_segment], ok_trace + [trace_entry('segment_alloc', 0x100000000000, 2**61, 1002)]))
# A final layout of 2^61 bytes: every segment is sound, their total is no device's.
dump('wrapped_totals_initial_layout.pickle',
     snapshot([segment_of(0x100000000000, [block(0x100000000000, 2**61, 'inactive', 0)])], []))

# --- implausible figures: both readers refuse them, naming the event or
# the device and the figure (snapshot/invariants.hpp: 2^50 bytes where no
# device total is recorded, 2^62 ns).
dump('implausible_alloc_wraps.pickle',
     snapshot([ok_segment], ok_trace + [trace_entry('alloc', A + (1 << 20), 2**64 - 1, 1002)]))
dump('implausible_alloc_2e62.pickle',
     snapshot([ok_segment], ok_trace + [trace_entry('alloc', A + (1 << 20), 2**62, 1002)]))
dump('implausible_alloc_2e63.pickle',
     snapshot([ok_segment], ok_trace + [trace_entry('alloc', A + (1 << 20), 2**63 - 1, 1002)]))
# A block in use that requests 2^63-1 bytes, more than it holds (the replay's
# start state once summed them to an impossible requested total).
dump('implausible_block_request.pickle',
     snapshot([segment_of(A, [block(A, 1 << 20, requested=2**63 - 1), block(A + (1 << 20), 1 << 20, 'inactive')])],
              ok_trace))
# 9.29e15 us: 9.29e18 ns, past 2^62 ns.
dump('implausible_time.pickle',
     snapshot([ok_segment], ok_trace + [trace_entry('free_requested', A, 1 << 20, 9_290_000_000_000_000, [frame])]))
# Format version 1: the device's total (and cudaMemGetInfo's) of 1 GiB made 32 PiB.
write('implausible_device_total_v1.bin', patch(V1, q(1 << 30), q(1 << 55), 2))

# --- control characters of every kind in a frame's name (NUL, ESC, BEL, DEL
# and the C1 characters CSI U+009B and NEL U+0085): shown spelled out by
# every output, tables, CSV, JSON and collapsed stacks.
c1_frame = dict(frame, name='c1\x00\x1b\x07\x7f\u009b\u0085step')
dump('control_chars_c1.pickle',
     snapshot([segment_of(A, [block(A, 1 << 20, frames=[c1_frame]), block(A + (1 << 20), 1 << 20, 'inactive', 0)])],
              [trace_entry('segment_alloc', A, 2 << 20, 1000), trace_entry('alloc', A, 1 << 20, 1001, [c1_frame])]))

# --- decompression bombs: a pickle's PROTO then 256 MiB of zeros, about
# 1000:1 under gzip, far more under zstd. Refused as soon as the inflated
# bytes pass 64 times the compressed bytes read (input.hpp).
bomb = b'\x80\x04' + bytes(256 << 20)
write('bomb.pickle.gz', gzip.compress(bomb, 9, mtime=0))
write('bomb.pickle.zst', subprocess.run(['zstd', '-19', '-c'], input=bomb, capture_output=True, check=True).stdout)

# --- format version 6 (event encoding 3): the golden v6 file cut short, and
# its first event's flag byte with the reserved bit 7 set or with bit 5 (a
# reference distance, read from the address column) on the block's first
# event, where no earlier event exists.
V6 = open(os.path.join(HERE, '..', 'format_versions', 'v6.bin'), 'rb').read()
write('truncated_v6.bin', V6[:len(V6) - 7])
head_size = struct.unpack_from('<Q', V6, 24)[0]
block = 32 + head_size + 12 + 8      # event section header, then the block's size
assert V6[block:block + 4] == b'\x03\x00\x00\x00'  # EventColumns class version 3
count = struct.unpack_from('<Q', V6, block + 4)[0]
assert count < 128 and V6[block + 12] == count     # the flags column's length, one varint byte
flag0 = block + 13
write('reserved_flag_bit_v6.bin', V6[:flag0] + bytes([V6[flag0] | 0x80]) + V6[flag0 + 1:])
write('reference_before_block_v6.bin', V6[:flag0] + bytes([V6[flag0] | 0x20]) + V6[flag0 + 1:])

if len(sys.argv) > 1:
    # Made by an analyzer that predates the plausibility bounds, which now
    # refuse both at the reader; kept as our format's cases of those bounds.
    for name in ('wrapped_totals_huge_segment', 'wrapped_totals_initial_layout'):
        subprocess.run([sys.argv[1], 'convert', os.path.join(HERE, name + '.pickle'), '-f', '-o',
                        os.path.join(HERE, name + '.bin')], check=True)

# --- format version 7 (a streamed recording, docs/FORMAT.md "Version 7"):
# the golden v7 stream (two tables chunks, three events chunks, a trailer)
# with a chunk cut, damaged or made to lie about its sizes. A damaged or cut
# last chunk is what a killed recorder leaves: read up to the chunk before,
# with a note; damage anywhere else is refused.
import zlib

V7 = open(os.path.join(HERE, '..', 'format_versions', 'v7.bin'), 'rb').read()
CHUNK_HEADER = struct.Struct('<IIQQII')  # kind, events, stored, raw, sequence, crc32


def v7_chunks(data):
    """(offset, kind, events, stored, raw, sequence) of each chunk."""
    out, at = [], 24
    while at < len(data):
        kind, events, stored, raw, sequence, _ = CHUNK_HEADER.unpack_from(data, at)
        out.append((at, kind, events, stored, raw, sequence))
        at += 32 + stored
    assert at == len(data)
    return out


def v7_header(kind, events, stored_bytes, raw, sequence, stored=None):
    """A chunk header whose crc covers it and `stored_bytes` (stored: the size it declares)."""
    stored = len(stored_bytes) if stored is None else stored
    head = CHUNK_HEADER.pack(kind, events, stored, raw, sequence, 0)[:28]
    return head + struct.pack('<I', zlib.crc32(stored_bytes, zlib.crc32(head)))


def v7_rewrite(data, index, **fields):
    """The file with chunk `index`'s header fields changed and its crc recomputed."""
    at, kind, events, stored, raw, sequence = v7_chunks(data)[index]
    values = dict(kind=kind, events=events, raw=raw, sequence=sequence)
    values.update(fields)
    payload = data[at + 32:at + 32 + stored]
    return data[:at] + v7_header(values['kind'], values['events'], payload, values['raw'],
                                 values['sequence']) + data[at + 32:]


CHUNKS = v7_chunks(V7)
KINDS = [c[1] for c in CHUNKS]
assert KINDS == [1, 2, 2, 3, 3, 3, 4], KINDS
FIRST_EVENTS, LAST_EVENTS, TRAILER = 3, 5, 6
at, _, _, stored, _, _ = CHUNKS[LAST_EVENTS]
write('truncated_mid_chunk_v7.bin', V7[:at + 32 + stored // 2])
at, _, _, stored, _, _ = CHUNKS[FIRST_EVENTS]
flip = at + 32 + stored // 2
write('bad_crc_v7.bin', V7[:flip] + bytes([V7[flip] ^ 0x40]) + V7[flip + 1:])
at, _, _, stored, _, _ = CHUNKS[TRAILER]
flip = at + 32 + stored // 2
write('bad_crc_last_chunk_v7.bin', V7[:flip] + bytes([V7[flip] ^ 0x40]) + V7[flip + 1:])
# The second events chunk declares more bytes than the file holds, more
# than zstd's bound for its content: a damaged header, not a cut (the file
# goes on to its trailer), refused rather than read as a killed recording.
at = CHUNKS[FIRST_EVENTS + 1][0]
write('chunk_past_end_v7.bin', V7[:at + 8] + q(len(V7)) + V7[at + 16:])
write('chunk_size_absurd_v7.bin', V7[:at + 8] + q(10**15) + V7[at + 16:])
# A declared size that wraps the offset back onto the same chunk: endless
# unless sizes are checked without overflow.
write('chunk_size_wraps_v7.bin', V7[:at + 8] + q(2**64 - 32) + V7[at + 16:])
# The trailer declares 10 bytes more than the file holds, within zstd's
# bound, but its whole frame is there: a lie, not a cut.
at, _, _, stored, _, _ = CHUNKS[TRAILER]
write('trailer_size_lie_v7.bin', V7[:at + 8] + q(stored + 10) + V7[at + 16:])
# Cut inside the start chunk: nothing usable was recorded.
write('cut_in_start_chunk_v7.bin', V7[:100])
# The first events chunk damaged, then the file cut inside the last events
# chunk: the damage is not at the end, so it is no kill's doing.
at, _, _, stored, _, _ = CHUNKS[FIRST_EVENTS]
flip = at + 32 + stored // 2
at, _, _, stored, _, _ = CHUNKS[LAST_EVENTS]
write('bad_crc_then_cut_v7.bin', (V7[:flip] + bytes([V7[flip] ^ 0x40]) + V7[flip + 1:])[:at + 32 + stored // 2])
write('zero_events_chunk_v7.bin', v7_rewrite(V7, FIRST_EVENTS, events=0))
write('huge_events_count_v7.bin', v7_rewrite(V7, FIRST_EVENTS, events=2**32 - 1))
write('huge_raw_size_v7.bin', v7_rewrite(V7, 1, raw=2**40))
write('raw_size_lie_v7.bin', v7_rewrite(V7, 1, raw=2**30))
write('sequence_out_of_order_v7.bin', v7_rewrite(V7, FIRST_EVENTS, sequence=9))
# A tables chunk of no bytes at all (no zstd frame) in place of the second.
at, kind, events, stored, raw, sequence = CHUNKS[2]
write('zero_length_chunk_v7.bin', V7[:at] + v7_header(2, 0, b'', 0, sequence) + V7[at + 32 + stored:])
write('bytes_after_trailer_v7.bin', V7 + b'\0' * 40)
