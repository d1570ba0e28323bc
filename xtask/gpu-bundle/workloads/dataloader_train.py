"""A small training loop fed by a DataLoader whose workers read a file and
decode on the CPU: input-bound with few workers (cause: input.*).

    dataloader_train.py WORKERS STEPS [DATA]
    dataloader_train.py --prepare [DATA]"""
import os
import sys

import torch
from torch.utils.data import DataLoader, Dataset

from _common import emit, now

DEFAULT = "/tmp/gapscope-bundle-data.bin"
SIZE = 256 << 20
ITEM = 64 << 10


def prepare(path):
    if not os.path.exists(path) or os.path.getsize(path) != SIZE:
        with open(path + ".tmp", "wb") as f:
            f.write(os.urandom(SIZE))
        os.replace(path + ".tmp", path)


class Files(Dataset):
    def __init__(self, path):
        self.path = path

    def __len__(self):
        return 4096

    def __getitem__(self, i):
        with open(self.path, "rb") as f:
            f.seek((i * ITEM) % (SIZE - ITEM))
            raw = f.read(ITEM)
        t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).float()
        for _ in range(20):  # "decode"
            t = (t * 1.0001).sin()
        return t[:4096], i % 10


if __name__ == "__main__":
    if sys.argv[1:2] == ["--prepare"]:
        prepare(sys.argv[2] if len(sys.argv) > 2 else DEFAULT)
        sys.exit(0)
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 80
    path = sys.argv[3] if len(sys.argv) > 3 else DEFAULT
    prepare(path)
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 10)).cuda()
    opt = torch.optim.Adam(model.parameters())
    loader = DataLoader(Files(path), batch_size=64, num_workers=workers)
    torch.cuda.synchronize()
    t0 = now()
    for step, (x, y) in enumerate(loader):
        if step == steps:
            break
        x, y = x.cuda(), y.cuda()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    t1 = now()
    emit({"steps": steps, "workers": workers, "loop_wall_ns": t1 - t0, "expected_cause": "input."})
