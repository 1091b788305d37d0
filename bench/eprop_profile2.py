import sys, time, torch
from torch import nn
sys.path.insert(0, ".")
import flexdsl
from flexdsl.runtime import eprop as E
dev = torch.device("cuda")
T, B, IN, H = 100, 64, 700, 256
layer = flexdsl.recurrent("lif", IN, H, learning="eprop").to(dev)
readout = nn.Linear(H, 20).to(dev)
x = (torch.rand(T, B, IN, device=dev) < 0.05).float()
y = torch.randint(0, 20, (T, B), device=dev)
def step():
    layer.reset(); s = layer(x); loss = nn.functional.cross_entropy(readout(s).flatten(0, 1), y.flatten()); loss.backward()
for _ in range(3): step()
torch.cuda.synchronize()
# timings of pieces
orig_scanned = E.EPropLearning._scanned
tm = {}
def wrap(name, f):
    def g(*a, **k):
        torch.cuda.synchronize(); t0=time.perf_counter(); r=f(*a, **k); torch.cuda.synchronize(); tm[name]=tm.get(name,0)+(time.perf_counter()-t0)*1e3; return r
    return g
E.Factors.__init__ = wrap("Factors", E.Factors.__init__)
E._from_scan = wrap("from_scan(all)", E._from_scan)
E._walk = wrap("walk", E._walk)
E.EPropCall.backward = staticmethod(wrap("backward", E.EPropCall.backward))
import flexdsl.backends.recurrent as R
R.scan = wrap("scan", R.scan)
flexdsl.runtime.module.NeuronModule._run = wrap("neuron _run", flexdsl.runtime.module.NeuronModule._run)
for _ in range(3): 
    torch.cuda.synchronize(); t0=time.perf_counter(); step(); torch.cuda.synchronize(); tm["total"]=tm.get("total",0)+(time.perf_counter()-t0)*1e3
print({k: round(v/3,2) for k,v in tm.items()})
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    step(); torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=22))
