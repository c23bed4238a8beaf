"""bench/gemv_plan.py against the C++ it mirrors: compiles a small host program around gemv::CutStream
(csrc/matmul_nbits/gemv_stream.cuh) with nvcc, runs both on the same grid of (N, K) with the same
residency model (24 warps per SM in blocks of W warps: 24 // W blocks), and reports every cut that
differs. No GPU needed.

    python3 bench/check_plan_mirror.py [--nvcc nvcc]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gemv_plan  # noqa: E402

KS = (512, 1024, 1536, 2048, 4096, 5120, 6144, 11008, 17408)
PROGRAM = r"""
#include <cstdio>
#include "matmul_nbits/gemv_stream.cuh"
using namespace ort_mtp::gemv;
int main() {
  const int ks[] = {KS};
  for (int K : ks)
    for (int N = 16; N <= 300000; N += (N < 40000 ? 16 : 1616)) {
      StreamCut c;
      CutStream((N + 15) / 16, K / 256, 132, 24, 4,
                [](int w, int& per) -> const char* { per = w <= 24 ? 24 / w : 1; return nullptr; }, c);
      std::printf("%d %d %d %d %lld %d %d %lld\n", N, K, c.tiles, c.kparts, (long long)c.blocks, c.alt_tiles,
                  c.alt_kparts, (long long)c.alt_blocks);
    }
}
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nvcc", default="nvcc")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "cut.cu", Path(tmp) / "cut"
        src.write_text(PROGRAM.replace("KS", ", ".join(map(str, KS))))
        subprocess.run([args.nvcc, "-std=c++17", f"-I{ROOT / 'csrc'}", "-o", str(exe), str(src)], check=True)
        lines = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines()
    differ = 0
    for line in lines:
        N, K, tiles, kparts, blocks, alt_tiles, alt_kparts, alt_blocks = map(int, line.split())
        p = gemv_plan.plan(N, K, 32)
        mirror = (p.tiles, p.kparts, p.blocks, p.alt_blocks, p.alt_tiles if p.alt_blocks else 0,
                  p.alt_kparts if p.alt_blocks else 1)
        cpp = (tiles, kparts, blocks, alt_blocks, alt_tiles if alt_blocks else 0, alt_kparts if alt_blocks else 1)
        if mirror != cpp:
            differ += 1
            if differ <= 10:
                print(f"N={N} K={K}: C++ {cpp}, gemv_plan.py {mirror}")
    two_shape = sum(1 for line in lines if int(line.split()[-1]) > 0)
    print(f"{len(lines)} cuts compared ({two_shape} of them two-shape), {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
