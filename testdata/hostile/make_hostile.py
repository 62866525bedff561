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
