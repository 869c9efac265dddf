"""Regenerate ``api_pb2.py`` and ``api_pb2_grpc.py`` from ``api.proto`` with grpcio-tools (a dev dependency).

Run ``python -m aaco.agent.sources.smi.podresources.regenerate``. The stubs are generated as
members of this package (``aaco/agent/sources/smi/podresources/api.proto`` relative to the include
root), so the gRPC module imports the message module by its package path.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE_PATH = Path("aaco/agent/sources/smi/podresources")
OUTPUTS = ("api_pb2.py", "api_pb2_grpc.py")


def generate(dest: Path) -> dict[str, bytes]:
    """Generate the stubs into a temporary tree; return name -> content (and write them to ``dest``)."""
    from grpc_tools import protoc  # dev dependency: only needed to regenerate

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / PACKAGE_PATH).mkdir(parents=True)
        shutil.copy(HERE / "api.proto", root / PACKAGE_PATH / "api.proto")
        rc = protoc.main(
            [
                "protoc",
                f"-I{root}",
                f"--python_out={root}",
                f"--grpc_python_out={root}",
                str(PACKAGE_PATH / "api.proto"),
            ]
        )
        if rc != 0:
            raise RuntimeError(f"protoc failed with status {rc}")
        out = {name: (root / PACKAGE_PATH / name).read_bytes() for name in OUTPUTS}
    for name, data in out.items():
        (dest / name).write_bytes(data)
    return out


if __name__ == "__main__":
    generate(HERE)
    print(f"regenerated {', '.join(OUTPUTS)} in {HERE}")
