# Runs make_sequence.py (beside this file) with PyTorch's memory history on,
# then writes NAME.addresses beside the new NAME.csv: the addresses PyTorch's
# allocator got from cudaMalloc, in order. PyTorch's best fit breaks ties
# between equal-sized cached blocks by address, so a replay on a simulated
# device needs the real device's address order to make the same choices.
#
#   PYTORCH_CUDA_ALLOC_CONF=... CONF_FRACTION=F python3 trace_addresses.py OUTDIR SEED N_OPS
import glob, os, runpy, sys, time
import torch

out = sys.argv[1]
before = set(glob.glob(os.path.join(out, '*.csv')))
torch.cuda.memory._record_memory_history(enabled='all', context=None, stacks='python', max_entries=50_000_000)
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'make_sequence.py'), run_name='__main__')
snapshot = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)
addresses = [e['addr'] for e in snapshot['device_traces'][0] if e['action'] == 'segment_alloc']
new = sorted(set(glob.glob(os.path.join(out, '*.csv'))) - before, key=os.path.getmtime)
if not new:  # the CSV existed already and was rewritten
    new = [max(glob.glob(os.path.join(out, '*.csv')), key=os.path.getmtime)]
target = os.path.splitext(new[-1])[0] + '.addresses'
with open(target, 'w') as f:
    f.write(f'# cudaMalloc addresses in order, from PyTorch {torch.__version__} on {torch.cuda.get_device_name()}, '
            f'{time.strftime("%Y-%m-%d")}, running make_sequence.py {" ".join(sys.argv[1:])}\n')
    for a in addresses:
        f.write(hex(a) + '\n')
print(os.path.basename(target), len(addresses), 'addresses')
