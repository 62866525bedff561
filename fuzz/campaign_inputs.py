"""The campaign's inputs (fuzz/campaign.py): mutants of the recordings under
testdata/ and analyzer/testdata/, in two stages, and hand-made hostile files.

First stage: blind byte edits. Second stage, shaped to get past the readers'
framing: a pickle loses its FRAME opcodes (so lengths no longer have to
agree) and is edited opcode by opcode; our format is edited inside its body
and body_size corrected. Some mutants are gzip- or zstd-compressed (zstd as
stored blocks, written here). Python 3 standard library only.
"""

import gzip
import io
import pickle
import pickletools
import random
import shutil
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

def base_files():
    """The recordings mutants start from: every .bin and .pickle of up to 64 KiB."""
    files = []
    for folder in (ROOT / "testdata", ROOT / "analyzer" / "testdata"):
        for path in sorted(folder.rglob("*")):
            if path.is_file() and path.suffix in (".bin", ".pickle") and path.stat().st_size <= 64 * 1024:
                files.append(path)
    return files


INTERESTING_BYTES = [0x00, 0x01, 0x7F, 0x80, 0xFF, 0x1B, 0x0A, 0x0D]


def byte_mutation(data: bytes, rng: random.Random) -> bytes:
    """First stage: 1-3 blind edits."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(6)
        if not out:
            out += bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
            continue
        at = rng.randrange(len(out))
        if op == 0:  # overwrite 1-8 bytes
            for i in range(at, min(len(out), at + rng.randint(1, 8))):
                out[i] = rng.choice(INTERESTING_BYTES) if rng.random() < 0.5 else rng.randrange(256)
        elif op == 1:  # insert
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == 2:  # delete
            del out[at:at + rng.randint(1, 32)]
        elif op == 3:  # repeat a span
            span = bytes(out[at:at + rng.randint(1, 256)])
            out[at:at] = span * rng.randint(1, 4)
        elif op == 4:  # cut short
            del out[at:]
        else:  # flip a bit
            out[at] ^= 1 << rng.randrange(8)
    return bytes(out)


# Pickles ---------------------------------------------------------------------


def pickle_ops(data: bytes):
    """(opcode name, argument, start, end) of each opcode; [] when genops cannot walk it."""
    try:
        ops = list(pickletools.genops(data))
    except Exception:
        return []
    out = []
    for i, (op, arg, pos) in enumerate(ops):
        end = ops[i + 1][2] if i + 1 < len(ops) else len(data)
        out.append((op.name, arg, pos, end))
    return out


def unframe(data: bytes) -> bytes:
    """The pickle with its FRAME opcodes removed: the framing no longer has to
    agree with the body, so mutations that change lengths reach the parser."""
    ops = pickle_ops(data)
    if not ops:
        return data
    out = bytearray()
    for name, _, start, end in ops:
        if name != "FRAME":
            out += data[start:end]
    return bytes(out)


EDGE_INTS = [0, 1, -1, 2**31 - 1, -2**31, 2**32 - 1, 2**50 + 1, 2**53, 2**62, 2**63 - 1, -2**63, 2**64 - 1, 2**64,
             2**100, 512, 513, 2**20, 2**21 - 1, 20 * 2**20]
ACTIONS = ["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "oom", "snapshot", "active_allocated", "active_pending_free", "inactive"]
HOSTILE_STRINGS = ["\x1b[2J\x1b[31m", "a\nb\rc", "\x00", "\u202e", "x" * 5000, "", "\ud800", "é" * 3,
                   "</script><script>alert(1)</script>", "\"quoted\",comma"]


def encode_int(value: int) -> bytes:
    if 0 <= value < 256:
        return b"K" + bytes([value])  # BININT1
    if 0 <= value < 65536:
        return b"M" + struct.pack("<H", value)  # BININT2
    if -2**31 <= value < 2**31:
        return b"J" + struct.pack("<i", value)  # BININT
    raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw  # LONG1


def encode_str(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) < 256:
        return b"\x8c" + bytes([len(raw)]) + raw  # SHORT_BINUNICODE
    return b"X" + struct.pack("<I", len(raw)) + raw  # BINUNICODE


def pickle_mutation(data: bytes, rng: random.Random) -> bytes:
    """Second stage for a pickle: unframed, then 1-3 edits opcode by opcode."""
    data = unframe(data)
    for _ in range(rng.randint(1, 3)):
        ops = pickle_ops(data)
        if len(ops) < 3:
            return byte_mutation(data, rng)
        choice = rng.randrange(6)
        ints = [o for o in ops if o[0] in ("BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT")]
        strings = [o for o in ops if o[0] in ("SHORT_BINUNICODE", "BINUNICODE")]
        if choice <= 1 and ints:
            _, _, start, end = rng.choice(ints)
            data = data[:start] + encode_int(rng.choice(EDGE_INTS)) + data[end:]
        elif choice == 2 and strings:
            name, arg, start, end = rng.choice(strings)
            text = rng.choice(ACTIONS) if rng.random() < 0.5 else rng.choice(HOSTILE_STRINGS)
            data = data[:start] + encode_str(text) + data[end:]
        elif choice == 3:  # delete a run of whole opcodes (not PROTO, not STOP)
            i = rng.randrange(1, len(ops) - 1)
            j = min(len(ops) - 1, i + rng.randint(1, 6))
            data = data[:ops[i][2]] + data[ops[j][2]:]
        elif choice == 4:  # repeat a run of whole opcodes
            i = rng.randrange(1, len(ops) - 1)
            j = min(len(ops) - 1, i + rng.randint(1, 40))
            span = data[ops[i][2]:ops[j][2]]
            data = data[:ops[j][2]] + span * rng.randint(1, 3) + data[ops[j][2]:]
        else:  # a blind byte or two, after the framing is gone
            out = bytearray(data)
            for _ in range(rng.randint(1, 2)):
                out[rng.randrange(2, len(out))] = rng.randrange(256)
            data = bytes(out)
    return data


# Our format ------------------------------------------------------------------

MAGIC = b"\x89CASNAP\n"


def ours_mutation(data: bytes, rng: random.Random) -> bytes:
    """Second stage for our format: edits inside the body, mostly in place,
    with body_size corrected so that the framing agrees."""
    if not data.startswith(MAGIC) or len(data) < 32:
        return byte_mutation(data, rng)
    head, body = data[:24], bytearray(data[24:])
    for _ in range(rng.randint(1, 3)):
        if not body:
            break
        at = rng.randrange(len(body))
        op = rng.randrange(5)
        if op <= 2:
            for i in range(at, min(len(body), at + rng.randint(1, 4))):
                body[i] = rng.choice(INTERESTING_BYTES) if rng.random() < 0.5 else rng.randrange(256)
        elif op == 3:
            body[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        else:
            del body[at:at + rng.randint(1, 8)]
    if rng.random() < 0.2:  # another version
        head = head[:8] + struct.pack("<I", rng.choice([1, 2, 3, 4, 5, 6, 7, 0, 2**32 - 1])) + head[12:]
    return head[:16] + struct.pack("<Q", len(body)) + bytes(body)


# Compression -----------------------------------------------------------------


def zstd_raw(data: bytes) -> bytes:
    """A zstd frame of raw (stored) blocks: valid zstd without a compressor."""
    out = bytearray(b"\x28\xb5\x2f\xfd" + bytes([0x00, 7 << 3]))  # no content size; window 128 KiB
    chunks = [data[i:i + 131072] for i in range(0, len(data), 131072)] or [b""]
    for k, chunk in enumerate(chunks):
        header = (1 if k == len(chunks) - 1 else 0) | (0 << 1) | (len(chunk) << 3)
        out += header.to_bytes(3, "little") + chunk
    return bytes(out)


def zstd_rle_bomb(prefix: bytes, total: int) -> bytes:
    """`prefix` then `total` zero bytes, as RLE blocks: 4 bytes per 128 KiB."""
    out = bytearray(b"\x28\xb5\x2f\xfd" + bytes([0x00, 7 << 3]))
    first = (0 << 0) | (0 << 1) | (len(prefix) << 3)
    out += first.to_bytes(3, "little") + prefix
    blocks = total // 131072
    for k in range(blocks):
        header = (1 if k == blocks - 1 else 0) | (1 << 1) | (131072 << 3)
        out += header.to_bytes(3, "little") + b"\x00"
    return bytes(out)


def gzip_zeros(prefix: bytes, total: int) -> bytes:
    sink = io.BytesIO()
    with gzip.GzipFile(fileobj=sink, mode="wb", compresslevel=9) as z:
        z.write(prefix)
        chunk = bytes(1 << 20)
        for _ in range(total >> 20):
            z.write(chunk)
    return sink.getvalue()


# Hand-made hostile files -------------------------------------------------------


def torch_like(segments, traces, settings=None):
    snapshot = {"segments": segments, "device_traces": traces}
    if settings is not None:
        snapshot["allocator_settings"] = settings
    return pickle.dumps(snapshot, protocol=4)


def segment(address, size, blocks, device=0, stream=0, pool="large", frames=None):
    return {"device": device, "address": address, "total_size": size, "allocated_size": 0, "active_size": 0,
            "requested_size": 0, "stream": stream, "segment_type": pool, "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": frames or [], "blocks": blocks}


def block(address, size, state="active_allocated", requested=None, frames=None):
    return {"address": address, "size": size, "requested_size": size if requested is None else requested,
            "state": state, "frames": frames or []}


def entry(action, addr, size, stream=0, time_us=1, frames=None):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": time_us,
            "frames": frames or []}


def hostile_inputs():
    """(name, bytes): shapes no mutation finds by chance."""
    out = []
    evil = [{"filename": "\x1b[31mevil.py\r\n", "line": 1, "name": "f\x07"}]
    out.append(("empty.bin", b""))
    out.append(("one_byte.pickle", b"\x80"))
    out.append(("magic_only.bin", MAGIC))
    out.append(("proto_only.pickle", b"\x80\x04"))
    out.append(("version_99.bin", MAGIC + struct.pack("<IIQ", 99, 0, 0)))
    out.append(("body_2e62.bin", MAGIC + struct.pack("<IIQ", 6, 0, 2**62) + bytes(64)))
    out.append(("zeros_16m.bin", bytes(16 << 20)))
    out.append(("proto_then_zeros.pickle", b"\x80\x04" + bytes(1 << 20)))
    out.append(("gzip_bomb_1g.pickle.gz", gzip_zeros(b"\x80\x04", 1 << 30)))
    out.append(("gzip_bomb_ours_1g.bin.gz", gzip_zeros(MAGIC + struct.pack("<IIQ", 6, 0, 1 << 30), 1 << 30)))
    out.append(("zstd_bomb_4g.pickle.zst", zstd_rle_bomb(b"\x80\x04", 4 << 30)))
    out.append(("zstd_bomb_ours_4g.bin.zst", zstd_rle_bomb(MAGIC + struct.pack("<IIQ", 6, 0, 4 << 30), 4 << 30)))
    out.append(("gzip_of_gzip.pickle.gz", gzip.compress(gzip.compress(torch_like([], [[]])))))
    good = torch_like([segment(2**21, 2**21, [block(2**21, 2**21)])], [[entry("segment_alloc", 2**21, 2**21),
                                                                         entry("alloc", 2**21, 2**21)]])
    out.append(("gzip_truncated.pickle.gz", gzip.compress(good)[:-9]))
    out.append(("zstd_truncated.pickle.zst", zstd_raw(good)[:-5]))
    out.append(("deep_nesting.pickle", b"\x80\x04" + b"]" * 200000 + b"."))
    out.append(("deep_marks.pickle", b"\x80\x04" + b"(" * 200000 + b"."))
    out.append(("memo_bomb.pickle", b"\x80\x04]\x94" + b"h\x00" * 500000 + b"."))
    for size in (2**62, 2**63 - 1, 2**64 - 2**21, -2**21, 0, 2**50 + 2**21):
        tag = str(size).replace("-", "neg")
        out.append((f"segment_size_{tag}.pickle", torch_like([segment(2**21, size, [block(2**21, size)])], [[]])))
        out.append((f"alloc_size_{tag}.pickle", torch_like([], [[entry("segment_alloc", 2**21, 2**21),
                                                                 entry("alloc", 2**21, size)]])))
    for address in (2**64 - 2**21, 2**63, 0, -2**21):
        out.append((f"address_{str(address).replace('-', 'neg')}.pickle",
                    torch_like([segment(address, 2**21, [block(address, 2**21)])], [[]])))
    out.append(("many_huge_segments.pickle",
                torch_like([segment(i * 2**48, 2**47, [block(i * 2**48, 2**47)]) for i in range(1, 200)], [[]])))
    out.append(("trace_time_backwards.pickle",
                torch_like([], [[entry("segment_alloc", 2**21, 2**21, time_us=10 - i) for i in range(10)]])))
    out.append(("free_unknown.pickle", torch_like([], [[entry("free_completed", 2**30, 512)] * 100])))
    out.append(("oom_huge.pickle", torch_like([], [[{"action": "oom", "addr": 0, "size": 2**63, "stream": 0,
                                                     "time_us": 1, "frames": [], "device_free": 2**64 - 1}]])))
    out.append(("escapes_in_frames.pickle",
                torch_like([segment(2**21, 2**21, [block(2**21, 2**21, frames=evil)], frames=evil)],
                           [[entry("alloc", 2**21, 2**21, frames=evil)]])))
    out.append(("invalid_utf8_frame.pickle",
                torch_like([], [[entry("alloc", 2**21, 512, frames=[{"filename": "\udc80", "line": 1,
                                                                       "name": "x"}])]])))
    out.append(("long_name.pickle",
                torch_like([], [[entry("alloc", 2**21, 512, frames=[{"filename": "a" * (1 << 20), "line": 1,
                                                                       "name": "x"}])]])))
    out.append(("wrong_types.pickle", torch_like([{"device": "zero", "address": None, "total_size": 1.5,
                                                   "blocks": "none"}], [[None, 1, "x"]])))
    out.append(("segments_not_list.pickle", pickle.dumps({"segments": {"a": 1}, "device_traces": 7}, protocol=4)))
    out.append(("device_2e31.pickle", torch_like([segment(2**21, 2**21, [block(2**21, 2**21)], device=2**31)],
                                                 [[]])))
    out.append(("stream_neg.pickle", torch_like([], [[entry("alloc", 2**21, 512, stream=-1)]])))
    out.append(("settings_evil.pickle", torch_like([], [[]], settings={"max_split_size": 2**64,
                                                                      "expandable_segments": "\x1b[2J",
                                                                      "roundup_power2_divisions": [2**40] * 64,
                                                                      "garbage_collection_threshold": -1.0})))
    out.append(("many_devices.pickle", torch_like([], [[entry("alloc", 2**21, 512)] for _ in range(4096)])))
    out.append(("long_trace.pickle", torch_like([], [[entry("alloc", 2**21 + i * 512, 512, time_us=i)
                                                      for i in range(200000)]])))
    out.append(("segments_only_list.pickle", pickle.dumps([segment(2**21, 2**21, [block(2**21, 2**21)])], protocol=4)))
    out.append(("proto_6.pickle", b"\x80\x06N."))
    out.append(("reduce_code.pickle", b"\x80\x04cos\nsystem\n(S'true'\ntR."))
    return out


def make_inputs(count: int, rng: random.Random, folder: Path):
    """Writes the inputs; returns [(path, base path or None, how it was made)]."""
    bases = base_files()
    base_bytes = {b: b.read_bytes() for b in bases}
    made = []
    for name, data in hostile_inputs():
        path = folder / f"hostile_{name}"
        path.write_bytes(data)
        made.append((path, None, "hostile"))
    for base in bases:  # each base as it is, for the comparisons
        path = folder / f"base_{len(made):05d}{base.suffix}"
        shutil.copyfile(base, path)
        made.append((path, base, "base"))
    while len(made) < count:
        base = rng.choice(bases)
        data = base_bytes[base]
        stage = rng.random()
        if stage < 0.35:
            data, how = byte_mutation(data, rng), "stage1"
        elif base.suffix == ".pickle":
            data, how = pickle_mutation(data, rng), "stage2_pickle"
        else:
            data, how = ours_mutation(data, rng), "stage2_ours"
        suffix = base.suffix
        squeeze = rng.random()
        if squeeze < 0.08:
            data, suffix, how = gzip.compress(data), suffix + ".gz", how + "_gz"
        elif squeeze < 0.16:
            data, suffix, how = zstd_raw(data), suffix + ".zst", how + "_zst"
        path = folder / f"{how}_{len(made):05d}{suffix}"
        path.write_bytes(data)
        made.append((path, base, how))
    return made
