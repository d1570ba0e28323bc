"""A small training loop fed by a DataLoader whose workers read a file and
decode on the CPU (input-bound when workers are few)."""
import json, os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

PATH = "/tmp/gapscope-bundle-data.bin"
if not os.path.exists(PATH):
    with open(PATH, "wb") as f:
        f.write(os.urandom(256 << 20))

class Files(Dataset):
    def __len__(self):
        return 4096
    def __getitem__(self, i):
        with open(PATH, "rb") as f:
            f.seek((i * (64 << 10)) % ((256 << 20) - (64 << 10)))
            raw = f.read(64 << 10)
        t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).float()
        for _ in range(20):  # "decode"
            t = (t * 1.0001).sin()
        return t[:4096], i % 10

if __name__ == "__main__":
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 10)).cuda()
    opt = torch.optim.Adam(model.parameters())
    loader = DataLoader(Files(), batch_size=64, num_workers=workers)
    t0 = time.time()
    for step, (x, y) in enumerate(loader):
        if step == steps:
            break
        x, y = x.cuda(), y.cuda()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    print(json.dumps({"steps": steps, "workers": workers, "wall_s": time.time() - t0}))
