#!/usr/bin/env python3
"""The stream benchmark's calls through IREE, for comparison with jitml_stream.

IREE compiles one module with the `?` dims kept (as libjitml's generic kernel) and
runs every call on it. The graphs and streams are libjitml's own, exported by

    build/bench/jitml_stream --export DIR [--only mlp] [--quick]

and this script reads them from DIR:

    python3 bench/stream_iree.py DIR [--only mlp|block] [--stream uniform|zipf]

It needs `iree-base-compiler` and `iree-base-runtime` from PyPI (in a venv:
`python3 -m venv v && v/bin/pip install iree-base-compiler iree-base-runtime numpy`);
without them it says so and exits 0. Printed per stream: total time (the compile
included, as libjitml's total includes its first compile), compile time, p50 and p99 of
the calls (p99* without the first call), in the same columns as jitml_stream.
"""
import argparse
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", help="the directory jitml_stream --export wrote")
    ap.add_argument("--only", choices=["mlp", "block"])
    ap.add_argument("--stream", choices=["uniform", "zipf"])
    ap.add_argument("--threads", type=int, default=0,
                    help="IREE task workers (0: IREE's default, all cores)")
    a = ap.parse_args()
    try:
        import numpy as np
        import iree.compiler as ireec
        import iree.runtime as ireert
    except ImportError as e:
        print(f"stream_iree: skipped: IREE is not installed ({e}); "
              "pip install iree-base-compiler iree-base-runtime numpy")
        return 0

    shapes = {
        "mlp": [("N", 784), (784, 256), (256,), (256, 10), (10,)],
        "block": [("S", 256), (256, 256), (256, 256), (256, 256), (256, 256),
                  (256, 1024), (1024,), (1024, 256), (256,)],
    }
    rng = np.random.default_rng(1)
    try:
        from importlib.metadata import version
        ver = version("iree-base-runtime")
    except Exception:
        ver = "?"
    print(f"IREE {ver}; llvm-cpu, target cpu host")
    for name in ("mlp", "block"):
        if a.only and a.only != name:
            continue
        path = os.path.join(a.dir, f"{name}.mlir")
        if not os.path.exists(path):
            continue
        text = open(path).read()
        t0 = time.perf_counter()
        flags = ["--iree-llvmcpu-target-cpu=host"]
        vmfb = ireec.compile_str(text, target_backends=["llvm-cpu"], extra_args=flags)
        compile_ms = (time.perf_counter() - t0) * 1e3
        config = ireert.Config("local-task")
        if a.threads:
            ireert.flags.parse_flags(f"--task_topology_max_group_count={a.threads}")
        ctx = ireert.SystemContext(config=config)
        ctx.add_vm_module(ireert.VmModule.copy_buffer(ctx.instance, vmfb))
        fn = ctx.modules.module[name]
        full = []
        for dims in shapes[name]:
            d = [512 if isinstance(x, str) else x for x in dims]
            scale = 1.0 if not full else 0.05
            full.append((rng.standard_normal(d) * scale).astype(np.float32))
        for sname in ("uniform", "zipf"):
            if a.stream and a.stream != sname:
                continue
            spath = os.path.join(a.dir, f"{name}-{sname}.txt")
            if not os.path.exists(spath):
                continue
            stream = [int(x) for x in open(spath).read().split()]
            lat = []
            t0 = time.perf_counter()
            for v in stream:
                args = [full[0][:v]] + full[1:]
                t = time.perf_counter()
                out = fn(*args)
                out.to_host()
                lat.append((time.perf_counter() - t) * 1e3)
            total = (time.perf_counter() - t0) * 1e3 + compile_ms
            srt = sorted(lat)
            rest = sorted(lat[1:])
            pct = lambda s, p: s[min(len(s) - 1, max(0, int(p * len(s) + 0.999999) - 1))]
            print(f"\n{name}, {sname} stream: {len(stream)} calls over "
                  f"{len(set(stream))} values")
            print(f"{'policy':<8} {'total ms':>10} {'compile ms':>10} {'p50 ms':>9} "
                  f"{'p99 ms':>9} {'p99 ms*':>9}")
            print(f"{'IREE':<8} {total:10.0f} {compile_ms:10.0f} {pct(srt, 0.5):9.3f} "
                  f"{pct(srt, 0.99):9.2f} {pct(rest, 0.99):9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
