# Compares cudaMalloc address traces (FILE.addresses, one hex address a line) relative to each one's
# base B, where a fresh process's first cudaMalloc lands at B + 30 MiB. The first trace is the
# reference (PyTorch's, from trace_addresses.py); each other one (the simulated device's or our cuda
# device's, from cachealloc-conformance --record-addresses) is reported as matching it or not.
#
#   python3 compare_addresses.py REFERENCE.addresses OTHER.addresses...
import sys

def offsets(path):
    with open(path) as f:
        addresses = [int(line, 16) for line in f if line.strip() and not line.startswith('#')]
    base = addresses[0] - (30 << 20) if addresses else 0
    return [a - base for a in addresses]

reference = offsets(sys.argv[1])
status = 0
for path in sys.argv[2:]:
    other = offsets(path)
    first = next((i for i, (a, b) in enumerate(zip(reference, other)) if a != b), None)
    if first is None and len(other) == len(reference):
        print(f'{path}: all {len(reference)} addresses at the same offsets from the base')
        continue
    status = 1
    if first is None:
        print(f'{path}: {len(other)} addresses, the reference has {len(reference)}; the common ones agree')
    else:
        print(f'{path}: {first}/{len(reference)} addresses agree; #{first + 1} is B{other[first] / 2**20:+.3f} MiB, '
              f'the reference has B{reference[first] / 2**20:+.3f} MiB')
sys.exit(status)
