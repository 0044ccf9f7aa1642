"""Where a cold first generate() call's time goes (the `first_call_s` of tools/bench_generate.py).

Runs one bench_generate variant in this process under cProfile -- the same child the bench
starts per variant (`--one kind,kernels,cache,variant`: eager's reference generate() calls, then
the variant's calls, the first of which captures, measures and compiles) -- and writes the
functions with the most cumulative time, those of Trident, Triton's compiler, Inductor, Dynamo
and the measurement first. Stopped by SIGTERM or SIGINT (a device call's time limit), it writes
what it has so far. cProfile slows the Python it sees (read the numbers as proportions) and sees
only the main thread: compiles in precompile's threads show as the time the main thread waits.
Not a test: a measurement for the machine it runs on; start it with empty Triton and Inductor
caches to see a cold call.

    python tools/profile_first_call.py --one llama,liger,static,trident_compile --out first_call.txt
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import runpy
import signal
import sys
import time

INTEREST = r"trident|triton/compiler|triton/runtime|do_bench|_inductor/compile_fx|_dynamo/convert_frame|generate"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--one", default="llama,liger,static,trident_compile", help="kind,kernels,cache,variant")
    p.add_argument("--device", default="cuda")
    p.add_argument("--calls", type=int, default=2)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--lines", type=int, default=70)
    p.add_argument("--out", default="first_call.txt")
    args = p.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    prof = cProfile.Profile()
    began = time.perf_counter()
    done = []
    printed = _Tee(sys.stdout)  # the child's result line (its first_call_s) goes into the file too

    def write():
        if done:
            return
        done.append(True)
        prof.disable()
        text = io.StringIO()
        text.write(f"{args.one} on {args.device}: {time.perf_counter() - began:.1f} s in all\n")
        text.write(f"the variant's result: {printed.last or '(none: stopped before it finished)'}\n")
        text.write("(cProfile sees the main thread only; cumulative times of frames that enclose waits on other\n"
                   " threads can be missing or low: read the tottime listing for where the main thread spent it)\n")
        for key, pattern in (("cumulative", INTEREST), ("cumulative", ""), ("tottime", "")):
            stats = pstats.Stats(prof, stream=text)
            stats.sort_stats(key).print_stats(*([pattern] if pattern else []), args.lines)
        with open(args.out, "w") as f:
            f.write(text.getvalue())
        print(f"wrote {args.out}", file=sys.stderr)

    def stopped(*_):  # a device call's time limit: what was profiled so far
        write()
        os._exit(0)

    signal.signal(signal.SIGTERM, stopped)
    signal.signal(signal.SIGINT, stopped)
    sys.argv = [os.path.join(here, "bench_generate.py"), "--one", args.one, "--device", args.device,
                "--calls", str(args.calls)] + (["--tiny"] if args.tiny else [])
    sys.stdout = printed
    prof.enable()
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    finally:
        sys.stdout = printed.stream
        write()  # also after a failure, whose traceback then follows


class _Tee:
    """Writes through to `stream`, keeping the last non-empty line."""

    def __init__(self, stream):
        self.stream, self.last, self._line = stream, "", ""

    def write(self, text: str) -> int:
        self._line += text
        *lines, self._line = self._line.split("\n")
        for line in lines:
            if line.strip():
                self.last = line.strip()[:2000]
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


if __name__ == "__main__":
    main()
