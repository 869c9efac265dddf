"""How the H100 samples were captured: ``OUT=DIR python nvidia_gpu.py`` on a machine with an NVIDIA GPU.

Writes ``DIR/nvidia-smi.xml.gz`` (``nvidia-smi -q -x``) and ``DIR/kineto.json.gz`` (the PyTorch
profiler's Chrome trace of four training steps of a small convolution + attention model on the GPU).
Both are stored with ``gzip -n``; nothing in them is edited.
"""

from __future__ import annotations

import gzip
import os
import subprocess
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function


def main() -> None:
    """Capture both files into $OUT."""
    out = Path(os.environ["OUT"])
    xml = subprocess.run(["nvidia-smi", "-q", "-x"], capture_output=True, check=True).stdout
    (out / "nvidia-smi.xml.gz").write_bytes(gzip.compress(xml, mtime=0))

    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * 32 * 32, 256),
        torch.nn.GELU(),
        torch.nn.Linear(256, 10),
    ).cuda()
    attn = torch.nn.MultiheadAttention(256, 8, batch_first=True).cuda()
    x = torch.randn(16, 3, 32, 32, device="cuda")
    q = torch.randn(16, 64, 256, device="cuda")

    def step() -> None:
        with record_function("ProfilerStep#model"):
            y = model(x)
            a, _ = attn(q, q, q)
            (y.sum() + a.sum()).backward()

    for _ in range(3):  # warm up: cuDNN and cuBLAS pick their kernels
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(4):
            step()
        torch.cuda.synchronize()
    trace = out / "kineto.json"
    prof.export_chrome_trace(str(trace))
    (out / "kineto.json.gz").write_bytes(gzip.compress(trace.read_bytes(), mtime=0))
    trace.unlink()


if __name__ == "__main__":
    main()
